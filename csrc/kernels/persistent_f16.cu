/*
 * persistent_f16.cu - the float16 tile shapes of the persistent kernel.
 * Weights stay packed two per register. R = 8 and 16 hold every row in
 * registers (H <= 2048 on an H200); R = 32 keeps 6 rows in registers and 26 in
 * shared memory (H <= 3072 with blockDim <= 384; more register rows spill).
 */
#include "persistent.cuh"

namespace prnn {

extern const PersistentConfig persistent_configs_f16[] = {
    PRNN_PERSISTENT_CONFIG(__half, 8, 8, 8, 256),
    PRNN_PERSISTENT_CONFIG(__half, 16, 8, 16, 256),
    PRNN_PERSISTENT_CONFIG(__half, 32, 8, 6, 384),
};
extern const int persistent_config_count_f16 =
    sizeof(persistent_configs_f16) / sizeof(persistent_configs_f16[0]);

}  // namespace prnn
