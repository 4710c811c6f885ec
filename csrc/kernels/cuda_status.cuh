/*
 * cuda_status.cuh - what every CUDA entry point's launcher reports alike: a
 * failed CUDA call as a status, a kernel the device refuses, and the
 * workspace given against its plan.
 */
#ifndef PRNN_CUDA_STATUS_CUH
#define PRNN_CUDA_STATUS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "prnn_internal.h"

namespace prnn {

/* PRNN_STATUS_CUDA_ERROR naming the call and the error. */
inline prnn_status_t cuda_fail(cudaError_t err, const char *what) {
  cudaGetLastError(); /* clear it, so it does not surface in an unrelated later call */
  return prnn_fail(PRNN_STATUS_CUDA_ERROR, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

/* Whether a failed query or attribute call on a kernel is the device refusing
 * it as configured (no code it runs, shared memory or a cluster size past the
 * part's): a planner may remember that its family does not run there. Any
 * other error (an earlier kernel's sticky fault, out of memory) is reported,
 * and remembering it would leave the family off for the rest of the process. */
inline bool kernel_refused(cudaError_t err) {
  return err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction ||
         err == cudaErrorUnsupportedPtxVersion || err == cudaErrorInvalidValue ||
         err == cudaErrorInvalidClusterSize || err == cudaErrorNotSupported;
}

/* A kernel as a planner first asks about it: whether the device runs code of
 * at least compute capability `min_version` (x10) for it (the PTX of older
 * architectures only traps), then its shared-memory limit set to `smem`. */
inline cudaError_t prepare_kernel(const void *fn, int min_version, int smem) {
  cudaFuncAttributes fa;
  cudaError_t err = cudaFuncGetAttributes(&fa, fn);
  if (err == cudaSuccess && (fa.binaryVersion < min_version || fa.ptxVersion < min_version))
    err = cudaErrorNoKernelImageForDevice;
  if (err == cudaSuccess) err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return err;
}

/* A planner's cache of what a kernel holds on a device (*known: 0 not asked
 * yet, -1 none), after the queries that found `count` ended in `err`: a
 * refusal (kernel_refused) is remembered as none, any other error returned
 * uncached. *out: the value remembered. */
inline prnn_status_t remember_capacity(int *known, cudaError_t err, int count, const char *what, int *out) {
  if (err != cudaSuccess && !kernel_refused(err)) return cuda_fail(err, what);
  if (err != cudaSuccess) (void)cudaGetLastError(); /* a refusal, not a sticky error: clear it */
  *out = err == cudaSuccess && count >= 1 ? count : -1;
  __atomic_store_n(known, *out, __ATOMIC_RELEASE);
  return PRNN_STATUS_SUCCESS;
}

/* Loads `kernels` now, each on the current device: under lazy loading (CUDA's
 * default) a kernel is loaded at its first launch, and loading waits for the
 * device to idle, which it never does beside a resident kernel. */
template <class... Kernels>
prnn_status_t load_kernels(Kernels... kernels) {
  const void *const list[] = {reinterpret_cast<const void *>(kernels)...};
  for (const void *kernel : list) {
    cudaFuncAttributes attributes;
    const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return cuda_fail(err, "cudaFuncGetAttributes (loading a kernel)");
  }
  return PRNN_STATUS_SUCCESS;
}

/* f(E()) for each element type E of the C API's dtypes, in order; the first
 * failure is returned. */
template <class F>
prnn_status_t for_each_element_type(F f) {
  prnn_status_t st = f(float());
  if (st == PRNN_STATUS_SUCCESS) st = f(double());
  if (st == PRNN_STATUS_SUCCESS) st = f(__half());
  if (st == PRNN_STATUS_SUCCESS) st = f(__nv_bfloat16());
  return st;
}

/* The persistent families' launch: the workspace zeroed on the stream (their
 * exchange words or flags start at zero), then one cooperative launch of
 * `kernel` with `args`; `what` names the kernel in an error. */
inline prnn_status_t launch_cooperative_zeroed(const void *kernel, int grid, int block, void **args, size_t smem,
                                               void *workspace, size_t workspace_bytes, cudaStream_t stream,
                                               const char *what) {
  cudaError_t err = cudaMemsetAsync(workspace, 0, workspace_bytes, stream);
  if (err != cudaSuccess) return cuda_fail(err, "cudaMemsetAsync");
  err = cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(block), args, smem, stream);
  if (err != cudaSuccess) return cuda_fail(err, what);
  return PRNN_STATUS_SUCCESS;
}

/* The workspace must hold `needed` bytes and, when any is needed, be aligned
 * to PRNN_WORKSPACE_ALIGNMENT (the kernels read it 16 bytes at a time). */
inline prnn_status_t check_workspace(const void *workspace, size_t given, size_t needed) {
  if (given < needed || (workspace == NULL && needed > 0))
    return prnn_fail(PRNN_STATUS_WORKSPACE_TOO_SMALL, "workspace of %zu bytes at %p given, %zu bytes needed",
                     given, workspace, needed);
  if (needed > 0 && (uintptr_t)workspace % PRNN_WORKSPACE_ALIGNMENT != 0)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "workspace must be aligned to %d bytes, got %p",
                     PRNN_WORKSPACE_ALIGNMENT, workspace);
  return PRNN_STATUS_SUCCESS;
}

}  // namespace prnn

#endif /* PRNN_CUDA_STATUS_CUH */
