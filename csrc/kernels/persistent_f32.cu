/*
 * persistent_f32.cu - the float32 tile shapes of the persistent kernel.
 * All rows in registers: R = 8 covers H <= 8 * SMs (1056 on an H200),
 * R = 16 up to 2048 (blockDim <= 256 keeps 255 registers per thread).
 */
#include "persistent.cuh"

namespace prnn {

extern const PersistentConfig persistent_configs_f32[] = {
    PRNN_PERSISTENT_CONFIG(float, 8, 8, 8, 256),
    PRNN_PERSISTENT_CONFIG(float, 16, 8, 16, 256),
};
extern const int persistent_config_count_f32 =
    sizeof(persistent_configs_f32) / sizeof(persistent_configs_f32[0]);

}  // namespace prnn
