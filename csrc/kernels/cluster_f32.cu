/*
 * cluster_f32.cu - DRAFT, NOT RUN ON A GPU: the compiled float32 shapes of
 * the cluster tier (cluster_f32.cuh).
 */
#include "cluster_f32.cuh"

namespace prnn {

extern const ClusterF32Config cluster_configs_f32[] = {
    {2, 64, cluster_f32_kernel<2, 64>},
    {4, 32, cluster_f32_kernel<4, 32>},
};
extern const int cluster_config_count_f32 = sizeof(cluster_configs_f32) / sizeof(cluster_configs_f32[0]);

}  // namespace prnn
