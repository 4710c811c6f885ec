// prnn_autograd.cpp - autograd of prnn::forward and prnn::layer, registered in
// C++ for every device: a training step's forward and backward then never
// enter Python for the ops (torch.library's Python wrapper cost about 50 us
// of host time per step, which the GPU waited for: bench/NOTES.md). Both
// backwards call the prnn::backward op through the dispatcher so that its own
// autograd registration (torch_prnn/ops.py: double backward raises) applies.
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "prnn_ops.h"

namespace torch_prnn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class ForwardFunction : public torch::autograd::Function<ForwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& xp, const at::Tensor& h0,
                            const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                            c10::string_view nonlinearity) {
    at::Tensor y;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      y = call_forward(xp, h0, w_hh, lengths, nonlinearity);
    }
    // y, not xp: the backward needs the states, which nn.RNN keeps too.
    // lengths as a saved tensor (undefined when absent), so that changing it
    // in place before backward raises autograd's error and saved-tensor hooks
    // see it, as they did with the Python registration.
    ctx->save_for_backward({h0, w_hh, y, lengths.value_or(at::Tensor())});
    ctx->saved_data["nonlinearity"] = std::string(nonlinearity);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();  // h0, w_hh, y, lengths
    const std::optional<at::Tensor> lengths =
        saved[3].defined() ? std::optional<at::Tensor>(saved[3]) : std::nullopt;
    auto [grad_xp, grad_h0, grad_w_hh] =
        call_backward(grads[0], saved[2], saved[0], saved[1], lengths,
                      ctx->saved_data["nonlinearity"].toStringRef());
    // One gradient per forward argument: lengths and nonlinearity have none.
    return {grad_xp, grad_h0, grad_w_hh, at::Tensor(), at::Tensor()};
  }
};

// prnn::forward's autograd plus the input projection's (xp = x w_ih^T + b_ih + b_hh).
class LayerFunction : public torch::autograd::Function<LayerFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_ih,
                            const std::optional<at::Tensor>& b_ih,
                            const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                            const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                            c10::string_view nonlinearity) {
    at::Tensor y;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      y = call_layer(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
    }
    // What nn.RNN's autograd keeps: the input (for w_ih's gradient) and the
    // states, not xp. x itself, not its rows: a view made below autograd has
    // a version counter of its own, which would hide an in-place change of x.
    ctx->save_for_backward({x, w_ih, h0, w_hh, y, lengths.value_or(at::Tensor())});
    ctx->saved_data["nonlinearity"] = std::string(nonlinearity);
    ctx->saved_data["has_bias"] = b_ih.has_value();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();  // x, w_ih, h0, w_hh, y, lengths
    const at::Tensor &x = saved[0], &w_ih = saved[1], &y = saved[4];
    const std::optional<at::Tensor> lengths =
        saved[5].defined() ? std::optional<at::Tensor>(saved[5]) : std::nullopt;
    auto [grad_xp, grad_h0, grad_w_hh] =
        call_backward(grads[0], y, saved[2], saved[3], lengths,
                      ctx->saved_data["nonlinearity"].toStringRef());
    // Autograd's edges are the tensor arguments present: x, w_ih, [b_ih, b_hh,] h0, w_hh.
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const at::Tensor rows = as_rows(grad_xp);  // [T*B, H]
    at::Tensor grad_x, grad_w_ih, grad_b;
    if (ctx->needs_input_grad(0)) grad_x = rows.mm(w_ih).view_symint(x.sym_sizes());
    if (ctx->needs_input_grad(1)) grad_w_ih = rows.t().mm(as_rows(x));
    if (has_bias && (ctx->needs_input_grad(2) || ctx->needs_input_grad(3))) grad_b = rows.sum(0);
    // One gradient per forward argument: lengths and nonlinearity have none.
    return {grad_x, grad_w_ih, grad_b, grad_b, grad_h0, grad_w_hh, at::Tensor(), at::Tensor()};
  }
};

// Forward-mode AD (torch.autograd.forward_ad) has no jvp formula here, and
// below autograd a dual input's tangent would be dropped without a word.
void refuse_forward_ad(const char* op, std::initializer_list<const at::Tensor*> inputs) {
  for (const at::Tensor* t : inputs) {
    TORCH_CHECK(!(t->defined() && t->_fw_grad(/*level=*/0).defined()), op,
                ": forward-mode AD (dual tensors of torch.autograd.forward_ad) is not "
                "supported; use reverse mode (backward() or torch.autograd.grad)");
  }
}

// Whether the call has a graph to record: grad mode on and some input requiring grad.
bool records_graph(std::initializer_list<const at::Tensor*> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

at::Tensor forward_autograd(const at::Tensor& xp, const at::Tensor& h0, const at::Tensor& w_hh,
                            const std::optional<at::Tensor>& lengths,
                            c10::string_view nonlinearity) {
  refuse_forward_ad("prnn::forward", {&xp, &h0, &w_hh});
  if (!records_graph({&xp, &h0, &w_hh})) {
    // Nothing to record (inference, no_grad): straight to the kernel.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_forward(xp, h0, w_hh, lengths, nonlinearity);
  }
  return ForwardFunction::apply(xp, h0, w_hh, lengths, nonlinearity);
}

at::Tensor layer_autograd(const at::Tensor& x, const at::Tensor& w_ih,
                          const std::optional<at::Tensor>& b_ih,
                          const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                          const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                          c10::string_view nonlinearity) {
  static const at::Tensor none;
  const at::Tensor* bi = b_ih.has_value() ? &*b_ih : &none;
  const at::Tensor* bh = b_hh.has_value() ? &*b_hh : &none;
  refuse_forward_ad("prnn::layer", {&x, &w_ih, bi, bh, &h0, &w_hh});
  if (!records_graph({&x, &w_ih, bi, bh, &h0, &w_hh})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_layer(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
  }
  return LayerFunction::apply(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
}

}  // namespace
}  // namespace torch_prnn

TORCH_LIBRARY_IMPL(prnn, Autograd, m) {
  m.impl("forward", &torch_prnn::forward_autograd);
  m.impl("layer", &torch_prnn::layer_autograd);
}
