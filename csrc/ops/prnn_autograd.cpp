// prnn_autograd.cpp - autograd of prnn::forward, registered in C++ for every
// device: a training step's forward and backward then never enter Python
// for the op (torch.library's Python wrapper cost about 50 us of host time
// per step, which the GPU waited for: bench/NOTES.md). The backward is the
// prnn::backward op, called through the dispatcher so that its own autograd
// registration (torch_prnn/ops.py: double backward raises) applies.
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

namespace torch_prnn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_forward(const at::Tensor& xp, const at::Tensor& h0, const at::Tensor& w_hh,
                        const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::forward", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, c10::string_view)>();
  return op.call(xp, h0, w_hh, lengths, nonlinearity);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward(
    const at::Tensor& grad_y, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("prnn::backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const std::optional<at::Tensor>&, c10::string_view)>();
  return op.call(grad_y, y, h0, w_hh, lengths, nonlinearity);
}

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

at::Tensor forward_autograd(const at::Tensor& xp, const at::Tensor& h0, const at::Tensor& w_hh,
                            const std::optional<at::Tensor>& lengths,
                            c10::string_view nonlinearity) {
  // Forward-mode AD (torch.autograd.forward_ad): there is no jvp formula,
  // and below autograd a dual input's tangent would be dropped without a word.
  const auto dual = [](const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); };
  TORCH_CHECK(!(dual(xp) || dual(h0) || dual(w_hh)),
              "prnn::forward: forward-mode AD (dual tensors of torch.autograd.forward_ad) is not "
              "supported; use reverse mode (backward() or torch.autograd.grad)");
  const auto requires_grad = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
  if (!at::GradMode::is_enabled() ||
      !(requires_grad(xp) || requires_grad(h0) || requires_grad(w_hh))) {
    // Nothing to record (inference, no_grad): straight to the kernel.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_forward(xp, h0, w_hh, lengths, nonlinearity);
  }
  return ForwardFunction::apply(xp, h0, w_hh, lengths, nonlinearity);
}

}  // namespace
}  // namespace torch_prnn

TORCH_LIBRARY_IMPL(prnn, Autograd, m) {
  m.impl("forward", &torch_prnn::forward_autograd);
}
