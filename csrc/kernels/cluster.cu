/*
 * cluster.cu - the compiled shapes of the cluster kernel, for bfloat16 and
 * float16: K extents of 128 * KT columns for KT = 2, 4, 8 (hidden <= 256,
 * 512, 1024) at 64 rows a CTA, and KT = 9 (hidden <= 1152) at 72 rows a CTA,
 * so that every shape needs at most 16 CTAs.
 */
#include "cluster.cuh"

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

}  // namespace prnn
