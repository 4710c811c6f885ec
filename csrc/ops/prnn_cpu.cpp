// prnn_cpu.cpp - the CPU impls' recurrences in float32 and float64: one BLAS
// GEMM per step with the recurrent weight (through ATen), then the cell's
// pointwise math in vectorised in-place ATen ops (the forwards) or in one
// fused loop over batch x hidden (the gated backwards, which need no
// transcendental function but LSTM's tanh(c)). They compute the functions of
// the C reference (csrc/kernels/cpu_*.c), which stays the C API's CPU path and
// the tests' oracle: PRNN_CPU_REFERENCE=1 makes the CPU impls call it.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "prnn_ops.h"

namespace torch_prnn {

bool use_cpu_reference() {
  const char* value = std::getenv("PRNN_CPU_REFERENCE");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

namespace {

// Which sequences have finished at each step (t >= lengths[b]), from the
// checked host int64 lengths; none without lengths. Lengths that never
// increase along the batch (a PackedSequence's, padded in its sorted order)
// leave the live sequences of step t as the rows [0, live(t)), and the steps
// run on those rows alone, as nn's packed recurrence does; other lengths
// freeze the finished rows by masks.
class Finished {
 public:
  Finished(const std::optional<at::Tensor>& lengths, int64_t steps, int64_t batch) : batch_(batch) {
    if (!lengths.has_value() || batch == 0) return;
    const at::Tensor l = lengths->contiguous();
    const int64_t* length = l.const_data_ptr<int64_t>();
    bool sorted = true;
    for (int64_t b = 1; b < batch && sorted; ++b) sorted = length[b] <= length[b - 1];
    if (sorted) {
      live_.resize(steps + 1);
      for (int64_t t = 0; t <= steps; ++t) {
        int64_t n = 0;
        while (n < batch && length[n] > t) ++n;
        live_[t] = n;
      }
      return;
    }
    mask_ = at::arange(steps, l.options()).unsqueeze(1) >= l.unsqueeze(0);  // steps x batch
    first_ = l.min().item<int64_t>();
  }
  // True where the live sequences of every step are leading rows.
  bool by_rows() const { return !live_.empty(); }
  // The rows a step computes: those of live sequences (by_rows) or every row.
  int64_t rows(int64_t t) const { return by_rows() ? live_[t] : batch_; }
  // Zeros into the rows of finished sequences of t [steps, batch, N], in
  // place; by rows one ATen call a run of steps with the same live rows
  // rather than one a step.
  void zero_finished(const at::Tensor& t) const {
    if (!by_rows()) {
      if (mask_.defined()) t.masked_fill_(mask_.unsqueeze(2), 0);
      return;
    }
    const int64_t steps = (int64_t)live_.size() - 1, batch = t.size(1);
    int64_t t0 = 0;
    while (t0 < steps) {
      int64_t t1 = t0 + 1;
      while (t1 < steps && live_[t1] == live_[t0]) ++t1;
      if (live_[t0] < batch) t.narrow(0, t0, t1 - t0).narrow(1, live_[t0], batch - live_[t0]).zero_();
      t0 = t1;
    }
  }
  // batch x 1, true where a sequence has finished by step t; undefined when
  // none has or when the steps run by rows.
  at::Tensor at_step(int64_t t) const {
    return mask_.defined() && t >= first_ ? mask_.select(0, t).unsqueeze(1) : at::Tensor();
  }
  // t with the rows of finished sequences zeroed (t itself without masks): t [steps, batch, N].
  at::Tensor zeroed(const at::Tensor& t) const {
    return mask_.defined() ? t.masked_fill(mask_.unsqueeze(2), 0) : t;
  }

 private:
  int64_t batch_;
  std::vector<int64_t> live_;  // by rows: rows(t) for t = 0..steps; else empty
  at::Tensor mask_;
  int64_t first_ = 0;
};

// The leading n rows of t (t itself for all of them: no view's host cost a step).
at::Tensor lead(const at::Tensor& t, int64_t n) { return n == t.size(0) ? t : t.narrow(0, 0, n); }

// The forward recurrence of every cell. step(t, n, h, c) computes step t of
// the leading n rows from the states before it (h [n, S], LSTM's c [n,
// hidden], else undefined) into y[t] and saved[t], and returns the new c. A
// finished sequence's state is frozen and its outputs zero, as in the
// reference. Returns the final (h, c).
template <typename Step>
std::pair<at::Tensor, at::Tensor> run_forward(const at::Tensor& y, const at::Tensor& saved,
                                              const at::Tensor& h0, const at::Tensor& c0,
                                              const Finished& finished, Step step) {
  const int64_t T = y.size(0), B = y.size(1);
  at::Tensor h = h0, c = c0;
  if (finished.by_rows()) {
    // Each sequence's final state is copied out at its last step; a sequence
    // without steps keeps h0's (and c0's).
    at::Tensor h_n = h0.clone(at::MemoryFormat::Contiguous);
    at::Tensor c_n = c0.defined() ? c0.clone(at::MemoryFormat::Contiguous) : at::Tensor();
    finished.zero_finished(y);
    if (saved.numel() > 0) finished.zero_finished(saved);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = finished.rows(t), next = finished.rows(t + 1);
      if (n == 0) continue;
      c = step(t, n, lead(h, n), c.defined() ? lead(c, n) : c);
      h = lead(y[t], n);
      if (next < n) {
        h_n.narrow(0, next, n - next).copy_(h.narrow(0, next, n - next));
        if (c.defined()) c_n.narrow(0, next, n - next).copy_(c.narrow(0, next, n - next));
      }
    }
    return {h_n, c_n};
  }
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor c_next = step(t, B, h, c);
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
  // y starts as xp, one copy for every step; each step adds W_hh h in place.
  at::Tensor y = xp.clone(at::MemoryFormat::Contiguous);
  const at::Tensor w_hh_t = w_hh.t();
  const Finished finished(lengths, T, xp.size(1));
  const auto [h_n, c_n] = run_forward(
      y, at::Tensor(), h0, at::Tensor(), finished,
      [&](int64_t t, int64_t n, const at::Tensor& h, const at::Tensor&) {
        at::Tensor y_t = lead(y[t], n);
        y_t.addmm_(h, w_hh_t);
        // relu_ keeps NaN, as the reference's relu
        activation == PRNN_ACT_TANH ? y_t.tanh_() : y_t.relu_();
        return at::Tensor();
      });
  // By rows h_n is a tensor of its own already; otherwise a view of y or h0.
  return {y, finished.by_rows() ? h_n : h_n.clone(at::MemoryFormat::Contiguous)};
}

at::Tensor backward_data_aten(const at::Tensor& grad_y, const at::Tensor& y,
                              const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                              prnn_activation_t activation) {
  const int64_t T = y.size(0), B = y.size(1);
  // A finished sequence's grad_y is left out; its delta is then zero, as the
  // reference's (its y is zero and so is the delta after it). grad_xp starts
  // as that grad_y, one copy for every step; each step adds delta_{t+1} W_hh.
  const Finished finished(lengths, T, B);
  at::Tensor grad_xp = grad_y.clone(at::MemoryFormat::Contiguous);
  finished.zero_finished(grad_xp);
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t n = finished.rows(t);
    if (n == 0) continue;
    at::Tensor delta = lead(grad_xp[t], n);  // dLoss/d(xp_t + W_hh h_{t-1}) = act'(y_t) dLoss/dh_t
    if (t < T - 1)  // dLoss/dh_t = grad_y_t + delta_{t+1} W_hh
      delta.addmm_(lead(grad_xp[t + 1], n), w_hh);
    if (activation == PRNN_ACT_TANH)
      at::tanh_backward_out(delta, delta, lead(y[t], n));
    else
      delta.masked_fill_(lead(y[t], n) <= 0, 0);  // passes where y is NaN, as the reference
  }
  return grad_xp;
}

void gated_forward_aten(const prnn_problem_t& problem, const GatedForwardCall& call,
                        const std::optional<at::Tensor>& lengths, bool save) {
  const int64_t T = problem.steps, B = problem.batch, H = problem.hidden;
  const bool lstm = problem.cell == PRNN_CELL_LSTM;
  const int64_t SAVED = lstm ? PRNN_LSTM_SAVED : PRNN_GRU_SAVED;
  // Each step's gates in saved[t]'s layout (value k of unit j at k*H + j):
  // saved itself, or two buffers taken in turn (a step reads the one before).
  const at::Tensor scratch = save ? at::Tensor() : at::empty({2, B, SAVED * H}, call.xp.options());
  const auto step_buffer = [&](int64_t t) { return save ? call.saved[t] : scratch[t % 2]; };
  const at::Tensor w_hh_t = call.w_hh.t();
  const at::Tensor& b_hh = call.b_hh;
  at::Tensor h_n, c_n;
  if (lstm) {
    // LSTM's b_hh is added with xp, for every step at once.
    const at::Tensor xp = b_hh.defined() ? call.xp + b_hh : call.xp;
    const bool projection = call.w_hr.defined();
    const at::Tensor m = projection ? at::empty({B, H}, xp.options()) : at::Tensor();
    // g and c in tensors of their own: ATen's CPU tanh is up to 2-4x slower on
    // a column slice of the gates' rows than on contiguous rows (c's two are
    // taken in turn: a step reads the one before).
    const at::Tensor g_rows = at::empty({B, H}, xp.options()), c_rows = at::empty({2, B, H}, xp.options());
    std::tie(h_n, c_n) = run_forward(
        call.y, call.saved, call.h0, call.c0, Finished(lengths, T, B),
        [&](int64_t t, int64_t rows, const at::Tensor& h, const at::Tensor& c) {
          const at::Tensor buffer = lead(step_buffer(t), rows);  // i, f, g, o, c
          at::Tensor gates = buffer.narrow(1, 0, 4 * H);
          at::addmm_out(gates, lead(xp[t], rows), h, w_hh_t);
          gates.narrow(1, 0, 2 * H).sigmoid_();
          gates.narrow(1, 3 * H, H).sigmoid_();
          const at::Tensor i = buffer.narrow(1, 0, H), f = buffer.narrow(1, H, H), o = buffer.narrow(1, 3 * H, H);
          at::Tensor g = lead(g_rows, rows), c_t = lead(c_rows[t % 2], rows);
          g.copy_(buffer.narrow(1, 2 * H, H)).tanh_();
          at::mul_out(c_t, f, c);
          c_t.addcmul_(i, g);
          if (save) {  // saved's layout: i, f, g, o, c
            buffer.narrow(1, 2 * H, H).copy_(g);
            buffer.narrow(1, 4 * H, H).copy_(c_t);
          }
          at::Tensor y_t = lead(call.y[t], rows);
          at::Tensor m_t = projection ? lead(m, rows) : y_t;  // o tanh(c_t)
          at::tanh_out(m_t, c_t);
          m_t.mul_(o);
          if (projection) at::mm_out(y_t, m_t, call.w_hr.t());
          return c_t;
        });
  } else {
    // n in a tensor of its own, as the LSTM's g and c (tanh on contiguous rows).
    const at::Tensor n_rows = at::empty({B, H}, call.xp.options());
    std::tie(h_n, c_n) = run_forward(
        call.y, call.saved, call.h0, at::Tensor(), Finished(lengths, T, B),
        [&](int64_t t, int64_t rows, const at::Tensor& h, const at::Tensor&) {
          const at::Tensor buffer = lead(step_buffer(t), rows);  // r, z, n, hn
          const at::Tensor x = lead(call.xp[t], rows);
          at::Tensor rz = buffer.narrow(1, 0, 2 * H), hn = buffer.narrow(1, 2 * H, H);  // W_hn h + b_hn
          at::Tensor hh = buffer.narrow(1, 0, 3 * H);  // W_hh h + b_hh
          if (b_hh.defined())
            at::addmm_out(hh, b_hh, h, w_hh_t);
          else
            at::mm_out(hh, h, w_hh_t);
          rz.add_(x.narrow(1, 0, 2 * H)).sigmoid_();
          at::Tensor n = lead(n_rows, rows);
          at::addcmul_out(n, x.narrow(1, 2 * H, H), rz.narrow(1, 0, H), hn);
          n.tanh_();
          if (save) {  // saved's layout: r, z, n, W_hn h + b_hn (which the backward reads)
            buffer.narrow(1, 3 * H, H).copy_(hn);
            hn.copy_(n);
          }
          at::Tensor y_t = lead(call.y[t], rows);
          // (1 - z) n + z h as nn.GRU writes it, n + z (h - n): lerp's other form
          // for z >= 0.5 gives NaN where h is infinite and z is 1.
          at::sub_out(y_t, h, n);
          at::addcmul_out(y_t, n, rz.narrow(1, H, H), y_t);
          return at::Tensor();
        });
  }
  call.h_n.copy_(h_n);
  if (lstm) call.c_n.copy_(c_n);
}

namespace {

// A gated backward's pointwise work at step t, one loop over batch x hidden:
// from dh = dLoss/dh_t (LSTM: dm = dLoss/dm_t, W_hr^T dh with a projection)
// and the saved gates, the gradients of the gates' pre-activations (grad_xp[t],
// a GRU's grad_hh[t]) and LSTM's dLoss/dc_{t-1} in dc; `keep` gets the part of
// dLoss/dh_{t-1} that does not come through W_hh (a GRU's z dh). A finished
// sequence's gradients are zero and its dh and dc pass through unchanged.
template <typename real>
void gated_backward_step(const prnn_problem_t& problem, const GatedBackwardCall& call,
                         const int32_t* lengths, int64_t t, const at::Tensor& dh_t,
                         const at::Tensor& dm_t, const at::Tensor& tanh_c, const at::Tensor& dc_t,
                         const at::Tensor& keep_t) {
  const int64_t B = problem.batch, H = problem.hidden, S = dh_t.size(1);
  const bool lstm = problem.cell == PRNN_CELL_LSTM;
  const int64_t G = lstm ? PRNN_LSTM_GATES : PRNN_GRU_GATES;
  const int64_t SAVED = lstm ? PRNN_LSTM_SAVED : PRNN_GRU_SAVED;
  const real* saved = call.saved.const_data_ptr<real>() + t * B * SAVED * H;  // batch x SAVED*H
  const real* dh = dh_t.const_data_ptr<real>();                               // batch x S
  real* gx = call.grad_xp.mutable_data_ptr<real>() + t * B * G * H;          // batch x G*H
  real* keep = keep_t.mutable_data_ptr<real>();                               // batch x S
  for (int64_t b = 0; b < B; ++b) {
    const real* st = saved + b * SAVED * H;
    real* gxb = gx + b * G * H;
    real* keepb = keep + b * S;
    const real* dhb = dh + b * S;
    if (lengths != nullptr && t >= lengths[b]) {
      for (int64_t u = 0; u < G * H; ++u) gxb[u] = 0;
      if (!lstm) {
        real* ghh = call.grad_hh.mutable_data_ptr<real>() + (t * B + b) * G * H;
        for (int64_t u = 0; u < G * H; ++u) ghh[u] = 0;
      }
      if (call.grad_h.defined()) {
        real* gh = call.grad_h.mutable_data_ptr<real>() + (t * B + b) * S;
        for (int64_t u = 0; u < S; ++u) gh[u] = 0;
      }
      for (int64_t u = 0; u < S; ++u) keepb[u] = dhb[u];
      continue;
    }
    if (lstm) {
      const real* dm = dm_t.const_data_ptr<real>() + b * H;
      const real* tc = tanh_c.const_data_ptr<real>() + b * H;
      real* dc = dc_t.mutable_data_ptr<real>() + b * H;
      const real* c_prev = t > 0 ? st - B * SAVED * H + 4 * H
                                 : call.c0.const_data_ptr<real>() + b * call.c0.stride(0);
      for (int64_t u = 0; u < H; ++u) {
        const real i = st[u], f = st[H + u], g = st[2 * H + u], o = st[3 * H + u];
        const real dct = dc[u] + dm[u] * o * (1 - tc[u] * tc[u]);
        gxb[u] = dct * g * i * (1 - i);
        gxb[H + u] = dct * c_prev[u] * f * (1 - f);
        gxb[2 * H + u] = dct * i * (1 - g * g);
        gxb[3 * H + u] = dm[u] * tc[u] * o * (1 - o);
        dc[u] = dct * f;
      }
      for (int64_t u = 0; u < S; ++u) keepb[u] = 0;
    } else {
      real* ghh = call.grad_hh.mutable_data_ptr<real>() + (t * B + b) * G * H;
      const real* h_prev = t > 0 ? call.y.const_data_ptr<real>() + ((t - 1) * B + b) * S
                                 : call.h0.const_data_ptr<real>() + b * call.h0.stride(0);
      for (int64_t u = 0; u < H; ++u) {
        const real r = st[u], z = st[H + u], n = st[2 * H + u], hn = st[3 * H + u];
        const real dn = dhb[u] * (1 - z) * (1 - n * n);  // d of n's pre-activation
        const real dr = dn * hn * r * (1 - r);
        const real dz = dhb[u] * (h_prev[u] - n) * z * (1 - z);
        gxb[u] = ghh[u] = dr;
        gxb[H + u] = ghh[H + u] = dz;
        gxb[2 * H + u] = dn;
        ghh[2 * H + u] = dn * r;
        keepb[u] = dhb[u] * z;  // h_t's direct term z h_{t-1}
      }
    }
  }
}

}  // namespace

void gated_backward_aten(const prnn_problem_t& problem, const GatedBackwardCall& call,
                         const at::Tensor& lengths32, const std::optional<at::Tensor>& lengths) {
  const int64_t T = problem.steps, B = problem.batch, H = problem.hidden;
  const bool lstm = problem.cell == PRNN_CELL_LSTM, projection = call.w_hr.defined();
  const at::TensorOptions options = call.y.options();
  // dLoss/dh_t and dLoss/dc_t, carried from step to step into grad_h0 and grad_c0;
  // grad_h_n and grad_c_n enter at a sequence's last step, as they pass through the frozen ones.
  at::Tensor dh = call.grad_h0, dc = call.grad_c0;
  call.grad_h_n.defined() ? dh.copy_(call.grad_h_n) : dh.zero_();
  if (lstm) call.grad_c_n.defined() ? dc.copy_(call.grad_c_n) : dc.zero_();
  // Past its length a sequence's dh and dc pass through: its rows are left
  // out of the step's ATen work where the live ones lead (Finished).
  const Finished finished(lengths, T, B);
  const at::Tensor grad_y = finished.zeroed(call.grad_y);
  const at::Tensor keep = at::empty(dh.sizes(), options);
  at::Tensor dm = projection ? at::empty({B, H}, options) : dh;
  at::Tensor tanh_c = lstm ? at::empty({B, H}, options) : at::Tensor();
  const at::Tensor& da = lstm ? call.grad_xp : call.grad_hh;  // dLoss/d(W_hh h_{t-1} + b_hh)
  const int32_t* length = lengths32.defined() ? lengths32.const_data_ptr<int32_t>() : nullptr;
  for (int64_t t = T - 1; t >= 0; --t) {
    const int64_t n = finished.rows(t);
    at::Tensor dh_live = lead(dh, n);
    dh_live.add_(lead(grad_y[t], n));
    if (projection) {
      lead(call.grad_h[t], n).copy_(dh_live);
      at::Tensor dm_live = lead(dm, n);
      at::mm_out(dm_live, dh_live, call.w_hr);
    }
    if (lstm) {
      at::Tensor tanh_c_live = lead(tanh_c, n);
      at::tanh_out(tanh_c_live, lead(call.saved[t].narrow(1, 4 * H, H), n));
    }
    AT_DISPATCH_FLOATING_TYPES(call.y.scalar_type(), "gated_backward_step", [&] {
      gated_backward_step<scalar_t>(problem, call, length, t, dh, dm, tanh_c, dc, keep);
    });
    if (n > 0) at::addmm_out(dh_live, lead(keep, n), lead(da[t], n), call.w_hh);  // dLoss/dh_{t-1} = keep + da_t W_hh
  }
}

}  // namespace torch_prnn
