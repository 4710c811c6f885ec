// prnn_layers.cpp - prnn::layers: every layer of a one-direction module in
// one op, what the modules' forward calls for an eager call on tensor input
// (torch_prnn/_short.py). It runs the ops that forward's regular path runs
// from Python, in the same order and with the same arguments, so that such a
// call crosses from Python once instead of three to six times a layer.
// CompositeImplicitAutograd: autograd, autocast and dispatch modes see those
// ops, as they do from the regular path - but for a gated layer on CUDA whose
// call needs no gradient, which runs as prnn::gated_layer (one launch at
// T = 1 instead of a GEMM and a persistent launch).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include <vector>

#include "prnn_ops.h"

namespace torch_prnn {
namespace {

// Whether nothing in the call needs a gradient: no graph to record and no
// forward-mode tangent.
bool without_gradients(const at::Tensor& input, const at::Tensor& h, const std::optional<at::Tensor>& c,
                       at::TensorList params) {
  std::vector<const at::Tensor*> tensors = {&input, &h};
  if (c.has_value()) tensors.push_back(&*c);
  for (const at::Tensor& p : params) tensors.push_back(&p);
  return !records_graph(tensors) && !has_forward_tangent(tensors);
}

// input [T, B, I], h [layers, B, S] and an LSTM's c [layers, B, H] ->
// (output [T, B, S], h_n, c_n (undefined but for an LSTM)). params: each
// layer's w_ih, w_hh, then b_ih, b_hh with biases, then an LSTM's w_hr with
// a projection, as the modules' _flat_weights; mode: nn.RNNBase's; dropout:
// applied to the input of every layer but the first (0 outside training).
std::tuple<at::Tensor, at::Tensor, at::Tensor> layers(const at::Tensor& input, const at::Tensor& h,
                                                      const std::optional<at::Tensor>& c, at::TensorList params,
                                                      c10::string_view mode, double dropout) {
  const char* op = "prnn::layers";
  const bool lstm = mode == "LSTM", gru = mode == "GRU", tanh = mode == "RNN_TANH";
  TORCH_CHECK_VALUE(lstm || gru || tanh || mode == "RNN_RELU", op,
                    ": mode must be 'RNN_TANH', 'RNN_RELU', 'LSTM' or 'GRU', got '", std::string(mode), "'");
  TORCH_CHECK(input.defined(), op, ": input must be a tensor, got None");
  TORCH_CHECK(h.defined(), op, ": h must be a tensor, got None");
  TORCH_CHECK(h.dim() == 3 && h.size(0) >= 1, op, ": h must be 3-D [layers >= 1, batch, size], got ", h.sizes());
  TORCH_CHECK(c.has_value() == lstm, op, ": c must be given for an LSTM and only for one");
  const int64_t num_layers = h.size(0);
  if (lstm)
    TORCH_CHECK(c->defined() && c->dim() == 3 && c->size(0) == num_layers && c->size(1) == h.size(1), op,
                ": c must be 3-D [layers=", num_layers, ", batch=", h.size(1), ", hidden], got ",
                c->defined() ? c->sizes() : at::IntArrayRef{});
  TORCH_CHECK_VALUE(dropout >= 0 && dropout <= 1, op, ": dropout must be a probability in [0, 1], got ", dropout);
  const size_t per_layer = params.size() / num_layers;
  // w_ih, w_hh, [b_ih, b_hh,] [w_hr]: 2 or 4 a layer, one more with an LSTM's projection.
  const bool projection = lstm && (per_layer == 3 || per_layer == 5), biases = per_layer >= 4;
  TORCH_CHECK(params.size() % num_layers == 0 && (per_layer == 2 || per_layer == 4 || projection), op,
              ": params must hold 2 or 4 tensors a layer", lstm ? " (3 or 5 with a projection)" : "", ", got ",
              params.size(), " for ", num_layers, " layers");
  for (size_t i = 0; i < params.size(); ++i)
    TORCH_CHECK(params[i].defined(), op, ": params[", i, "] must be a tensor, got None");

  // A gated layer without a projection as prnn::gated_layer (CUDA autocast
  // casts the regular ops, not this one).
  const bool gated_layer = (gru || (lstm && !projection)) && input.is_cuda() &&
                           !at::autocast::is_autocast_enabled(at::kCUDA) && without_gradients(input, h, c, params);
  std::vector<at::Tensor> h_n, c_n;
  at::Tensor x = input;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    if (layer > 0 && dropout > 0) x = at::dropout(x, dropout, /*train=*/true);
    const at::Tensor* w = params.data() + layer * per_layer;
    const std::optional<at::Tensor> b_ih = biases ? std::optional<at::Tensor>(w[2]) : std::nullopt;
    const std::optional<at::Tensor> b_hh = biases ? std::optional<at::Tensor>(w[3]) : std::nullopt;
    // In the regular path's order: the layer's states, then the input projection.
    const at::Tensor h0 = h.select(0, layer);
    const at::Tensor c0 = lstm ? c->select(0, layer) : at::Tensor();
    at::Tensor y, h_last, c_last, saved;
    if (gated_layer) {
      std::tie(y, h_last, c_last) =
          call_gated_layer(x, w[0], b_ih, b_hh, h0, lstm ? std::optional<at::Tensor>(c0) : std::nullopt, w[1], mode);
      if (lstm) c_n.push_back(c_last);
    } else if (lstm) {
      const std::optional<at::Tensor> w_hr = projection ? std::optional<at::Tensor>(w[per_layer - 1]) : std::nullopt;
      const at::Tensor xp = at::linear(x, w[0], b_ih);
      std::tie(y, h_last, c_last, saved) = call_lstm(xp, b_hh, h0, c0, w[1], w_hr, std::nullopt, /*save=*/false);
      c_n.push_back(c_last);
    } else if (gru) {
      const at::Tensor xp = at::linear(x, w[0], b_ih);
      std::tie(y, h_last, saved) = call_gru(xp, b_hh, h0, w[1], std::nullopt, /*save=*/false);
    } else {
      std::tie(y, h_last) = call_layer(x, w[0], b_ih, b_hh, h0, w[1], std::nullopt, tanh ? "tanh" : "relu");
    }
    h_n.push_back(h_last);
    x = y;
  }
  // One layer's final state is already a tensor of its own: made 3-D in place,
  // neither copied nor a view (nn's h_n is none: detach_() works on it).
  const auto stacked = [&](std::vector<at::Tensor>& states) {
    return num_layers == 1 ? states[0].unsqueeze_(0) : at::stack(states);
  };
  return {x, stacked(h_n), lstm ? stacked(c_n) : at::Tensor()};
}

}  // namespace
}  // namespace torch_prnn

TORCH_LIBRARY_IMPL(prnn, CompositeImplicitAutograd, m) {
  m.impl("layers", &torch_prnn::layers);
}
