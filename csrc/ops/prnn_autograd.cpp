// prnn_autograd.cpp - autograd of prnn::forward, prnn::layer, prnn::lstm and
// prnn::gru, registered in C++ for every device: a training step's forward
// and backward then never enter Python for the ops (torch.library's Python
// wrapper cost about 50 us of host time per step, which the GPU waited for:
// bench/NOTES.md). The backwards call the backward ops (prnn::backward,
// prnn::lstm_backward, prnn::gru_backward) through the dispatcher so that
// their own autograd registration (torch_prnn/ops.py: double backward
// raises) applies.
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "prnn_ops.h"

namespace torch_prnn {

bool has_forward_tangent(c10::ArrayRef<const at::Tensor*> inputs) {
  for (const at::Tensor* t : inputs)
    if (t->defined() && t->_fw_grad(/*level=*/0).defined()) return true;
  return false;
}

bool records_graph(c10::ArrayRef<const at::Tensor*> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::optional<at::Tensor> lengths_of(const at::Tensor& saved) {
  return saved.defined() ? std::optional<at::Tensor>(saved) : std::nullopt;
}

// Indices from the host lengths on `like`'s device where torch.compile traces
// this code on fake tensors: a plain copy rather than to_device_async's pinned
// staging. Eager calls take host_buffer's pinned copies (a copy from pageable
// memory may wait for the kernels queued before it).
at::Tensor on_device_of(const at::Tensor& host, const at::Tensor& like) {
  return host.to(host.options().device(like.device()), /*non_blocking=*/true);
}

// grad_y with grad_h_n added at each sequence's last step, where h_n copied
// y (steps >= 1). A fresh tensor: grad_y may be autograd's own or stride 0.
// Without grad_y, zeros made from grad_h_n: batched gradients (vmap over the
// backward) batch them as they do grad_h_n, so that adding it in place is allowed.
at::Tensor with_final_state_grad(const at::Tensor& grad_y, const at::Tensor& grad_h_n,
                                 const at::Tensor& y, const std::optional<at::Tensor>& lengths) {
  at::Tensor grad = grad_y.defined() ? grad_y.clone(at::MemoryFormat::Contiguous)
                                     : grad_h_n.new_zeros_symint(y.sym_sizes());
  if (!lengths.has_value()) {
    grad.select_symint(0, y.sym_size(0) - 1).add_(grad_h_n);
    return grad;
  }
  // A sequence of length 0 adds to its step 0, which the backward-data pass
  // ignores (past a length the deltas are zero whatever grad_y holds).
  const at::Tensor rows =
      readable(*lengths) && readable(y)
          ? to_device_async(final_state_rows_host(*lengths, y.size(1), y.device()), y.device())
          : on_device_of(final_state_rows(*lengths, y.sym_size(1)), y);
  as_rows(grad).index_put_({rows}, grad_h_n, /*accumulate=*/true);
  return grad;
}

// prnn::backward for the gradients of both outputs of prnn::forward and
// prnn::layer, y and h_n (undefined where the loss does not use one). h_n's
// gradient joins y's at each sequence's last step, or goes to h0's where a
// sequence has no step. Returns grad_xp, grad_h0 (undefined without
// h0_grad: h0 needs none, and its GEMM is skipped), grad_w_hh.
std::tuple<at::Tensor, at::Tensor, at::Tensor> recurrence_backward(
    const at::Tensor& grad_y, const at::Tensor& grad_h_n, const at::Tensor& y, const at::Tensor& h0,
    const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
    c10::string_view nonlinearity, bool h0_grad) {
  if (!grad_y.defined() && !grad_h_n.defined()) return {};
  const bool has_steps = y.sym_size(0) != 0;
  at::Tensor grad = grad_h_n.defined() && has_steps
                        ? with_final_state_grad(grad_y, grad_h_n, y, lengths)
                        : grad_y.defined() ? grad_y : at::zeros_symint(y.sym_sizes(), y.options());
  auto [grad_xp, grad_h0, grad_w_hh] = call_backward(grad, y, h0, w_hh, lengths, nonlinearity, h0_grad);
  if (!h0_grad) return {grad_xp, at::Tensor(), grad_w_hh};
  if (grad_h_n.defined() && !has_steps) {
    grad_h0 = grad_h0 + grad_h_n;
  } else if (grad_h_n.defined() && lengths.has_value() && (!readable(*lengths) || has_unstarted(*lengths))) {
    // Where a length is 0, h_n is h0 and the recurrence gave h0 no gradient.
    const at::Tensor unstarted = (*lengths == 0).unsqueeze(1);
    grad_h0 = at::where(on_device_of(unstarted, y), grad_h_n, grad_h0);
  }
  return {grad_xp, grad_h0, grad_w_hh};
}

class ForwardFunction : public torch::autograd::Function<ForwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& xp, const at::Tensor& h0,
                               const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                               c10::string_view nonlinearity) {
    at::Tensor y, h_n;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(y, h_n) = call_forward(xp, h0, w_hh, lengths, nonlinearity);
    }
    // y, not xp: the backward needs the states, which nn.RNN keeps too.
    // lengths as a saved tensor (undefined when absent), so that changing it
    // in place before backward raises autograd's error and saved-tensor hooks
    // see it, as they did with the Python registration.
    ctx->save_for_backward({h0, w_hh, y, lengths.value_or(at::Tensor())});
    ctx->saved_data["nonlinearity"] = std::string(nonlinearity);
    ctx->set_materialize_grads(false);  // a loss on y or h_n alone: no zeros for the other
    return {y, h_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();  // h0, w_hh, y, lengths
    auto [grad_xp, grad_h0, grad_w_hh] =
        recurrence_backward(grads[0], grads[1], saved[2], saved[0], saved[1], lengths_of(saved[3]),
                            ctx->saved_data["nonlinearity"].toStringRef(), ctx->needs_input_grad(1));
    // One gradient per forward argument: lengths and nonlinearity have none.
    return {grad_xp, grad_h0, grad_w_hh, at::Tensor(), at::Tensor()};
  }
};

// prnn::forward's autograd plus the input projection's (xp = x w_ih^T + b_ih + b_hh).
class LayerFunction : public torch::autograd::Function<LayerFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_ih,
                               const std::optional<at::Tensor>& b_ih,
                               const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                               const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                               c10::string_view nonlinearity) {
    at::Tensor y, h_n;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(y, h_n) = call_layer(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
    }
    // What nn.RNN's autograd keeps: the input (for w_ih's gradient) and the
    // states, not xp. x itself, not its rows: a view made below autograd has
    // a version counter of its own, which would hide an in-place change of x.
    ctx->save_for_backward({x, w_ih, h0, w_hh, y, lengths.value_or(at::Tensor())});
    ctx->saved_data["nonlinearity"] = std::string(nonlinearity);
    ctx->saved_data["has_bias"] = b_ih.has_value();
    ctx->set_materialize_grads(false);
    return {y, h_n};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();  // x, w_ih, h0, w_hh, y, lengths
    const at::Tensor &x = saved[0], &w_ih = saved[1];
    // Autograd's edges are the tensor arguments present: x, w_ih, [b_ih, b_hh,] h0, w_hh.
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    auto [grad_xp, grad_h0, grad_w_hh] = recurrence_backward(
        grads[0], grads[1], saved[4], saved[2], saved[3], lengths_of(saved[5]),
        ctx->saved_data["nonlinearity"].toStringRef(), ctx->needs_input_grad(has_bias ? 4 : 2));
    at::Tensor grad_x, grad_w_ih, grad_b_ih, grad_b_hh;
    if (grad_xp.defined()) {
      const at::Tensor rows = as_rows(grad_xp);  // [T*B, H]
      if (ctx->needs_input_grad(0)) grad_x = rows.mm(w_ih).view_symint(x.sym_sizes());
      if (ctx->needs_input_grad(1)) grad_w_ih = rows.t().mm(as_rows(x));
      const bool ih = has_bias && ctx->needs_input_grad(2), hh = has_bias && ctx->needs_input_grad(3);
      if (ih || hh) {
        // The same values, but a tensor for each bias, as nn.RNN gives them:
        // clip_grad_norm_ or GradScaler.unscale_ changes each in place.
        const at::Tensor grad_b = rows.sum(0);
        if (ih) grad_b_ih = grad_b;
        if (hh) grad_b_hh = ih ? grad_b.clone() : grad_b;
      }
    }
    // One gradient per forward argument: lengths and nonlinearity have none.
    return {grad_x, grad_w_ih, grad_b_ih, grad_b_hh, grad_h0, grad_w_hh, at::Tensor(), at::Tensor()};
  }
};

// prnn::lstm's and prnn::gru's autograd: one Function for both cells (a GRU
// passes no c0 and no w_hr). The forward asks the op for `saved`, which the
// backward op takes; the gradients of y, h_n and c_n enter the backward op,
// the undefined ones as zeros (grad_y) or None.
class GatedFunction : public torch::autograd::Function<GatedFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& xp,
                               const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                               const std::optional<at::Tensor>& c0, const at::Tensor& w_hh,
                               const std::optional<at::Tensor>& w_hr,
                               const std::optional<at::Tensor>& lengths, bool save, bool lstm) {
    at::Tensor y, h_n, c_n, saved;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      if (lstm)
        std::tie(y, h_n, c_n, saved) = call_lstm(xp, b_hh, h0, *c0, w_hh, w_hr, lengths, true);
      else
        std::tie(y, h_n, saved) = call_gru(xp, b_hh, h0, w_hh, lengths, true);
    }
    // What nn.LSTM / nn.GRU keep: the states and the gates, not xp. Saved
    // tensors, so that an in-place change before backward raises autograd's error.
    ctx->save_for_backward({h0, c0.value_or(at::Tensor()), w_hh, w_hr.value_or(at::Tensor()), y,
                            saved, lengths.value_or(at::Tensor())});
    ctx->saved_data["lstm"] = lstm;
    ctx->saved_data["has_b_hh"] = b_hh.has_value();
    ctx->set_materialize_grads(false);
    // The caller's `saved` as it asked for it: without save, a [0] tensor, as below autograd.
    at::Tensor saved_out = save ? saved : at::empty({0}, saved.options());
    ctx->mark_non_differentiable({saved_out});
    if (lstm) return {y, h_n, c_n, saved_out};
    return {y, h_n, saved_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();  // h0, c0, w_hh, w_hr, y, saved, lengths
    const auto optional = [](const at::Tensor& t) {
      return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
    };
    const bool lstm = ctx->saved_data["lstm"].toBool();
    const at::Tensor &h0 = s[0], &c0 = s[1], &w_hh = s[2], &y = s[4], &saved = s[5];
    const std::optional<at::Tensor> w_hr = optional(s[3]), lengths = optional(s[6]);
    // grads: y, h_n, (c_n,) saved; undefined where the loss does not use an output.
    const at::Tensor grad_y = grads[0].defined() ? grads[0] : at::zeros_like(y);
    const std::optional<at::Tensor> grad_h_n = optional(grads[1]);
    at::Tensor grad_xp, grad_h0, grad_c0, grad_w_hh, grad_b_hh, grad_w_hr;
    if (lstm)
      std::tie(grad_xp, grad_h0, grad_c0, grad_w_hh, grad_b_hh, grad_w_hr) = call_lstm_backward(
          grad_y, grad_h_n, optional(grads[2]), h0, c0, y, saved, w_hh, w_hr, lengths);
    else
      std::tie(grad_xp, grad_h0, grad_w_hh, grad_b_hh) =
          call_gru_backward(grad_y, grad_h_n, h0, y, saved, w_hh, lengths);
    // Autograd's edges are the tensor inputs present, in order: xp, [b_hh,] h0, [c0,] w_hh, [w_hr].
    int64_t edge = 0;
    const auto wanted = [&](bool present) { return present && ctx->needs_input_grad(edge++); };
    const bool want_xp = wanted(true), want_b_hh = wanted(ctx->saved_data["has_b_hh"].toBool()),
               want_h0 = wanted(true), want_c0 = wanted(lstm), want_w_hh = wanted(true),
               want_w_hr = wanted(w_hr.has_value());
    const auto keep = [](bool want, const at::Tensor& t) { return want ? t : at::Tensor(); };
    // One gradient per forward argument: lengths, save and lstm have none.
    return {keep(want_xp, grad_xp),     keep(want_b_hh, grad_b_hh), keep(want_h0, grad_h0),
            keep(want_c0, grad_c0),     keep(want_w_hh, grad_w_hh), keep(want_w_hr, grad_w_hr),
            at::Tensor(),               at::Tensor(),               at::Tensor()};
  }
};

// Forward-mode AD (torch.autograd.forward_ad) has no jvp formula here, and
// below autograd a dual input's tangent would be dropped without a word.
void refuse_forward_ad(const char* op, c10::ArrayRef<const at::Tensor*> inputs) {
  TORCH_CHECK(!has_forward_tangent(inputs), op,
              ": forward-mode AD (dual tensors of torch.autograd.forward_ad) is not "
              "supported; use reverse mode (backward() or torch.autograd.grad)");
}

std::tuple<at::Tensor, at::Tensor> forward_autograd(const at::Tensor& xp, const at::Tensor& h0,
                                                    const at::Tensor& w_hh,
                                                    const std::optional<at::Tensor>& lengths,
                                                    c10::string_view nonlinearity) {
  // Before autograd's Function::apply, which would fail on None ("tensor does not have a device").
  check_defined("prnn::forward", "xp", xp);
  check_defined("prnn::forward", "h0", h0);
  check_defined("prnn::forward", "w_hh", w_hh);
  refuse_forward_ad("prnn::forward", {&xp, &h0, &w_hh});
  if (!records_graph({&xp, &h0, &w_hh})) {
    // Nothing to record (inference, no_grad): straight to the kernel.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_forward(xp, h0, w_hh, lengths, nonlinearity);
  }
  const variable_list outputs = ForwardFunction::apply(xp, h0, w_hh, lengths, nonlinearity);
  return {outputs[0], outputs[1]};
}

std::tuple<at::Tensor, at::Tensor> layer_autograd(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  static const at::Tensor none;
  const at::Tensor* bi = b_ih.has_value() ? &*b_ih : &none;
  const at::Tensor* bh = b_hh.has_value() ? &*b_hh : &none;
  check_defined("prnn::layer", "x", x);
  check_defined("prnn::layer", "w_ih", w_ih);
  check_defined("prnn::forward", "h0", h0);  // the recurrence's messages, as call_layer's checks
  check_defined("prnn::forward", "w_hh", w_hh);
  refuse_forward_ad("prnn::layer", {&x, &w_ih, bi, bh, &h0, &w_hh});
  if (!records_graph({&x, &w_ih, bi, bh, &h0, &w_hh})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_layer(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
  }
  const variable_list outputs =
      LayerFunction::apply(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
  return {outputs[0], outputs[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_autograd(
    const at::Tensor& xp, const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
    const at::Tensor& c0, const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
    const std::optional<at::Tensor>& lengths, bool save) {
  static const at::Tensor none;
  const at::Tensor* bh = b_hh.has_value() ? &*b_hh : &none;
  const at::Tensor* wr = w_hr.has_value() ? &*w_hr : &none;
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"xp", &xp}, {"h0", &h0}, {"c0", &c0},
                                {"w_hh", &w_hh}})
    check_defined("prnn::lstm", name, *t);
  refuse_forward_ad("prnn::lstm", {&xp, bh, &h0, &c0, &w_hh, wr});
  if (!records_graph({&xp, bh, &h0, &c0, &w_hh, wr})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_lstm(xp, b_hh, h0, c0, w_hh, w_hr, lengths, save);
  }
  const variable_list out = GatedFunction::apply(xp, b_hh, h0, c0, w_hh, w_hr, lengths, save, true);
  return {out[0], out[1], out[2], out[3]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gru_autograd(const at::Tensor& xp,
                                                            const std::optional<at::Tensor>& b_hh,
                                                            const at::Tensor& h0,
                                                            const at::Tensor& w_hh,
                                                            const std::optional<at::Tensor>& lengths,
                                                            bool save) {
  static const at::Tensor none;
  const at::Tensor* bh = b_hh.has_value() ? &*b_hh : &none;
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"xp", &xp}, {"h0", &h0}, {"w_hh", &w_hh}})
    check_defined("prnn::gru", name, *t);
  refuse_forward_ad("prnn::gru", {&xp, bh, &h0, &w_hh});
  if (!records_graph({&xp, bh, &h0, &w_hh})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_gru(xp, b_hh, h0, w_hh, lengths, save);
  }
  const variable_list out =
      GatedFunction::apply(xp, b_hh, h0, std::nullopt, w_hh, std::nullopt, lengths, save, false);
  return {out[0], out[1], out[2]};
}

// prnn::gated_layer has no backward: a call that would record a graph is
// refused here, before it runs, rather than giving gradients that are wrong.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_layer_autograd(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& w_hh, c10::string_view mode) {
  static const at::Tensor none;
  const at::Tensor* bi = b_ih.has_value() ? &*b_ih : &none;
  const at::Tensor* bh = b_hh.has_value() ? &*b_hh : &none;
  const at::Tensor* c = c0.has_value() ? &*c0 : &none;
  refuse_forward_ad("prnn::gated_layer", {&x, &w_ih, bi, bh, &h0, c, &w_hh});
  TORCH_CHECK(!records_graph({&x, &w_ih, bi, bh, &h0, c, &w_hh}), "prnn::gated_layer",
              ": not differentiable (the modules' path for calls without gradients); call it under "
              "torch.no_grad() or on tensors that do not require grad, or use the input GEMM and "
              "prnn::lstm / prnn::gru, which are");
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_gated_layer(x, w_ih, b_ih, b_hh, h0, c0, w_hh, mode);
}

}  // namespace
}  // namespace torch_prnn

TORCH_LIBRARY_IMPL(prnn, Autograd, m) {
  m.impl("gated_layer", &torch_prnn::gated_layer_autograd);
  m.impl("forward", &torch_prnn::forward_autograd);
  m.impl("layer", &torch_prnn::layer_autograd);
  m.impl("lstm", &torch_prnn::lstm_autograd);
  m.impl("gru", &torch_prnn::gru_autograd);
}
