/*
 * persistent_bf16.cu - the bfloat16 tile shapes of the persistent kernel.
 * Weights stay packed two per register. R = 8 and 16 hold every row in
 * registers (H <= 2048 on an H200); R = 32 keeps 10 rows in registers and 22 in
 * shared memory (H <= 3072 with blockDim <= 384; more register rows spill).
 */
#include "persistent.cuh"

namespace prnn {

extern const PersistentConfig persistent_configs_bf16[] = {
    PRNN_PERSISTENT_CONFIG(__nv_bfloat16, 8, 8, 8, 256),
    PRNN_PERSISTENT_CONFIG(__nv_bfloat16, 16, 8, 16, 256),
    PRNN_PERSISTENT_CONFIG(__nv_bfloat16, 32, 8, 10, 384),
};
extern const int persistent_config_count_bf16 =
    sizeof(persistent_configs_bf16) / sizeof(persistent_configs_bf16[0]);

}  // namespace prnn
