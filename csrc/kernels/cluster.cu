/*
 * cluster.cu - the compiled K extents of the cluster kernel: 128 * KT columns
 * for KT = 2, 4, 8 (hidden <= 256, 512, 1024), for bfloat16 and float16.
 * A rows per CTA are fixed (64), so hidden <= 1024 uses at most 16 CTAs.
 */
#include "cluster.cuh"

namespace prnn {

extern const ClusterConfig cluster_configs_bf16[] = {
    PRNN_CLUSTER_CONFIG(__nv_bfloat16, 2),
    PRNN_CLUSTER_CONFIG(__nv_bfloat16, 4),
    PRNN_CLUSTER_CONFIG(__nv_bfloat16, 8),
};
extern const ClusterConfig cluster_configs_f16[] = {
    PRNN_CLUSTER_CONFIG(__half, 2),
    PRNN_CLUSTER_CONFIG(__half, 4),
    PRNN_CLUSTER_CONFIG(__half, 8),
};
static_assert(sizeof(cluster_configs_bf16) / sizeof(cluster_configs_bf16[0]) == cluster_config_count &&
                  sizeof(cluster_configs_f16) / sizeof(cluster_configs_f16[0]) == cluster_config_count,
              "cluster_config_count must match the tables");

}  // namespace prnn
