/*
 * cluster_ffma.cu - the FFMA cluster family (cluster_ffma.cuh): its compiled
 * shapes, and which of them takes a problem.
 */
#include "cluster_ffma.cuh"
#include "cluster_tier.cuh"
#include "prnn_internal.h"

namespace prnn {

#define PRNN_FFMA_CONFIG(DTYPE, E, KC, WR, RREG) \
  { DTYPE, KC, WR, RREG, (const void *)cluster_ffma_kernel<ElmanCell, E, KC, WR, RREG> }

extern const ClusterFfmaConfig cluster_ffma_configs[] = {
    PRNN_FFMA_CONFIG(PRNN_DTYPE_FLOAT32, float, 2, 8, 8),
    PRNN_FFMA_CONFIG(PRNN_DTYPE_FLOAT32, float, 4, 8, 8),
    PRNN_FFMA_CONFIG(PRNN_DTYPE_FLOAT32, float, 8, 8, 6),
    PRNN_FFMA_CONFIG(PRNN_DTYPE_FLOAT32, float, 9, 9, 5),
};
static_assert(sizeof(cluster_ffma_configs) / sizeof(cluster_ffma_configs[0]) == cluster_ffma_config_count,
              "cluster_ffma_config_count must match the table");

namespace {

/* The room of each shape's kernel by device and cluster size (cluster_tier.cuh). */
int g_room[kMaxDevices][cluster_ffma_config_count][kClusterMaxCtas + 1];
int g_fused_room[kMaxDevices][cluster_ffma_config_count][kClusterMaxCtas + 1];

/* float32 up to H = 1152 (the 16-bit dtypes take the tensor-core family):
 * the first shape of the dtype whose K extent covers H. */
prnn_status_t take(const ElmanRequest &request, ElmanPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  if (!request.dev.cluster) return PRNN_STATUS_SUCCESS;
  for (int i = 0; i < cluster_ffma_config_count; ++i) {
    const ClusterFfmaConfig &f = cluster_ffma_configs[i];
    if (f.dtype == pb->dtype && 128 * (int64_t)f.k_chunks >= pb->hidden) {
      const ClusterCandidate cand = {
          f.kernel, kClusterWarps * f.warp_rows,
          cluster_ffma_smem_bytes((int)prnn_dtype_size(pb->dtype), f.k_chunks, f.warp_rows, f.reg_rows), 1,
          128 * f.k_chunks, g_room[request.device][i], g_fused_room[request.device][i]};
      return plan_cluster_tier(request, cand, plan, taken);
    }
  }
  return PRNN_STATUS_SUCCESS;
}

}  // namespace

extern const ElmanFamily cluster_ffma_family = {take, launch_cluster_tier, true, true};

}  // namespace prnn
