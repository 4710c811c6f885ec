/*
 * cluster_tier.cu - the planning and launch the cluster tier's two families
 * share (cluster_tier.cuh); host code only.
 */
#include "cluster_tier.cuh"
#include "cuda_status.cuh"
#include "dsmem.cuh"
#include "prnn_internal.h"

namespace prnn {

/* Its shared-memory limit is set to the device's whole opt-in limit, so that
 * a later, smaller problem never lowers it. */
prnn_status_t cluster_room(int *known, const void *fn, int ctas, int smem_bytes, const DeviceInfo &dev,
                           int *room) {
  *room = __atomic_load_n(known, __ATOMIC_ACQUIRE);
  if (*room != 0) return PRNN_STATUS_SUCCESS;
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.smem_optin);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return cuda_fail(err, "cudaFuncSetAttribute(cluster kernel)");
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(ctas, ctas, smem_bytes, 0, &attr); /* one cluster */
  int clusters = 0;
  err = cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg);
  if (err != cudaSuccess) return cuda_fail(err, "cudaOccupancyMaxActiveClusters");
  *room = clusters >= 1 ? clusters : -1;
  __atomic_store_n(known, *room, __ATOMIC_RELEASE);
  return PRNN_STATUS_SUCCESS;
}

namespace {

/* CTAs of a cluster for H rows, `rows` a CTA: at least two (compute-sanitizer
 * refuses st.async within a cluster of one CTA; the second one's rows are all
 * padding). */
int cluster_ctas(int64_t hidden, int rows) {
  const int64_t ctas = (hidden + rows - 1) / rows;
  return (int)(ctas < 2 ? 2 : ctas);
}

/* Whether `producer_ctas` CTAs computing the input projection keep ahead of
 * the recurrence: each does its share of a step's projection (batch x input x
 * hidden FMAs) at some multiple of the rate a stepping CTA does its rows x K
 * extent: about 1.6 in float32 (bench/NOTES.md step 31: at H = I = 1024,
 * B = 4, 48 producer CTAs with 1.33 of a stepper's work each finished alone
 * in 0.82 of the recurrence's time, and the fused launch took 0.88 of the
 * GEMM and recurrence's), so each may take up to 1.4 of a stepper's, which
 * leaves room for the first chunk and for the steppers' slowdown beside
 * them. The 16-bit producers multiply by mma and keep the same bound. */
bool projection_keeps_up(const prnn_problem_t *pb, int64_t input, int producer_ctas, const ClusterCandidate &cand) {
  const int64_t tile = kProjTile;
  const int64_t work = pb->batch * ((input + tile - 1) / tile * tile) * ((pb->hidden + tile - 1) / tile * tile);
  return 14 * producer_ctas * cand.rows * cand.k_extent >= 10 * work;
}

}  // namespace

/* A step costs less the fewer sequences a cluster carries (the tensor-core
 * kernel's exchange carries only those: bench/NOTES.md), so the batch is
 * spread over as many clusters as the device holds at once, up to one
 * sequence each; past that, groups of up to the kernel's maximum (8, or 1 on
 * the FFMA kernel) and clusters in turn: they are independent, so that is
 * safe, and in float32 it beat the grid tier at every batch measured
 * (bench/NOTES.md step 26). With input > 0 (the fused layer), one sequence a
 * cluster and the clusters the batch leaves free computing xp, where they
 * keep ahead; none otherwise. */
prnn_status_t plan_cluster_tier(const ElmanRequest &request, const ClusterCandidate &cand, ElmanPlan *plan,
                                bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const ElmanDevice &dev = request.dev;
  const int64_t input = request.input;
  const int ctas = cluster_ctas(pb->hidden, cand.rows);
  if (ctas > kClusterMaxCtas || cand.smem_bytes > dev.smem_optin) return PRNN_STATUS_SUCCESS;
  int room;
  const prnn_status_t st = cluster_room(&cand.room[ctas], cand.kernel, ctas, cand.smem_bytes, dev, &room);
  if (st != PRNN_STATUS_SUCCESS || room < 0) return st;
  int smem = cand.smem_bytes, producers = 0;
  if (input > 0) { /* then one sequence a cluster: the batch is below the room */
    smem = cand.smem_bytes > kProjSmemOffset + kProjSmemBytes ? cand.smem_bytes : kProjSmemOffset + kProjSmemBytes;
    /* an item's 32 columns hold at least one step of the batch */
    if (dev.fuse_projection < 0 || pb->batch > kProjTile || smem > dev.smem_optin)
      return PRNN_STATUS_SUCCESS;
    /* the fused launch's shared memory (the projection's staging) can hold fewer CTAs on an SM */
    const prnn_status_t fst = cluster_room(&cand.fused_room[ctas], cand.kernel, ctas, smem, dev, &room);
    if (fst != PRNN_STATUS_SUCCESS || pb->batch >= room) return fst;
    producers = room - (int)pb->batch;
    if (dev.fuse_projection == 0 && !projection_keeps_up(pb, input, producers * ctas, cand))
      return PRNN_STATUS_SUCCESS;
  }
  const int64_t spread = (pb->batch + room - 1) / room; /* sequences per cluster if all run at once */
  const int group = (int)(spread < 1 ? 1 : (spread > cand.max_group ? cand.max_group : spread));
  const int64_t groups = (pb->batch + group - 1) / group;
  if (ctas * (groups + producers) > 0x7fffffff) return PRNN_STATUS_SUCCESS;
  /* one cluster keeps the state in its shared memory; a fused layer keeps xp and its chunk flags in the workspace */
  plan->summary.tier = PRNN_TIER_PERSISTENT_CLUSTER;
  plan->summary.workspace_bytes =
      producers > 0 ? projection_workspace_bytes(pb->steps, pb->batch, pb->hidden, prnn_dtype_size(pb->dtype)) : 0;
  plan->summary.grid = (int)(ctas * (groups + producers));
  plan->summary.block = kClusterThreads;
  plan->summary.rows_per_cta = cand.rows;
  plan->summary.smem_bytes = smem;
  plan->kernel = cand.kernel;
  plan->cluster.ctas = ctas;
  plan->cluster.group_seqs = group;
  plan->cluster.producers = producers;
  *taken = true;
  return PRNN_STATUS_SUCCESS;
}

/* A cluster is co-scheduled, and those of the cluster tier are independent;
 * a fused layer's steppers wait for its producers, so that launch is
 * cooperative (all resident at once, or an error), after its flags are zeroed. */
prnn_status_t launch_cluster_tier(const ElmanPlan &plan, const prnn_problem_t *, RecurrenceParams params,
                                  InputProjection proj, void *workspace, cudaStream_t stream) {
  params.cluster.group_seqs = plan.cluster.group_seqs;
  if (plan.cluster.producers > 0) { /* xp goes to the workspace, after the chunk flags */
    const size_t flag_bytes = projection_flag_bytes(params.steps, params.batch);
    proj.clusters = plan.cluster.producers;
    proj.flags = static_cast<unsigned *>(workspace);
    params.in = static_cast<unsigned char *>(workspace) + flag_bytes;
    params.in_stride_b = params.hidden;
    params.in_stride_t = (int64_t)params.batch * params.hidden;
    const cudaError_t err = cudaMemsetAsync(workspace, 0, flag_bytes, stream);
    if (err != cudaSuccess) return cuda_fail(err, "cudaMemsetAsync");
  }
  const prnn_plan_t &s = plan.summary;
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t cfg =
      plan.cluster.producers > 0 ? cooperative_cluster_launch_config(s.grid, plan.cluster.ctas, s.smem_bytes, stream, attrs)
                                 : cluster_launch_config(s.grid, plan.cluster.ctas, s.smem_bytes, stream, &attrs[0]);
  void *args[] = {&params, &proj};
  const cudaError_t err = cudaLaunchKernelExC(&cfg, plan.kernel, args);
  if (err != cudaSuccess) return cuda_fail(err, "cudaLaunchKernelEx(cluster kernel)");
  return PRNN_STATUS_SUCCESS;
}

}  // namespace prnn
