// prnn_ops_cuda.cpp - the CUDA impls of the prnn:: ops (built only with
// CUDA). Like the CPU impls, but under a device guard, on
// PyTorch's current stream, with lengths copied to the device.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "prnn_ops.h"
#include "prnn_stream.h"

namespace torch_prnn {
namespace {

prnn_stream_t current_stream() {
  return static_cast<prnn_stream_t>(c10::cuda::getCurrentCUDAStream().stream());
}

// The kernels read lengths from device memory: a copy on x's device, queued
// on the stream from pinned memory (a blocking copy from pageable memory
// would wait for every kernel queued before it). Not under CUDA graph
// capture: a replay would copy again from a host buffer reused by then.
at::Tensor on_device(const char* op, const at::Tensor& host_lengths32, const at::Tensor& x) {
  if (!host_lengths32.defined()) return host_lengths32;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(x.get_device()).stream(), &capture));
  TORCH_CHECK(capture == cudaStreamCaptureStatusNone, op,
              ": lengths (packed input) cannot be captured in a CUDA graph: they are host data, which a "
              "replay would not read again; capture padded input");
  return to_device_async(host_lengths32, x.device());
}

std::tuple<at::Tensor, at::Tensor> forward_cuda(const at::Tensor& xp, const at::Tensor& h0,
                                                const at::Tensor& w_hh,
                                                const std::optional<at::Tensor>& lengths,
                                                c10::string_view nonlinearity) {
  const char* op = "prnn::forward";
  const prnn_problem_t problem = check_forward(xp, h0, w_hh, lengths, nonlinearity);
  // After the checks every tensor is on xp's device: a CPU xp would have
  // failed them (the call came here because some argument is on CUDA).
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem, xp.device());
  const c10::cuda::CUDAGuard guard(xp.device());
  at::Tensor y = at::empty({problem.steps, problem.batch, problem.hidden}, xp.options());
  const at::Tensor lengths32 = on_device(op, host_lengths32, xp);
  if (is_empty(problem)) return {y, final_state(y, h0, lengths)};

  const at::Tensor xp_ = unit_last_stride(xp), h0_ = unit_last_stride(h0),
                   w_hh_ = unit_last_stride(w_hh);
  const auto planned = plan_to_launch_lock();
  prnn_plan_t plan;
  check_status(op, prnn_plan_cuda(&problem, PRNN_PASS_FORWARD, xp.get_device(), &plan));
  at::Tensor ws = workspace(plan, xp);
  const prnn_forward_args_t args = forward_args(xp_, h0_, w_hh_, lengths32, y);
  check_status(op, prnn_forward_cuda(&problem, &args, workspace_ptr(ws), plan.workspace_bytes,
                                     current_stream()));
  return {y, final_state(y, h0, lengths)};
}

// The layer args' input projection: x [T,B,I] and w_ih with a unit last
// stride, the biases contiguous or undefined.
prnn_layer_args_t projection_args(const at::Tensor& x, const at::Tensor& w_ih, const at::Tensor& b_ih,
                                  const at::Tensor& b_hh) {
  prnn_layer_args_t args{};
  args.x = x.const_data_ptr();
  args.x_stride_t = x.stride(0);
  args.x_stride_b = x.stride(1);
  args.input = x.size(2);
  args.w_ih = w_ih.const_data_ptr();
  args.w_ih_stride = w_ih.stride(0);
  args.b_ih = b_ih.defined() ? b_ih.const_data_ptr() : nullptr;
  args.b_hh = b_hh.defined() ? b_hh.const_data_ptr() : nullptr;
  return args;
}

// prnn::layer in one launch where a kernel fuses the input projection (the
// C API's layer plan says so; a few steps, a launch a step), else the
// projection's GEMM and prnn::forward. The C API writes h_n too.
std::tuple<at::Tensor, at::Tensor> layer_cuda(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity) {
  const char* op = "prnn::layer";
  const prnn_problem_t problem = check_layer(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t input = x.size(2);
  auto planned = plan_to_launch_lock();
  prnn_plan_t plan;
  const prnn_status_t status = is_empty(problem) || input == 0
                                   ? PRNN_STATUS_NOT_SUPPORTED
                                   : prnn_plan_layer_cuda(&problem, input, x.get_device(), &plan);
  if (status == PRNN_STATUS_NOT_SUPPORTED) {
    planned.unlock();  // prnn::forward takes it
    return layer_forward(x, w_ih, b_ih, b_hh, h0, w_hh, lengths, nonlinearity);
  }
  check_status(op, status);

  const at::Tensor host_lengths32 = host_lengths("prnn::forward", lengths, problem, x.device());  // its messages
  at::Tensor y = at::empty({problem.steps, problem.batch, problem.hidden}, x.options());
  at::Tensor h_n = at::empty({problem.batch, problem.hidden}, x.options());  // written by the C API
  const at::Tensor lengths32 = on_device(op, host_lengths32, x);
  const at::Tensor x_ = unit_last_stride(x), w_ih_ = unit_last_stride(w_ih), h0_ = unit_last_stride(h0),
                   w_hh_ = unit_last_stride(w_hh);
  const at::Tensor b_ih_ = b_ih ? b_ih->contiguous() : at::Tensor(),
                   b_hh_ = b_hh ? b_hh->contiguous() : at::Tensor();
  at::Tensor ws = workspace(plan, x);
  prnn_layer_args_t args = projection_args(x_, w_ih_, b_ih_, b_hh_);
  set_recurrence_args(args, h0_, w_hh_, lengths32, y);
  args.h_n = h_n.mutable_data_ptr();
  check_status(op, prnn_layer_forward_cuda(&problem, &args, workspace_ptr(ws), plan.workspace_bytes,
                                           current_stream()));
  return {y, h_n};
}

// prnn::gated_layer on CUDA: the few-steps kernel where the C API's layer
// plan takes the call, else gated_layer_ops (the GEMM and prnn::lstm /
// prnn::gru), which also gives a malformed h0, c0 or w_hh its ops' own error.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_layer_cuda(
    const at::Tensor& x, const at::Tensor& w_ih, const std::optional<at::Tensor>& b_ih,
    const std::optional<at::Tensor>& b_hh, const at::Tensor& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& w_hh, c10::string_view mode) {
  const char* op = "prnn::gated_layer";
  const bool lstm = check_gated_layer(x, w_ih, b_ih, b_hh, c0, mode);  // x, w_ih and the biases
  const int64_t G = lstm ? PRNN_LSTM_GATES : PRNN_GRU_GATES;
  const int64_t T = x.size(0), B = x.size(1), I = x.size(2), H = w_ih.size(0) / G;
  const auto like_x = [&](const at::Tensor& t, int64_t rows, int64_t cols) {
    return t.dim() == 2 && t.size(0) == rows && t.size(1) == cols && t.device() == x.device() &&
           t.scalar_type() == x.scalar_type();
  };
  bool fits = T >= 1 && B >= 1 && I >= 1 && H >= 1 && w_ih.size(0) == G * H && like_x(h0, B, H) &&
              like_x(w_hh, G * H, H) && (!lstm || like_x(*c0, B, H));
  const prnn_problem_t problem{lstm ? PRNN_CELL_LSTM : PRNN_CELL_GRU, PRNN_ACT_TANH,
                               *to_prnn_dtype(x.scalar_type()), T, B, H, 0, 0};
  auto planned = plan_to_launch_lock();
  if (fits) {
    prnn_plan_t plan;
    const prnn_status_t status = plan_layer_cuda(problem, I, x.device(), &plan);
    if (status != PRNN_STATUS_NOT_SUPPORTED) check_status(op, status);
    fits = status == PRNN_STATUS_SUCCESS;
  }
  if (!fits) {
    planned.unlock();  // prnn::lstm and prnn::gru take it
    return gated_layer_ops(x, w_ih, b_ih, b_hh, h0, c0, w_hh, lstm);
  }

  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({T, B, H}, x.options()), h_n = at::empty({B, H}, x.options());
  at::Tensor c_n = lstm ? at::empty({B, H}, x.options()) : at::empty({0}, x.options());
  const at::Tensor x_ = unit_last_stride(x), w_ih_ = unit_last_stride(w_ih), h0_ = unit_last_stride(h0),
                   w_hh_ = unit_last_stride(w_hh), c0_ = lstm ? unit_last_stride(*c0) : at::Tensor();
  const at::Tensor b_ih_ = b_ih ? b_ih->contiguous() : at::Tensor(),
                   b_hh_ = b_hh ? b_hh->contiguous() : at::Tensor();
  prnn_layer_args_t args = projection_args(x_, w_ih_, b_ih_, b_hh_);
  args.h0 = h0_.const_data_ptr();
  args.h0_stride_b = h0_.stride(0);
  args.c0 = lstm ? c0_.const_data_ptr() : nullptr;
  args.c0_stride_b = lstm ? c0_.stride(0) : 0;
  args.w_hh = w_hh_.const_data_ptr();
  args.w_hh_stride = w_hh_.stride(0);
  args.y = y.mutable_data_ptr();
  args.h_n = h_n.mutable_data_ptr();
  args.c_n = lstm ? c_n.mutable_data_ptr() : nullptr;
  check_status(op, prnn_layer_forward_cuda(&problem, &args, nullptr, 0, current_stream()));
  return {y, h_n, c_n};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& grad_y, const at::Tensor& y, const at::Tensor& h0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& lengths, c10::string_view nonlinearity, bool h0_grad) {
  const char* op = "prnn::backward";
  const prnn_problem_t problem = check_backward(grad_y, y, h0, w_hh, lengths, nonlinearity);
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem, y.device());
  const c10::cuda::CUDAGuard guard(y.device());
  at::Tensor grad_xp = at::empty({problem.steps, problem.batch, problem.hidden}, y.options());
  const at::Tensor lengths32 = on_device(op, host_lengths32, y);
  if (!is_empty(problem)) {
    const at::Tensor grad_y_ = unit_last_stride_gradient(grad_y), y_ = y.contiguous(),
                     w_hh_ = unit_last_stride(w_hh);
    const auto planned = plan_to_launch_lock();
    prnn_plan_t plan;
    check_status(op, prnn_plan_cuda(&problem, PRNN_PASS_BACKWARD_DATA, y.get_device(), &plan));
    at::Tensor ws = workspace(plan, y);
    const prnn_backward_args_t args = backward_args(grad_y_, y_, w_hh_, lengths32, grad_xp);
    check_status(op, prnn_backward_data_cuda(&problem, &args, workspace_ptr(ws), plan.workspace_bytes,
                                             current_stream()));
  }
  return finish_backward(grad_xp, y, h0, w_hh, lengths, h0_grad);
}

// prnn::lstm and prnn::gru on CUDA, as gated_forward_cpu: (y, h_n, c_n, saved).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_forward_cuda(
    const char* op, prnn_cell_t cell, const at::Tensor& xp, const std::optional<at::Tensor>& b_hh,
    const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_hh,
    const std::optional<at::Tensor>& w_hr, const std::optional<at::Tensor>& lengths, bool save) {
  const prnn_problem_t problem = check_gated_forward(op, cell, xp, b_hh, h0, c0, w_hh, w_hr, lengths);
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem, xp.device());
  const c10::cuda::CUDAGuard guard(xp.device());
  const GatedForwardCall call = gated_forward_call(problem, xp, b_hh, h0, c0, w_hh, w_hr,
                                                   on_device(op, host_lengths32, xp), save);
  if (!is_empty(problem)) {
    const auto planned = plan_to_launch_lock();
    prnn_plan_t plan;
    check_status(op, prnn_plan_cuda(&problem, PRNN_PASS_FORWARD, xp.get_device(), &plan));
    at::Tensor ws = workspace(plan, xp);
    check_status(op, prnn_gated_forward_cuda(&problem, &call.args, workspace_ptr(ws),
                                             plan.workspace_bytes, current_stream()));
  }
  return {call.y, call.h_n, call.c_n, call.saved};
}

// prnn::lstm_backward and prnn::gru_backward on CUDA, as gated_backward_cpu.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_backward_cuda(
    const char* op, prnn_cell_t cell, const at::Tensor& grad_y,
    const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& y, const at::Tensor& saved,
    const at::Tensor& w_hh, const std::optional<at::Tensor>& w_hr,
    const std::optional<at::Tensor>& lengths) {
  const prnn_problem_t problem = check_gated_backward(op, cell, grad_y, grad_h_n, grad_c_n, h0, c0,
                                                      y, saved, w_hh, w_hr, lengths);
  const at::Tensor host_lengths32 = host_lengths(op, lengths, problem, y.device());
  const c10::cuda::CUDAGuard guard(y.device());
  const GatedBackwardCall call = gated_backward_call(problem, grad_y, grad_h_n, grad_c_n, h0, c0, y,
                                                     saved, w_hh, w_hr, on_device(op, host_lengths32, y));
  if (!is_empty(problem)) {
    const auto planned = plan_to_launch_lock();
    prnn_plan_t plan;
    check_status(op, prnn_plan_cuda(&problem, PRNN_PASS_BACKWARD_DATA, y.get_device(), &plan));
    at::Tensor ws = workspace(plan, y);
    check_status(op, prnn_gated_backward_data_cuda(&problem, &call.args, workspace_ptr(ws),
                                                   plan.workspace_bytes, current_stream()));
  }
  return finish_gated_backward(problem, call, lengths);
}

}  // namespace

prnn_status_t plan_cuda(const prnn_problem_t& problem, prnn_pass_t pass, c10::Device device,
                        prnn_plan_t* plan) {
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  return prnn_plan_cuda(&problem, pass, index, plan);
}

prnn_status_t plan_layer_cuda(const prnn_problem_t& problem, int64_t input, c10::Device device,
                              prnn_plan_t* plan) {
  const int index = device.has_index() ? device.index() : c10::cuda::current_device();
  return prnn_plan_layer_cuda(&problem, input, index, plan);
}

}  // namespace torch_prnn

TORCH_LIBRARY_IMPL(prnn, CUDA, m) {
  m.impl("forward", &torch_prnn::forward_cuda);
  m.impl("backward", &torch_prnn::backward_cuda);
  m.impl("layer", &torch_prnn::layer_cuda);
  m.impl("gated_layer", &torch_prnn::gated_layer_cuda);
  m.impl("lstm", &torch_prnn::lstm_kernel<torch_prnn::gated_forward_cuda>);
  m.impl("lstm_backward", &torch_prnn::lstm_backward_kernel<torch_prnn::gated_backward_cuda>);
  m.impl("gru", &torch_prnn::gru_kernel<torch_prnn::gated_forward_cuda>);
  m.impl("gru_backward", &torch_prnn::gru_backward_kernel<torch_prnn::gated_backward_cuda>);
}
