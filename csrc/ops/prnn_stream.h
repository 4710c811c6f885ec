// prnn_stream.h - what the host side of a stream (prnn_stream.cpp, every
// build) and its device side (prnn_stream_cuda.cpp, CUDA builds) share: the
// stream's shape, its host-mapped buffers, and the running kernel.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "../kernels/prnn.h"

struct _object;  // PyObject, without Python.h

namespace torch_prnn {

// Adds _C's functions of the stream's hot path to `module` (PyInit__C); -1
// with a Python error set on failure.
int add_stream_functions(_object* module);

// What a stream runs.
struct StreamShape {
  prnn_cell_t cell;
  prnn_activation_t activation;
  prnn_dtype_t dtype;
  at::ScalarType scalar_type;
  int64_t layers, batch, input, hidden;
};

// The memory both ends of a stream read and write (prnn.h's resident args):
// one piece of a pinned (host-mapped) allocation for a kernel to reach it,
// cut into 128-byte-aligned pieces.
struct StreamBuffers {
  at::Tensor storage;                  // bytes on the CPU (a view of the allocation), the pieces below point into it
  prnn_resident_mailbox_t* mailbox;
  uint64_t* x_words;                   // x_t's tagged words (prnn.h: prnn_resident_x_words of them)
  void* y;                             // batch x hidden, the stream's dtype
  float* h;                            // layers x batch x hidden
  float* c;                            // layers x batch x hidden (LSTM), else nullptr
  uint8_t* mask;                       // batch
};

// A running resident kernel: the device end of an open stream.
class ResidentKernel {
 public:
  virtual ~ResidentKernel() = default;
  // "" while the kernel runs; else why it does not (it ended, or the CUDA error).
  virtual std::string check_running() = 0;
  // Waits up to timeout_s for the kernel to end (after a STOP); true once it has.
  virtual bool wait_ended(double timeout_s) = 0;
  // CTAs it holds, one an SM.
  virtual int64_t ctas() const = 0;
};

#ifdef WITH_CUDA
// Held shared by a layer op from its plan to its launch, and alone by a
// stream from reading the count of held SMs to its launch: a plan never sees
// a count that changes before its launch is queued.
std::shared_mutex& resident_mutex();

// A layer op's shared hold on resident_mutex(), from its plan to its launch.
inline std::shared_lock<std::shared_mutex> plan_to_launch_lock() {
  return std::shared_lock<std::shared_mutex>(resident_mutex());
}

// Launches the resident kernel of `shape` on CUDA device `device` with
// `weights` ([w_ih, w_hh] or [w_ih, w_hh, b_ih, b_hh] a layer, on that
// device, of the stream's dtype), holding at most max_sms SMs (0: any), after
// the work queued on the current stream (which may still write the weights).
// The kernel reads the weights until it reports ready: `weights` is replaced
// by the tensors it reads, which the caller keeps until then. Raises (before
// launching) when the SMs that other open streams leave cannot hold it.
// plan: [grid, block, units_per_cta, smem_bytes].
std::unique_ptr<ResidentKernel> launch_resident(const StreamShape& shape, const StreamBuffers& buffers,
                                                std::vector<at::Tensor>& weights, bool bias, int64_t device,
                                                int64_t max_sms, std::vector<int64_t>* plan);
#endif

}  // namespace torch_prnn
