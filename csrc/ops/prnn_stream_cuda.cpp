// prnn_stream_cuda.cpp - the device side of a stream (built only with CUDA):
// checks the weights, counts the SMs that resident kernels hold on each
// device (prnn_resident_hold_sms), launches one on a CUDA stream of its own
// and watches it.
//
// The count is what makes opening safe: a cooperative launch that cannot get
// all its SMs waits for them, and SMs held by another resident kernel never
// free, so a stream that would not fit beside the open ones is refused before
// it launches; and while any are held, the layers' planners choose tiers of
// plain launches, for which one SM always stays free (their blocks need not
// fit beside a resident CTA).
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <shared_mutex>
#include <thread>

#include "prnn_ops.h"
#include "prnn_stream.h"

namespace torch_prnn {
namespace {

void release_sms(int64_t device, int64_t ctas) {
  const std::unique_lock<std::shared_mutex> lock(resident_mutex());
  prnn_resident_hold_sms((int)device, -ctas);  // cannot fail: the count holds at least this kernel's
}

void cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clear it, so it does not surface in an unrelated later call
  TORCH_CHECK(false, "Stream: ", what, ": ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
}

class CudaResidentKernel final : public ResidentKernel {
 public:
  CudaResidentKernel(int64_t device, int64_t ctas, cudaStream_t stream, at::Tensor workspace)
      : device_(device), ctas_(ctas), stream_(stream), workspace_(std::move(workspace)) {}

  // Only a kernel that ended is destroyed: a stream abandons one that did not.
  ~CudaResidentKernel() override {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device_) cudaSetDevice((int)device_);
    cudaStreamDestroy(stream_);  // errors ignored: this may run as the process exits
    if (current >= 0 && current != device_) cudaSetDevice(current);
    release_sms(device_, ctas_);
  }

  std::string check_running() override {
    if (!ended_) {
      const c10::cuda::CUDAGuard guard((c10::DeviceIndex)device_);
      const cudaError_t err = cudaStreamQuery(stream_);
      if (err == cudaErrorNotReady) return "";
      ended_ = true;
      if (err == cudaSuccess) {
        reason_ = "the resident kernel ended";
      } else {
        cudaGetLastError();
        reason_ = std::string("the resident kernel failed: ") + cudaGetErrorString(err) + " (" +
                  cudaGetErrorName(err) + ")";
      }
    }
    return reason_;
  }

  bool wait_ended(double timeout_s) override {
    const auto start = std::chrono::steady_clock::now();
    while (check_running().empty()) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return true;
  }

  int64_t ctas() const override { return ctas_; }

 private:
  const int64_t device_, ctas_;
  const cudaStream_t stream_;
  const at::Tensor workspace_;  // what the kernel uses until it ends
  bool ended_ = false;
  std::string reason_;
};

int gates_of(prnn_cell_t cell) {
  return cell == PRNN_CELL_LSTM ? PRNN_LSTM_GATES : cell == PRNN_CELL_GRU ? PRNN_GRU_GATES : 1;
}

// Checks a layer's weight against its expected shape; returns it with a unit last stride.
at::Tensor checked_weight(const at::Tensor& t, const char* name, int64_t layer, at::IntArrayRef shape,
                          const StreamShape& s, int64_t device) {
  TORCH_CHECK_VALUE(t.defined(), "Stream: ", name, "_l", layer, " must be a tensor, got None");
  TORCH_CHECK_VALUE(t.sizes() == shape, "Stream: ", name, "_l", layer, " must have shape ", shape, ", got ", t.sizes());
  TORCH_CHECK_VALUE(t.scalar_type() == s.scalar_type, "Stream: ", name, "_l", layer, " must have dtype ",
                    s.scalar_type, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device().is_cuda() && t.device().index() == device, "Stream: ", name, "_l", layer,
                    " must be on cuda:", device, ", got ", t.device());
  return t.dim() == 1 ? t.contiguous() : unit_last_stride(t);
}

}  // namespace

std::shared_mutex& resident_mutex() {
  // Never freed: a stream may be destroyed as the process exits, after static destructors.
  static std::shared_mutex* mutex = new std::shared_mutex();
  return *mutex;
}

std::unique_ptr<ResidentKernel> launch_resident(const StreamShape& s, const StreamBuffers& buffers,
                                                std::vector<at::Tensor>& weights, bool bias, int64_t device,
                                                int64_t max_sms, std::vector<int64_t>* plan_out) {
  TORCH_CHECK_VALUE(device >= 0 && device < c10::cuda::device_count(), "Stream: there is no CUDA device ", device);
  const c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
  const int64_t per_layer = bias ? 4 : 2, G = gates_of(s.cell);
  TORCH_CHECK_VALUE((int64_t)weights.size() == s.layers * per_layer, "Stream: expected ", s.layers * per_layer,
                    " weights (", per_layer, " a layer), got ", weights.size());
  prnn_resident_args_t args{};
  for (int64_t l = 0; l < s.layers; ++l) {
    at::Tensor* w = &weights[l * per_layer];
    const int64_t width = l == 0 ? s.input : s.hidden;
    w[0] = checked_weight(w[0], "weight_ih", l, {G * s.hidden, width}, s, device);
    w[1] = checked_weight(w[1], "weight_hh", l, {G * s.hidden, s.hidden}, s, device);
    args.layer[l].w_ih = w[0].const_data_ptr();
    args.layer[l].w_ih_stride = w[0].stride(0);
    args.layer[l].w_hh = w[1].const_data_ptr();
    args.layer[l].w_hh_stride = w[1].stride(0);
    if (bias) {
      w[2] = checked_weight(w[2], "bias_ih", l, {G * s.hidden}, s, device);
      w[3] = checked_weight(w[3], "bias_hh", l, {G * s.hidden}, s, device);
      args.layer[l].b_ih = w[2].const_data_ptr();
      args.layer[l].b_hh = w[3].const_data_ptr();
    }
  }

  // The host-mapped buffers at the addresses the device uses (from the base of the allocation they are cut from).
  const char* host_base = static_cast<const char*>(buffers.storage.storage().data());
  void* device_base = nullptr;
  cuda_check(cudaHostGetDevicePointer(&device_base, const_cast<char*>(host_base), 0),
             "cudaHostGetDevicePointer (the stream's pinned buffers must be host-mapped)");
  auto on_device = [&](const void* host) -> void* {
    return host == nullptr ? nullptr : static_cast<char*>(device_base) + (static_cast<const char*>(host) - host_base);
  };
  args.mailbox = static_cast<prnn_resident_mailbox_t*>(on_device(buffers.mailbox));
  args.x_words = static_cast<const uint64_t*>(on_device(buffers.x_words));
  args.y = on_device(buffers.y);
  args.h = static_cast<float*>(on_device(buffers.h));
  args.c = static_cast<float*>(on_device(buffers.c));
  args.mask = static_cast<const uint8_t*>(on_device(buffers.mask));

  int sms = 0;
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, (int)device), "cudaDeviceGetAttribute");
  prnn_resident_problem_t problem{s.cell, s.activation, s.dtype, s.layers, s.batch, s.input, s.hidden, 0};
  prnn_resident_plan_t plan{};
  std::unique_lock<std::shared_mutex> lock(resident_mutex());  // until the launch is queued
  {
    const int64_t held = prnn_resident_held_sms((int)device), free_sms = sms - 1 - held;
    const int64_t allowed = max_sms > 0 ? std::min<int64_t>(max_sms, sms - 1) : sms - 1;
    TORCH_CHECK(free_sms >= 1, "Stream: ", held, " of the ", sms, " SMs of cuda:", device,
                " are held by open streams and one stays free for other work; close one to open another");
    problem.max_ctas = std::min(allowed, free_sms);
    const prnn_status_t status = prnn_resident_plan_cuda(&problem, (int)device, &plan);
    if (status == PRNN_STATUS_NOT_SUPPORTED && held > 0) {
      // Refused for want of SMs the open streams hold, or on any device?
      const std::string detail = prnn_last_error();
      prnn_resident_problem_t idle = problem;
      idle.max_ctas = allowed;
      prnn_resident_plan_t idle_plan{};
      TORCH_CHECK(prnn_resident_plan_cuda(&idle, (int)device, &idle_plan) != PRNN_STATUS_SUCCESS, "Stream: cuda:",
                  device, " cannot hold this stream beside the open ones, which hold ", held, " of its ", sms,
                  " SMs (", detail, "); close a stream first");
    }
    TORCH_CHECK_NOT_IMPLEMENTED(status != PRNN_STATUS_NOT_SUPPORTED || held > 0, "Stream: ",
                                prnn_status_string(status), ": ", prnn_last_error(), " (one of cuda:", device,
                                "'s SMs stays free for other work)");
    check_status("Stream", status);
    check_status("Stream", prnn_resident_hold_sms((int)device, plan.grid));
  }

  cudaStream_t stream = nullptr;
  at::Tensor workspace;
  std::unique_ptr<ResidentKernel> kernel;
  try {
    workspace = at::empty({(int64_t)plan.workspace_bytes},
                                     at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
    int least = 0, greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    // Non-blocking: work on the legacy default stream must not wait for a kernel that never ends.
    cuda_check(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
    // Made before the launch, so that nothing that may throw comes after it; owns the stream and the SMs from here.
    *plan_out = {plan.grid, plan.block, plan.units_per_cta, plan.smem_bytes};
    kernel = std::make_unique<CudaResidentKernel>(device, plan.grid, stream, workspace);
    // After what the current stream has queued: it may still be writing the weights, or using the workspace's block.
    cudaEvent_t queued = nullptr;
    cuda_check(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cudaError_t err = cudaEventRecord(queued, c10::cuda::getCurrentCUDAStream(device).stream());
    if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, queued, 0);
    cudaEventDestroy(queued);
    cuda_check(err, "cudaEventRecord / cudaStreamWaitEvent");
    check_status("Stream", prnn_resident_launch_cuda(&problem, &args, workspace.mutable_data_ptr(),
                                                     plan.workspace_bytes, static_cast<prnn_stream_t>(stream)));
    return kernel;
  } catch (...) {
    lock.unlock();  // release_sms takes it
    // Nothing was launched. The stream may still run the workspace's memset:
    // done before the workspace returns to the allocator.
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (kernel == nullptr) {
      if (stream != nullptr) cudaStreamDestroy(stream);
      release_sms(device, plan.grid);
    }
    throw;  // the kernel object, where made, destroys the stream and releases the SMs
  }
}

}  // namespace torch_prnn
