// prnn_cpu.cpp - the CPU impls' recurrences in float32 and float64: one BLAS
// GEMM per step with the recurrent weight (through ATen), then the cell's
// pointwise math in vectorised in-place ATen ops (the forwards) or in one
// fused loop over batch x hidden (the gated backwards, which need no
// transcendental function but LSTM's tanh(c)). They compute the functions of
// the C reference (csrc/kernels/cpu_*.c), which stays the C API's CPU path and
// the tests' oracle: PRNN_CPU_REFERENCE=1 makes the CPU impls call it.
#include <cstdlib>
#include <cstring>

#include "prnn_ops.h"

namespace torch_prnn {

bool use_cpu_reference() {
  const char* value = std::getenv("PRNN_CPU_REFERENCE");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

namespace {

// Which sequences have finished at each step (t >= lengths[b]), from the
// checked host int64 lengths; none without lengths.
class Finished {
 public:
  Finished(const std::optional<at::Tensor>& lengths, int64_t steps) {
    if (!lengths.has_value() || lengths->numel() == 0) return;
    const at::Tensor& l = *lengths;
    mask_ = at::arange(steps, l.options()).unsqueeze(1) >= l.unsqueeze(0);  // steps x batch
    first_ = l.min().item<int64_t>();
  }
  // batch x 1, true where a sequence has finished by step t; undefined when none has.
  at::Tensor at_step(int64_t t) const {
    return mask_.defined() && t >= first_ ? mask_.select(0, t).unsqueeze(1) : at::Tensor();
  }
  // t with the rows of finished sequences zeroed (t itself without lengths): t [steps, batch, N].
  at::Tensor zeroed(const at::Tensor& t) const {
    return mask_.defined() ? t.masked_fill(mask_.unsqueeze(2), 0) : t;
  }

 private:
  at::Tensor mask_;
  int64_t first_ = 0;
};

// The forward recurrence of every cell. step(t, h, c) computes step t from
// the states before it (h [batch, S], LSTM's c [batch, hidden], else
// undefined) into y[t] and saved[t], and returns the new c. A finished
// sequence's state is frozen and its outputs zero, as in the reference.
// Returns the final (h, c).
template <typename Step>
std::pair<at::Tensor, at::Tensor> run_forward(const at::Tensor& y, const at::Tensor& saved,
                                              const at::Tensor& h0, const at::Tensor& c0,
                                              const Finished& finished, Step step) {
  at::Tensor h = h0, c = c0;
  for (int64_t t = 0; t < y.size(0); ++t) {
    at::Tensor c_next = step(t, h, c);
    at::Tensor h_next = y[t];
    const at::Tensor done = finished.at_step(t);
    if (done.defined()) {
      h_next = at::where(done, h, h_next);
      if (c.defined()) c_next = at::where(done, c, c_next);
      y[t].masked_fill_(done, 0);
      if (saved.numel() > 0) saved[t].masked_fill_(done, 0);
    }
    h = h_next;
    c = c_next;
  }
  return {h, c};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> forward_aten(const at::Tensor& xp, const at::Tensor& h0,
                                                const at::Tensor& w_hh,
                                                const std::optional<at::Tensor>& lengths,
                                                prnn_activation_t activation) {
  const int64_t T = xp.size(0);
  at::Tensor y = at::empty({T, xp.size(1), xp.size(2)}, xp.options());
  const at::Tensor w_hh_t = w_hh.t();
  const auto [h_n, c_n] = run_forward(
      y, at::Tensor(), h0, at::Tensor(), Finished(lengths, T),
      [&](int64_t t, const at::Tensor& h, const at::Tensor&) {
        at::Tensor y_t = y[t];
        at::addmm_out(y_t, xp[t], h, w_hh_t);
        // relu_ keeps NaN, as the reference's relu
        activation == PRNN_ACT_TANH ? y_t.tanh_() : y_t.relu_();
        return at::Tensor();
      });
  return {y, h_n.clone(at::MemoryFormat::Contiguous)};
}

at::Tensor backward_data_aten(const at::Tensor& grad_y, const at::Tensor& y,
                              const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                              prnn_activation_t activation) {
  const int64_t T = y.size(0);
  at::Tensor grad_xp = at::empty(y.sizes(), y.options());
  // A finished sequence's grad_y is left out; its delta is then zero, as the
  // reference's (its y is zero and so is the delta after it).
  const at::Tensor grad = Finished(lengths, T).zeroed(grad_y);
  for (int64_t t = T - 1; t >= 0; --t) {
    at::Tensor delta = grad_xp[t];  // dLoss/d(xp_t + W_hh h_{t-1}) = act'(y_t) dLoss/dh_t
    if (t == T - 1)
      delta.copy_(grad[t]);
    else
      at::addmm_out(delta, grad[t], grad_xp[t + 1], w_hh);  // dLoss/dh_t = grad_y_t + delta_{t+1} W_hh
    if (activation == PRNN_ACT_TANH)
      at::tanh_backward_out(delta, delta, y[t]);
    else
      delta.masked_fill_(y[t] <= 0, 0);  // passes where y is NaN, as the reference
  }
  return grad_xp;
}

}  // namespace torch_prnn
