/*
 * cluster_grid.cu - the cluster-grid family (cluster_grid.cuh): its compiled
 * kernels, when it takes a problem, and its launch.
 */
#include "cluster_grid.cuh"
#include "cluster_tier.cuh"
#include "cuda_status.cuh"
#include "prnn_internal.h"

namespace prnn {

extern const ClusterGridConfig cluster_grid_configs[] = {
    {PRNN_DTYPE_FLOAT32, 16, 4, (const void *)cluster_grid_kernel<ElmanCell, float, 16, 4>},
    {PRNN_DTYPE_BFLOAT16, 16, 4, (const void *)cluster_grid_kernel<ElmanCell, __nv_bfloat16, 16, 4>},
    {PRNN_DTYPE_FLOAT16, 16, 4, (const void *)cluster_grid_kernel<ElmanCell, __half, 16, 4>},
};
static_assert(sizeof(cluster_grid_configs) / sizeof(cluster_grid_configs[0]) == cluster_grid_config_count,
              "cluster_grid_config_count must match the table");

namespace {

/* Batches from which the cluster grid beats the grid tier: at H = 2048 its
 * step took 15-21% less time at B = 8 and 16, about the same at B = 5-6 (and
 * 19-41% less at H = 1280), and 13-27% more at B = 4 (and in 16 bits at
 * B = 1, 2), where every SM polling the whole state costs less than its
 * longer exchange (bench/NOTES.md step 29). */
const int64_t kClusterGridMinBatch = 5;
/* The cluster grid takes what one cluster cannot hold: H past the FFMA
 * cluster kernel's 1152 (a smaller H, declined by the cluster tier on some
 * other GPU, keeps the grid tier, rather than a cluster grid of fewer than 8
 * clusters, which has not run). */
const int64_t kClusterGridMinHidden = 1153;

/* The room of each kernel (clusters of 8 CTAs) by device (cluster_tier.cuh). */
int g_room[kMaxDevices][cluster_grid_config_count];

/* Past what one cluster holds, up to H = 2048, for batches from
 * kClusterGridMinBatch, on G = ceil(H / 160) clusters of 8 CTAs that must all
 * be resident at once (none if the device holds fewer); groups of 8
 * sequences in turn. On compute capability 9.x only: its bulk multicast is
 * built for sm_90, not sm_90a, and ptxas warns that later architectures may
 * run that much slower. */
prnn_status_t take(const ElmanRequest &request, ElmanPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const ElmanDevice &dev = request.dev;
  if (!dev.cluster || !dev.cooperative || dev.major != 9 || pb->batch < kClusterGridMinBatch ||
      pb->hidden < kClusterGridMinHidden)
    return PRNN_STATUS_SUCCESS;
  for (int i = 0; i < cluster_grid_config_count; ++i) {
    const ClusterGridConfig &f = cluster_grid_configs[i];
    if (f.dtype != pb->dtype || pb->hidden > 128 * (int64_t)f.k_chunks) continue;
    const int clusters = (int)((pb->hidden + kGridClusterRows - 1) / kGridClusterRows);
    const int smem = cluster_grid_smem_bytes((int)prnn_dtype_size(pb->dtype), f.k_chunks, f.reg_rows);
    if (clusters > kGridMaxClusters || smem > dev.smem_optin) return PRNN_STATUS_SUCCESS;
    int room;
    const prnn_status_t st = cluster_room(&g_room[request.device][i], f.kernel, kGridClusterCtas, smem, dev, &room);
    if (st != PRNN_STATUS_SUCCESS || room < clusters) return st;
    const int team_rows = clusters * kGridClusterRows;
    /* the state goes through L2: the flags and the exchange buffer */
    plan->summary.tier = PRNN_TIER_PERSISTENT_CLUSTER_GRID;
    plan->summary.workspace_bytes = cluster_grid_workspace_bytes(team_rows);
    plan->summary.grid = clusters * kGridClusterCtas;
    plan->summary.block = kClusterThreads;
    plan->summary.rows_per_cta = kGridRows;
    plan->summary.smem_bytes = smem;
    plan->kernel = f.kernel;
    plan->cluster_grid.team_rows = team_rows;
    *taken = true;
    return PRNN_STATUS_SUCCESS;
  }
  return PRNN_STATUS_SUCCESS;
}

/* The clusters wait for each other: a cooperative launch (all resident at
 * once, or an error), after the flags are zeroed. */
prnn_status_t launch(const ElmanPlan &plan, const prnn_problem_t *, RecurrenceParams params, InputProjection,
                     void *workspace, cudaStream_t stream) {
  params.cluster_grid.team_rows = plan.cluster_grid.team_rows;
  params.exchange = static_cast<unsigned long long *>(workspace);
  cudaError_t err = cudaMemsetAsync(workspace, 0, (size_t)kGridFlagWords * 4, stream);
  if (err != cudaSuccess) return cuda_fail(err, "cudaMemsetAsync");
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t cfg =
      cluster_grid_launch_config(plan.summary.grid / kGridClusterCtas, plan.summary.smem_bytes, stream, attrs);
  void *args[] = {&params};
  err = cudaLaunchKernelExC(&cfg, plan.kernel, args);
  if (err != cudaSuccess) return cuda_fail(err, "cudaLaunchKernelEx(cluster kernel)");
  return PRNN_STATUS_SUCCESS;
}

}  // namespace

extern const ElmanFamily cluster_grid_family = {take, launch, false, true};

}  // namespace prnn
