/*
 * cluster.cu - the tensor-core cluster family (cluster.cuh): its compiled
 * shapes, for bfloat16 and float16: K extents of 128 * KT columns for KT = 2,
 * 4, 8 (hidden <= 256, 512, 1024) at 64 rows a CTA, and KT = 9 (hidden <=
 * 1152) at 72 rows a CTA, so that every shape needs at most 16 CTAs; and
 * which of them takes a problem.
 */
#include "cluster.cuh"
#include "cluster_tier.cuh"

namespace prnn {

extern const ClusterConfig cluster_configs_bf16[] = {
    PRNN_CLUSTER_CONFIG(__nv_bfloat16, 2, 64),
    PRNN_CLUSTER_CONFIG(__nv_bfloat16, 4, 64),
    PRNN_CLUSTER_CONFIG(__nv_bfloat16, 8, 64),
    PRNN_CLUSTER_CONFIG(__nv_bfloat16, 9, 72),
};
extern const ClusterConfig cluster_configs_f16[] = {
    PRNN_CLUSTER_CONFIG(__half, 2, 64),
    PRNN_CLUSTER_CONFIG(__half, 4, 64),
    PRNN_CLUSTER_CONFIG(__half, 8, 64),
    PRNN_CLUSTER_CONFIG(__half, 9, 72),
};
static_assert(sizeof(cluster_configs_bf16) / sizeof(cluster_configs_bf16[0]) == cluster_config_count &&
                  sizeof(cluster_configs_f16) / sizeof(cluster_configs_f16[0]) == cluster_config_count,
              "cluster_config_count must match the tables");

namespace {

/* The room of each shape's kernel (bf16, then f16) by device and cluster size (cluster_tier.cuh). */
int g_room[kMaxDevices][2 * cluster_config_count][kClusterMaxCtas + 1];
int g_fused_room[kMaxDevices][2 * cluster_config_count][kClusterMaxCtas + 1];

/* The 16-bit dtypes up to H = 1152, where all of A fits in the register files
 * of one cluster as tensor-core fragments: the first shape whose K extent
 * covers H. */
prnn_status_t take(const ElmanRequest &request, ElmanPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const int is_half = pb->dtype == PRNN_DTYPE_FLOAT16;
  if (!request.dev.cluster || (pb->dtype != PRNN_DTYPE_BFLOAT16 && !is_half)) return PRNN_STATUS_SUCCESS;
  const ClusterConfig *table = is_half ? cluster_configs_f16 : cluster_configs_bf16;
  for (int i = 0; i < cluster_config_count; ++i)
    if (128 * (int64_t)table[i].k_tiles >= pb->hidden) {
      const int slot = is_half * cluster_config_count + i;
      const ClusterCandidate cand = {table[i].kernel, table[i].rows,
                                     cluster_smem_bytes(128 * table[i].k_tiles, table[i].rows), kClusterSeqs,
                                     128 * table[i].k_tiles, g_room[request.device][slot],
                                     g_fused_room[request.device][slot]};
      return plan_cluster_tier(request, cand, plan, taken);
    }
  return PRNN_STATUS_SUCCESS;
}

}  // namespace

extern const ElmanFamily cluster_family = {take, launch_cluster_tier, true, true};

}  // namespace prnn
