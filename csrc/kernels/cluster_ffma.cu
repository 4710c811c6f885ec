/*
 * cluster_ffma.cu - the compiled shapes of the FFMA cluster kernel (cluster_ffma.cuh).
 */
#include "cluster_ffma.cuh"

namespace prnn {

#define PRNN_FFMA_CONFIG(DTYPE, E, KC, WR, RREG) \
  { DTYPE, KC, WR, RREG, (const void *)cluster_ffma_kernel<E, KC, WR, RREG> }

extern const ClusterFfmaConfig cluster_ffma_configs[] = {
    PRNN_FFMA_CONFIG(PRNN_DTYPE_FLOAT32, float, 2, 8, 8),
    PRNN_FFMA_CONFIG(PRNN_DTYPE_FLOAT32, float, 4, 8, 8),
    PRNN_FFMA_CONFIG(PRNN_DTYPE_FLOAT32, float, 8, 8, 6),
    PRNN_FFMA_CONFIG(PRNN_DTYPE_FLOAT32, float, 9, 9, 5),
};
static_assert(sizeof(cluster_ffma_configs) / sizeof(cluster_ffma_configs[0]) == cluster_ffma_config_count,
              "cluster_ffma_config_count must match the table");

}  // namespace prnn
