/*
 * cluster_f32.cu - the compiled float32 shapes of the cluster tier (cluster_f32.cuh).
 */
#include "cluster_f32.cuh"

namespace prnn {

extern const ClusterF32Config cluster_configs_f32[] = {
    {2, 8, cluster_f32_kernel<2, 8>},
    {4, 8, cluster_f32_kernel<4, 8>},
    {8, 6, cluster_f32_kernel<8, 6>},
};
static_assert(sizeof(cluster_configs_f32) / sizeof(cluster_configs_f32[0]) == cluster_config_count_f32,
              "cluster_config_count_f32 must match the table");

}  // namespace prnn
