/*
 * cuda_api.cu - the CUDA half of prnn.h: what planning knows of each device
 * (device_info.cuh), the Elman planner (an ordered list of kernel families,
 * each of which plans and launches in the file of its kernels:
 * elman_family.cuh), and the entry points: plan queries, forward and
 * backward-data.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_status.cuh"
#include "elman_family.cuh"
#include "few_steps.cuh"
#include "gated.cuh"
#include "prnn_internal.h"

using namespace prnn;

namespace {

/* Filled once per device: the fields first, then `ready` with a release store
 * (read with acquire), so a reader that sees ready sees the fields; a racing
 * fill writes the same values. g_elman_devices alike, by knobs_ready. */
DeviceInfo g_devices[kMaxDevices];
ElmanDevice g_elman_devices[kMaxDevices];

/* PRNN_FUSED_PROJECTION (read when the Elman planner first plans on a
 * device): "0" never fuses a layer's input projection into the recurrence's
 * launch, "1" fuses it wherever a kernel can, even where the producers would
 * not keep ahead (to measure that); unset or anything else, the planner's rule. */
int fused_projection_override() {
  const char *v = getenv("PRNN_FUSED_PROJECTION");
  if (v == NULL) return 0;
  return strcmp(v, "0") == 0 ? -1 : strcmp(v, "1") == 0 ? 1 : 0;
}

}  // namespace

prnn_status_t prnn::load_plain_kernels() {
  prnn_status_t st = load_stepwise_kernels();
  if (st == PRNN_STATUS_SUCCESS) st = load_gated_stepwise_kernels();
  if (st == PRNN_STATUS_SUCCESS) st = load_few_steps_kernels();
  return st;
}

/* Every planner's (device_info.cuh). */
prnn_status_t prnn::device_info(int device, DeviceInfo *info) {
  if (device < 0 || device >= kMaxDevices)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "device %d out of range [0, %d)", device, kMaxDevices);
  DeviceInfo *d = &g_devices[device];
  if (!__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE)) {
    DeviceInfo fresh;
    cudaError_t err = cudaDeviceGetAttribute(&fresh.sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&fresh.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&fresh.cooperative, cudaDevAttrCooperativeLaunch, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&fresh.cluster_launch, cudaDevAttrClusterLaunch, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&fresh.major, cudaDevAttrComputeCapabilityMajor, device);
    if (err != cudaSuccess) return cuda_fail(err, "cudaDeviceGetAttribute");
    d->sms = fresh.sms;
    d->smem_optin = fresh.smem_optin;
    d->cooperative = fresh.cooperative;
    d->cluster_launch = fresh.cluster_launch;
    d->major = fresh.major;
    __atomic_store_n(&d->ready, 1, __ATOMIC_RELEASE);
  }
  *info = *d;
  info->resident_sms = prnn_resident_held_sms(device);
  return PRNN_STATUS_SUCCESS;
}

namespace {

/* The device with the Elman planner's knobs, read at its first plan there
 * (the gated planner reads its own at each plan). */
prnn_status_t elman_device(int device, ElmanDevice *info) {
  DeviceInfo attributes;
  const prnn_status_t st = device_info(device, &attributes); /* checks the index too */
  if (st != PRNN_STATUS_SUCCESS) return st;
  ElmanDevice *d = &g_elman_devices[device];
  if (!__atomic_load_n(&d->knobs_ready, __ATOMIC_ACQUIRE)) {
    static_cast<DeviceInfo &>(*d) = attributes;
    d->cluster = attributes.cluster_launch && !prnn_cluster_tier_disabled();
    d->fuse_projection = fused_projection_override();
    __atomic_store_n(&d->knobs_ready, 1, __ATOMIC_RELEASE);
  }
  *info = *d;
  info->resident_sms = attributes.resident_sms;
  return PRNN_STATUS_SUCCESS;
}

/* The Elman families, asked in this order; the first that takes a problem
 * runs it. One cluster holding all of A (tensor cores in 16 bits, FFMA in
 * float32; sm_90+), then several clusters at once (H past one cluster,
 * B >= 5, sm_90), then the grid tier (every SM, A in registers, then in
 * registers and shared memory), then one launch per step. */
const ElmanFamily *const kElmanFamilies[] = {&cluster_family, &cluster_ffma_family, &cluster_grid_family,
                                             &persistent_family, &stepwise_family};

/* How a problem runs on `device`: the recurrence alone (input = 0), or the
 * whole layer with its input projection fused (input > 0; only the families
 * that fuse it are asked). */
prnn_status_t plan(const prnn_problem_t *pb, int64_t input, int device, ElmanPlan *out) {
  memset(out, 0, sizeof *out);
  prnn_status_t st = prnn_check_problem(pb);
  if (st != PRNN_STATUS_SUCCESS) return st;
  /* Before any cache: the plan cache keys hold hidden in 32 bits. */
  if (pb->steps > 0x7fffffff || pb->batch > 0x7fffffff || pb->hidden > 0x7fffffff)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "steps, batch and hidden must be < 2^31, got steps=%lld batch=%lld hidden=%lld",
                     (long long)pb->steps, (long long)pb->batch, (long long)pb->hidden);
  ElmanRequest request = {pb, input, device, {}};
  st = elman_device(device, &request.dev);
  if (st != PRNN_STATUS_SUCCESS) return st;
  bool taken = false;
  st = ask_families(kElmanFamilies, request,
                    [input](const ElmanFamily &family) { return input == 0 || family.fuses_projection; }, out, &taken);
  if (st != PRNN_STATUS_SUCCESS || taken) return st;
  if (input > 0)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "no kernel fuses the input projection of this layer on this device (dtype %d, batch %lld, "
                     "hidden %lld, input %lld)",
                     (int)pb->dtype, (long long)pb->batch, (long long)pb->hidden, (long long)input);
  return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "no kernel runs this problem"); /* the stepwise tier takes or fails */
}

/* Shared by both passes: plan, check the workspace, launch the chosen family's
 * kernel; then, with h_n (a layer's forward), its final state. */
prnn_status_t run(const prnn_problem_t *pb, const RecurrenceParams &params, const InputProjection &proj,
                  void *h_n, void *workspace, size_t workspace_bytes, cudaStream_t stream) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_fail(err, "cudaGetDevice");
  ElmanPlan pl;
  prnn_status_t st = plan(pb, proj.input, device, &pl);
  if (st != PRNN_STATUS_SUCCESS) return st;
  st = check_workspace(workspace, workspace_bytes, pl.summary.workspace_bytes);
  if (st != PRNN_STATUS_SUCCESS) return st;
  st = pl.family->launch(pl, pb, params, proj, workspace, stream);
  if (st != PRNN_STATUS_SUCCESS || h_n == NULL) return st;
  return launch_final_state(pb, params, h_n, stream);
}

/* The fields both passes fill alike. */
RecurrenceParams params_of(const prnn_problem_t *pb, int backward, const void *w_hh, int64_t w_hh_stride,
                           const int32_t *lengths, void *out) {
  RecurrenceParams p;
  memset(&p, 0, sizeof p);
  p.steps = (int)pb->steps;
  p.batch = (int)pb->batch;
  p.hidden = (int)pb->hidden;
  p.backward = backward;
  p.activation = pb->activation;
  p.a = w_hh;
  p.a_stride_row = backward ? 1 : w_hh_stride; /* backward: A = W_hh^T, A[i][k] = W_hh[k][i] */
  p.a_stride_col = backward ? w_hh_stride : 1;
  p.lengths = pb->has_lengths ? lengths : NULL;
  p.out = out;
  return p;
}

/* Whether the few-steps kernel runs this checked layer (input > 0) on
 * `device`: it comes before every family; PRNN_FUSED_PROJECTION=0 forbids it
 * with the other fused projections. */
prnn_status_t few_steps_on(const prnn_problem_t *pb, int64_t input, int device, bool *takes) {
  *takes = false;
  ElmanDevice dev;
  const prnn_status_t st = elman_device(device, &dev);
  if (st != PRNN_STATUS_SUCCESS) return st;
  *takes = dev.fuse_projection >= 0 && few_steps_takes(pb, input, dev.resident_sms > 0);
  return PRNN_STATUS_SUCCESS;
}

/* Both plan queries: plan on `device` (the gated cells' families plan per pass). */
prnn_status_t plan_on(const prnn_problem_t *problem, prnn_pass_t pass, int64_t input, int device, prnn_plan_t *out) {
  /* Planning sets kernel attributes, which apply to the current device: make
   * `device` current for it, and restore the caller's. */
  int current = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess) return cuda_fail(err, "cudaGetDevice");
  if (device != current && (err = cudaSetDevice(device)) != cudaSuccess) {
    cudaGetLastError(); /* not sticky: clear it */
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "device %d: %s", device, cudaGetErrorString(err));
  }
  prnn_status_t st = prnn_check_problem(problem);
  bool few_steps = false;
  if (st == PRNN_STATUS_SUCCESS && input > 0) st = few_steps_on(problem, input, device, &few_steps);
  if (st == PRNN_STATUS_SUCCESS) {
    if (few_steps) {
      memset(out, 0, sizeof *out);
      few_steps_plan(problem, out);
    } else if (problem->cell == PRNN_CELL_ELMAN) {
      ElmanPlan elman;
      st = plan(problem, input, device, &elman);
      *out = elman.summary;
    } else if (input > 0) {
      st = prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "no kernel fuses the input projection of this gated layer (the "
                     "few-steps kernel takes one step of at most 16 sequences, without lengths or proj_size)");
    } else {
      st = gated_plan(problem, pass, device, out);
    }
  }
  if (st == PRNN_STATUS_NOT_SUPPORTED) out->tier = PRNN_TIER_NONE;
  if (device != current && (err = cudaSetDevice(current)) != cudaSuccess && st == PRNN_STATUS_SUCCESS)
    st = cuda_fail(err, "cudaSetDevice");
  return st;
}

}  // namespace

extern "C" {

prnn_status_t prnn_plan_cuda(const prnn_problem_t *problem, prnn_pass_t pass, int device, prnn_plan_t *out) {
  prnn_clear_error();
  if (problem == NULL || out == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "problem and plan must not be NULL");
  if (pass != PRNN_PASS_FORWARD && pass != PRNN_PASS_BACKWARD_DATA)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "pass must be PRNN_PASS_FORWARD or PRNN_PASS_BACKWARD_DATA, got %d",
                     (int)pass);
  return plan_on(problem, pass, 0, device, out);
}

prnn_status_t prnn_plan_layer_cuda(const prnn_problem_t *problem, int64_t input, int device, prnn_plan_t *out) {
  prnn_clear_error();
  if (problem == NULL || out == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "problem and plan must not be NULL");
  if (input < 1) return prnn_fail(PRNN_STATUS_BAD_PARAM, "input must be >= 1, got %lld", (long long)input);
  return plan_on(problem, PRNN_PASS_FORWARD, input, device, out);
}

prnn_status_t prnn_forward_cuda(const prnn_problem_t *problem, const prnn_forward_args_t *args,
                                void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  const prnn_status_t st = prnn_check_forward_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  RecurrenceParams p = params_of(problem, 0, args->w_hh, args->w_hh_stride, args->lengths, args->y);
  p.in = args->xp;
  p.in_stride_t = args->xp_stride_t;
  p.in_stride_b = args->xp_stride_b;
  p.h0 = args->h0;
  p.h0_stride_b = args->h0_stride_b;
  return run(problem, p, InputProjection{}, NULL, workspace, workspace_bytes, (cudaStream_t)stream);
}

prnn_status_t prnn_layer_forward_cuda(const prnn_problem_t *problem, const prnn_layer_args_t *args,
                                      void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  prnn_status_t st = prnn_check_layer_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  if (args->input > 0x7fffffff)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "input must be < 2^31, got %lld", (long long)args->input);
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_fail(err, "cudaGetDevice");
  bool few_steps = false;
  st = few_steps_on(problem, args->input, device, &few_steps);
  if (st != PRNN_STATUS_SUCCESS) return st;
  if (few_steps) return few_steps_layer(problem, *args, (cudaStream_t)stream); /* no workspace */
  if (problem->cell != PRNN_CELL_ELMAN)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "no kernel fuses the input projection of this gated layer");
  RecurrenceParams p = params_of(problem, 0, args->w_hh, args->w_hh_stride, args->lengths, args->y);
  p.h0 = args->h0;
  p.h0_stride_b = args->h0_stride_b;
  InputProjection proj = {};
  proj.input = (int)args->input;
  proj.x = args->x;
  proj.x_stride_t = args->x_stride_t;
  proj.x_stride_b = args->x_stride_b;
  proj.w = args->w_ih;
  proj.w_stride = args->w_ih_stride;
  proj.b_ih = args->b_ih;
  proj.b_hh = args->b_hh;
  return run(problem, p, proj, args->h_n, workspace, workspace_bytes, (cudaStream_t)stream);
}

prnn_status_t prnn_backward_data_cuda(const prnn_problem_t *problem, const prnn_backward_args_t *args,
                                      void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  const prnn_status_t st = prnn_check_backward_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  RecurrenceParams p = params_of(problem, 1, args->w_hh, args->w_hh_stride, args->lengths, args->grad_xp);
  p.in = args->grad_y;
  p.in_stride_t = args->grad_y_stride_t;
  p.in_stride_b = args->grad_y_stride_b;
  p.y = args->y;
  return run(problem, p, InputProjection{}, NULL, workspace, workspace_bytes, (cudaStream_t)stream);
}

}  // extern "C"
