// prnn_ops.h - what the CPU and CUDA impls and the autograd of the prnn:: ops
// share: argument checks, the C API structs filled from tensors, status
// errors, the GEMMs around the recurrence, and dispatcher calls of the ops.
#pragma once

#include <ATen/ATen.h>
#include <ATen/TensorSubclassLikeUtils.h>

#include <optional>
#include <tuple>

#include "../kernels/prnn.h"

namespace torch_prnn {

// A None passed for a Tensor argument arrives as an undefined tensor.
inline void check_defined(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", name, " must be a tensor, got None");
}

// A tensor dtype as the C API's (none for the dtypes it does not take).
std::optional<prnn_dtype_t> to_prnn_dtype(at::ScalarType type);

// Check the tensors of prnn::forward / prnn::backward (ranks, sizes, dtypes,
// devices, nonlinearity) and return the problem. `lengths` is checked by
// host_lengths.
prnn_problem_t check_forward(const at::Tensor& xp, const at::Tensor& h0, const at::Tensor& w_hh,
                             const std::optional<at::Tensor>& lengths,
                             c10::string_view nonlinearity);
prnn_problem_t check_backward(const at::Tensor& grad_y, const at::Tensor& y,
                              const at::Tensor& h0, const at::Tensor& w_hh,
                              const std::optional<at::Tensor>& lengths,
                              c10::string_view nonlinearity);

// Checks `lengths` (CPU int64 [batch], values in [0, steps]) and returns it as
// contiguous host int32 in a host_buffer for `device`, or an undefined tensor
// when absent. One pass over the values, no ATen op: a packed call's host time.
at::Tensor host_lengths(const char* op, const std::optional<at::Tensor>& lengths,
                        const prnn_problem_t& problem, c10::Device device = c10::kCPU);

// True when some size is zero: the outputs are empty (or zero) and the C API,
// which takes sizes >= 1, is not called.
bool is_empty(const prnn_problem_t& problem);

// Workspace of `plan`'s size on like's device (the C API never allocates);
// undefined when the plan needs none. workspace_ptr: its address, or NULL.
at::Tensor workspace(const prnn_plan_t& plan, const at::Tensor& like);
void* workspace_ptr(const at::Tensor& ws);

// The C API takes a stride per outer dimension but a unit-stride last one.
at::Tensor unit_last_stride(const at::Tensor& t);
// An incoming gradient (grad_y) as the backward passes take it, whose step
// and sequence strides may be 0: one that autograd expanded along its last
// dimension too (a sum's gradient, every stride 0) is copied only along the
// dimensions it varies in, not to its whole [T, B, S].
at::Tensor unit_last_stride_gradient(const at::Tensor& grad);

// The C API's argument structs; every tensor has a unit-stride last dimension
// and `lengths` is int32 in the memory of the device that runs the pass.
// The recurrence's fields, which prnn_forward_args_t and prnn_layer_args_t share.
template <typename Args>
void set_recurrence_args(Args& args, const at::Tensor& h0, const at::Tensor& w_hh, const at::Tensor& lengths,
                         const at::Tensor& y) {
  args.h0 = h0.const_data_ptr();
  args.h0_stride_b = h0.stride(0);
  args.w_hh = w_hh.const_data_ptr();
  args.w_hh_stride = w_hh.stride(0);
  args.lengths = lengths.defined() ? lengths.const_data_ptr<int32_t>() : nullptr;
  args.y = y.mutable_data_ptr();
}
prnn_forward_args_t forward_args(const at::Tensor& xp, const at::Tensor& h0,
                                 const at::Tensor& w_hh, const at::Tensor& lengths,
                                 const at::Tensor& y);
prnn_backward_args_t backward_args(const at::Tensor& grad_y, const at::Tensor& y,
                                   const at::Tensor& w_hh, const at::Tensor& lengths,
                                   const at::Tensor& grad_xp);

// Raises for a non-success status with the C API's detail
// (NotImplementedError for PRNN_STATUS_NOT_SUPPORTED, RuntimeError otherwise).
void check_status(const char* op, prnn_status_t status);

// The rest of prnn::backward from delta = grad_xp [T,B,H], on any device:
//   grad_w_hh = sum_t delta_t^T s_{t-1} (s_{-1} = h0, s_t = y_t; no term past a
//   sequence's length),  grad_h0 = delta_0 w_hh (a [0] tensor, its GEMM
//   skipped, without h0_grad).
std::tuple<at::Tensor, at::Tensor, at::Tensor> finish_backward(
    const at::Tensor& grad_xp, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, bool h0_grad);

// An empty host tensor [n] to fill and hand to to_device_async: pinned
// where `device` is a GPU (a copy from pageable memory may wait for the
// kernels queued on the stream), plain memory for the CPU.
at::Tensor host_buffer(int64_t n, at::ScalarType dtype, c10::Device device);

// A host_buffer made for `device`, on `device` (itself for the CPU), copied
// without waiting for the kernels queued on the stream; the caching host
// allocator keeps the pinned buffer until the copy has run.
at::Tensor to_device_async(const at::Tensor& host, c10::Device device);

// h_n [batch, hidden], a tensor of its own (never a view of y): each
// sequence's state after its last step, y[lengths[b] - 1, b] (y[steps - 1, b]
// without lengths), or h0[b] where it has no step. No host synchronisation.
at::Tensor final_state(const at::Tensor& y, const at::Tensor& h0,
                       const std::optional<at::Tensor>& lengths);

// The row of y's [steps * batch, hidden] rows (as_rows) that holds each
// sequence's final state: (lengths[b] - 1) batch + b, at step 0 where a length
// is 0. A host int64 tensor [batch] from the CPU lengths, in ATen ops that
// torch.compile can trace.
at::Tensor final_state_rows(const at::Tensor& lengths, const c10::SymInt& batch);

// The same rows from a loop over the host lengths (no ATen op) into a
// host_buffer for `device`. Eager calls only, as has_unstarted: lengths must
// be a real CPU tensor (see readable).
at::Tensor final_state_rows_host(const at::Tensor& lengths, int64_t batch, c10::Device device);

// Whether some sequence has no step (pack_padded_sequence makes none; a
// hand-built PackedSequence may): host int64 lengths.
bool has_unstarted(const at::Tensor& lengths);

// Whether a tensor's values can be read on the host: not a fake or
// functional tensor that torch.compile traces.
inline bool readable(const at::Tensor& t) { return !at::isTensorSubclassLike(t); }

// The weight gradient of a recurrence, one GEMM after its backward pass:
// sum_t delta_t^T s_{t-1} over states s_{-1} = h0, s_t = y_t; delta [T,B,N],
// y [T,B,S], h0 [B,S] -> [N,S] (zeros when T = 0). With lengths (host int64
// [B]) each sequence's state after its last step is left out.
at::Tensor recurrent_weight_grad(const at::Tensor& delta, const at::Tensor& y, const at::Tensor& h0,
                                 const std::optional<at::Tensor>& lengths);

// prnn::forward and prnn::backward through the dispatcher (below whatever
// dispatch key the caller has excluded). prnn::forward returns (y, h_n).
std::tuple<at::Tensor, at::Tensor> call_forward(const at::Tensor& xp, const at::Tensor& h0,
                                                const at::Tensor& w_hh,
                                                const std::optional<at::Tensor>& lengths,
                                                c10::string_view nonlinearity);
std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward(
    const at::Tensor& grad_y, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity, bool h0_grad);

// ---- The gated cells: prnn::lstm, prnn::gru and their backward ops ----
// LSTM's arguments as prnn::lstm takes them; a GRU has no c0 (undefined) and
// no w_hr (nullopt). lengths are checked by host_lengths.

// Checks xp [T,B,G*H], b_hh [G*H], h0 [B,S], c0 [B,H], w_hh [G*H,S],
// w_hr [S,H] (ranks, sizes, dtypes, devices) and returns the problem.
prnn_problem_t check_gated_forward(const char* op, prnn_cell_t cell, const at::Tensor& xp,
                                   const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                                   const at::Tensor& c0, const at::Tensor& w_hh,
                                   const std::optional<at::Tensor>& w_hr,
                                   const std::optional<at::Tensor>& lengths);
// Checks grad_y [T,B,S], grad_h_n [B,S], grad_c_n [B,H], h0, c0, y [T,B,S],
// saved [T,B,SAVED*H], w_hh, w_hr (sizes from w_hh, w_hr and y).
prnn_problem_t check_gated_backward(const char* op, prnn_cell_t cell, const at::Tensor& grad_y,
                                    const std::optional<at::Tensor>& grad_h_n,
                                    const std::optional<at::Tensor>& grad_c_n,
                                    const at::Tensor& h0, const at::Tensor& c0,
                                    const at::Tensor& y, const at::Tensor& saved,
                                    const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
                                    const std::optional<at::Tensor>& lengths);

// A gated forward's outputs, allocated on xp's device (for a zero-size
// problem already their values: h_n = h0, c_n = c0), and the C API's
// arguments for them. The inputs are kept with a unit-stride last dimension;
// `lengths32` is int32 where the pass reads it (undefined when absent).
struct GatedForwardCall {
  at::Tensor y, h_n, c_n, saved;  // c_n undefined for a GRU; saved [0] unless save
  at::Tensor xp, b_hh, h0, c0, w_hh, w_hr, lengths32;
  prnn_gated_forward_args_t args;
};
GatedForwardCall gated_forward_call(const prnn_problem_t& problem, const at::Tensor& xp,
                                    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                                    const at::Tensor& c0, const at::Tensor& w_hh,
                                    const std::optional<at::Tensor>& w_hr,
                                    const at::Tensor& lengths32, bool save);

// A gated backward's pass outputs (grad_hh for a GRU, grad_h with a
// projection; for a zero-size problem grad_h0 = grad_h_n, grad_c0 = grad_c_n
// or zeros) and the C API's arguments, as GatedForwardCall.
struct GatedBackwardCall {
  at::Tensor grad_xp, grad_hh, grad_h, grad_h0, grad_c0;
  at::Tensor grad_y, grad_h_n, grad_c_n, h0, c0, y, saved, w_hh, w_hr, lengths32;
  prnn_gated_backward_args_t args;
};
GatedBackwardCall gated_backward_call(const prnn_problem_t& problem, const at::Tensor& grad_y,
                                      const std::optional<at::Tensor>& grad_h_n,
                                      const std::optional<at::Tensor>& grad_c_n,
                                      const at::Tensor& h0, const at::Tensor& c0,
                                      const at::Tensor& y, const at::Tensor& saved,
                                      const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
                                      const at::Tensor& lengths32);

// The rest of a gated backward after the pass, on any device: (grad_xp,
// grad_h0, grad_c0, grad_w_hh, grad_b_hh, grad_w_hr), with
//   grad_w_hh = sum_t grad_hh_t^T s_{t-1} (s_{-1} = h0, s_t = y_t),  grad_b_hh = sum grad_hh,
//   grad_w_hr = sum_t grad_h_t^T m_t (m_t = o tanh(c_t), from saved), [0] without w_hr.
// grad_hh is grad_xp for an LSTM. grad_c0 is undefined for a GRU.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
finish_gated_backward(const prnn_problem_t& problem, const GatedBackwardCall& call,
                      const std::optional<at::Tensor>& lengths);

// A device's gated passes (gated_forward_cpu and its like): the op's name, the
// cell, and LSTM's arguments (a GRU's c0 undefined, its w_hr nullopt) ->
// (y, h_n, c_n, saved) or the six gradients (c_n, grad_c0 undefined for a GRU).
using GatedForwardFn = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> (*)(
    const char* op, prnn_cell_t cell, const at::Tensor& xp, const std::optional<at::Tensor>& b_hh,
    const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& w_hr, const std::optional<at::Tensor>& lengths, bool save);
using GatedBackwardFn =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> (*)(
        const char* op, prnn_cell_t cell, const at::Tensor& grad_y,
        const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
        const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& y, const at::Tensor& saved,
        const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
        const std::optional<at::Tensor>& lengths);

// The four ops' kernels on a device, from its gated passes.
template <GatedForwardFn forward>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lstm_kernel(
    const at::Tensor& xp, const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
    const at::Tensor& c0, const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
    const std::optional<at::Tensor>& lengths, bool save) {
  return forward("prnn::lstm", PRNN_CELL_LSTM, xp, b_hh, h0, c0, w_hh, w_hr, lengths, save);
}

template <GatedBackwardFn backward>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
lstm_backward_kernel(const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_h_n,
                     const std::optional<at::Tensor>& grad_c_n, const at::Tensor& h0,
                     const at::Tensor& c0, const at::Tensor& y, const at::Tensor& saved,
                     const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
                     const std::optional<at::Tensor>& lengths) {
  return backward("prnn::lstm_backward", PRNN_CELL_LSTM, grad_y, grad_h_n, grad_c_n, h0, c0, y,
                  saved, w_hh, w_hr, lengths);
}

template <GatedForwardFn forward>
std::tuple<at::Tensor, at::Tensor, at::Tensor> gru_kernel(const at::Tensor& xp,
                                                          const std::optional<at::Tensor>& b_hh,
                                                          const at::Tensor& h0,
                                                          const at::Tensor& w_hh,
                                                          const std::optional<at::Tensor>& lengths,
                                                          bool save) {
  auto [y, h_n, c_n, saved] = forward("prnn::gru", PRNN_CELL_GRU, xp, b_hh, h0, at::Tensor(), w_hh,
                                      std::nullopt, lengths, save);
  return {y, h_n, saved};
}

template <GatedBackwardFn backward>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_backward_kernel(
    const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_h_n, const at::Tensor& h0,
    const at::Tensor& y, const at::Tensor& saved, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths) {
  auto [grad_xp, grad_h0, grad_c0, grad_w_hh, grad_b_hh, grad_w_hr] =
      backward("prnn::gru_backward", PRNN_CELL_GRU, grad_y, grad_h_n, std::nullopt, h0,
               at::Tensor(), y, saved, w_hh, std::nullopt, lengths);
  return {grad_xp, grad_h0, grad_w_hh, grad_b_hh};
}

// The gated ops through the dispatcher (below whatever key the caller excluded).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_lstm(
    const at::Tensor& xp, const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
    const at::Tensor& c0, const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
    const std::optional<at::Tensor>& lengths, bool save);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
call_lstm_backward(const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_h_n,
                   const std::optional<at::Tensor>& grad_c_n, const at::Tensor& h0,
                   const at::Tensor& c0, const at::Tensor& y, const at::Tensor& saved,
                   const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
                   const std::optional<at::Tensor>& lengths);
std::tuple<at::Tensor, at::Tensor, at::Tensor> call_gru(const at::Tensor& xp,
                                                        const std::optional<at::Tensor>& b_hh,
                                                        const at::Tensor& h0, const at::Tensor& w_hh,
                                                        const std::optional<at::Tensor>& lengths,
                                                        bool save);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_gru_backward(
    const at::Tensor& grad_y, const std::optional<at::Tensor>& grad_h_n, const at::Tensor& h0,
    const at::Tensor& y, const at::Tensor& saved, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths);

// What the autograd kernels decide on (prnn_autograd.cpp), and prnn::layers
// with them: whether a call records a graph (grad mode on and some defined
// input requiring grad), and whether a defined input has a forward-mode tangent.
bool records_graph(c10::ArrayRef<const at::Tensor*> inputs);
bool has_forward_tangent(c10::ArrayRef<const at::Tensor*> inputs);

// prnn::gated_layer's own checks (mode, c0 for an LSTM only, the GEMM's
// operands); returns whether it is an LSTM.
bool check_gated_layer(const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
                       const std::optional<at::Tensor>& b_hh, const std::optional<at::Tensor>& c0,
                       c10::string_view mode);

// prnn::gated_layer: a gated layer's forward with its input projection, for
// calls that need no gradient. gated_layer_forward is every device's: the
// checks, then gated_layer_ops, the GEMM and prnn::lstm or prnn::gru (c_n a
// [0] tensor for a GRU); call_gated_layer goes through the dispatcher.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_layer_ops(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& w_hh, bool lstm);
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_layer_forward(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& w_hh, c10::string_view mode);
std::tuple<at::Tensor, at::Tensor, at::Tensor> call_gated_layer(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& w_hh, c10::string_view mode);

// prnn::layer's input projection, checked: xp = x w_ih^T + b_ih + b_hh,
// [T,B,H] from x [T,B,I], in one GEMM.
at::Tensor input_projection(const at::Tensor& x, const at::Tensor& w_ih,
                            const std::optional<at::Tensor>& b_ih,
                            const std::optional<at::Tensor>& b_hh);

// prnn::layer's checks of x, w_ih and the biases (shapes, dtypes, devices);
// `op` and `rows` (w_ih's rows as the messages name them) for another op's.
void check_input_projection(const at::Tensor& x, const at::Tensor& w_ih,
                            const std::optional<at::Tensor>& b_ih,
                            const std::optional<at::Tensor>& b_hh, const char* op = "prnn::layer",
                            const char* rows = "hidden");

// All of prnn::layer's checks, with the messages of the projection's then
// prnn::forward's (as when it runs the two); the problem of its recurrence.
prnn_problem_t check_layer(const at::Tensor& x, const at::Tensor& w_ih,
                           const std::optional<at::Tensor>& b_ih,
                           const std::optional<at::Tensor>& b_hh, const at::Tensor& h0,
                           const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                           c10::string_view nonlinearity);

// prnn::layer through the dispatcher (below whatever key the caller excluded): (y, h_n).
std::tuple<at::Tensor, at::Tensor> call_layer(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity);

// prnn::layer below autograd, on every device (its CompositeExplicitAutograd
// kernel): the input projection, then prnn::forward. Returns (y, h_n).
std::tuple<at::Tensor, at::Tensor> layer_forward(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity);

// ---- The CPU impls' recurrences in ATen (prnn_cpu.cpp), float32 and float64 ----
// Arguments checked, no size zero; lengths host int64. The C reference
// (prnn_*_cpu of prnn.h) computes the same functions.

// True when PRNN_CPU_REFERENCE is set (and not "0"): the CPU impls then call
// the C reference instead, which the tests compare against.
bool use_cpu_reference();

// prnn::forward's (y, h_n) and prnn::backward's grad_xp.
std::tuple<at::Tensor, at::Tensor> forward_aten(const at::Tensor& xp, const at::Tensor& h0,
                                                const at::Tensor& w_hh,
                                                const std::optional<at::Tensor>& lengths,
                                                prnn_activation_t activation);
at::Tensor backward_data_aten(const at::Tensor& grad_y, const at::Tensor& y,
                              const at::Tensor& w_hh, const std::optional<at::Tensor>& lengths,
                              prnn_activation_t activation);

// A gated forward's pass into call's outputs (y, h_n, c_n, saved when save).
void gated_forward_aten(const prnn_problem_t& problem, const GatedForwardCall& call,
                        const std::optional<at::Tensor>& lengths, bool save);
// A gated backward's pass into call's outputs (grad_xp, grad_hh, grad_h,
// grad_h0, grad_c0); lengths32 is lengths as host int32.
void gated_backward_aten(const prnn_problem_t& problem, const GatedBackwardCall& call,
                         const at::Tensor& lengths32, const std::optional<at::Tensor>& lengths);

// t [T,B,N] as rows [T*B,N] (a view when t allows it), in symbolic sizes:
// under torch.compile(dynamic=True) this runs on fake tensors, and reading a
// size as an int would specialise the graph to it.
at::Tensor as_rows(const at::Tensor& t);

#ifdef WITH_CUDA
// prnn_plan_cuda for `device` (the current CUDA device when it has no index).
prnn_status_t plan_cuda(const prnn_problem_t& problem, prnn_pass_t pass, c10::Device device,
                        prnn_plan_t* plan);
// prnn_plan_layer_cuda for `device`, likewise.
prnn_status_t plan_layer_cuda(const prnn_problem_t& problem, int64_t input, c10::Device device,
                              prnn_plan_t* plan);
#endif

}  // namespace torch_prnn
