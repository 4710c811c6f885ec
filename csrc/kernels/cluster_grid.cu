/*
 * cluster_grid.cu - the compiled kernels of the cluster-grid tier (cluster_grid.cuh).
 */
#include "cluster_grid.cuh"

namespace prnn {

extern const ClusterGridConfig cluster_grid_configs[] = {
    {PRNN_DTYPE_FLOAT32, 16, 4, (const void *)cluster_grid_kernel<float, 16, 4>},
    {PRNN_DTYPE_BFLOAT16, 16, 4, (const void *)cluster_grid_kernel<__nv_bfloat16, 16, 4>},
    {PRNN_DTYPE_FLOAT16, 16, 4, (const void *)cluster_grid_kernel<__half, 16, 4>},
};
static_assert(sizeof(cluster_grid_configs) / sizeof(cluster_grid_configs[0]) == cluster_grid_config_count,
              "cluster_grid_config_count must match the table");

}  // namespace prnn
