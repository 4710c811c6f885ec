/*
 * persistent.cu - the grid tier's family: which compiled tile shape of the
 * persistent kernel (persistent.cuh; the shapes in persistent_<dtype>.cu)
 * runs a problem with every CTA resident, one per SM, and its cooperative
 * launch.
 */
#include "cuda_status.cuh"
#include "elman_family.cuh"
#include "persistent.cuh"
#include "prnn_internal.h"

namespace prnn {
namespace {

void persistent_table(prnn_dtype_t dtype, const PersistentConfig **table, int *count) {
  switch (dtype) {
    case PRNN_DTYPE_FLOAT32: *table = persistent_configs_f32; *count = persistent_config_count_f32; return;
    case PRNN_DTYPE_BFLOAT16: *table = persistent_configs_bf16; *count = persistent_config_count_bf16; return;
    case PRNN_DTYPE_FLOAT16: *table = persistent_configs_f16; *count = persistent_config_count_f16; return;
    default: *table = NULL; *count = 0; return;
  }
}

/* Launch geometry of a tile shape for a problem. */
struct Geometry {
  int grid, block, hidden_padded, smem_bytes;
};

Geometry geometry_of(const PersistentConfig &c, const prnn_problem_t *pb) {
  Geometry g;
  const int hidden = (int)pb->hidden;
  const int per_warp = 32 * c.k_per_thread;
  const int outputs = c.rows >= 32 ? c.rows : 32; /* N: outputs per tile */
  g.block = (hidden + per_warp - 1) / per_warp * 32;
  g.hidden_padded = g.block * c.k_per_thread;
  g.grid = (hidden + c.rows - 1) / c.rows;
  g.smem_bytes = (c.rows - c.reg_rows) * g.hidden_padded * (int)prnn_dtype_size(pb->dtype) +
                 2 * (g.block / 32) * outputs * (int)sizeof(float);
  return g;
}

/* Whether shape c can run the problem with all CTAs co-resident (one per SM)
 * and at most max_grid of them. Fails only on a CUDA error. */
prnn_status_t shape_fits(const PersistentConfig &c, const prnn_problem_t *pb, const DeviceInfo &dev, int max_grid,
                         bool *fits) {
  *fits = false;
  const Geometry g = geometry_of(c, pb);
  if (g.block > c.max_threads || g.grid > max_grid || g.smem_bytes > dev.smem_optin) return PRNN_STATUS_SUCCESS;
  const void *fn = (const void *)c.kernel;
  /* The device's whole opt-in limit, so that a later, smaller problem never lowers it. */
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.smem_optin);
  if (err != cudaSuccess) return cuda_fail(err, "cudaFuncSetAttribute");
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, g.block, g.smem_bytes);
  if (err != cudaSuccess) return cuda_fail(err, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  *fits = per_sm >= 1;
  return PRNN_STATUS_SUCCESS;
}

/* Batches above this run in tiles of few sequences, where a smaller R (more
 * sequences per tile) wins over fewer CTAs (bench/NOTES.md). */
const int64_t kLargeBatch = 8;

/* The compiled shape for a problem, or none (*index = -1). Fewer CTAs poll the
 * exchange less (bench/NOTES.md: 64 CTAs beat 128 at H = 1024, B = 4), so for
 * small batches the first choice is the smallest all-register shape that needs
 * at most half the SMs; otherwise, and then, the smallest shape of any kind
 * that fits one CTA per SM. */
prnn_status_t search_persistent(const prnn_problem_t *pb, const DeviceInfo &dev, int *index) {
  *index = -1;
  const PersistentConfig *table;
  int count;
  persistent_table(pb->dtype, &table, &count);
  if (!dev.cooperative || pb->hidden > 65536) return PRNN_STATUS_SUCCESS;
  for (int pass = pb->batch > kLargeBatch ? 1 : 0; pass < 2; ++pass) {
    for (int i = 0; i < count; ++i) {
      if (pass == 0 && table[i].reg_rows != table[i].rows) continue;
      bool fits;
      const prnn_status_t st = shape_fits(table[i], pb, dev, pass == 0 ? dev.sms / 2 : dev.sms, &fits);
      if (st != PRNN_STATUS_SUCCESS) return st;
      if (fits) {
        *index = i;
        return PRNN_STATUS_SUCCESS;
      }
    }
  }
  return PRNN_STATUS_SUCCESS;
}

/* The search result per (device, dtype, hidden, large batch): the occupancy
 * query costs microseconds, which a launch must not. An entry is one 64-bit
 * word holding key and value (hidden << 32 | large << 16 | dtype << 8 |
 * index + 1), so concurrent callers never read a torn entry; a collision
 * merely searches again. */
const int kPlanCacheSize = 512;
unsigned long long g_plan_cache[kMaxDevices][kPlanCacheSize];

prnn_status_t choose_persistent(const prnn_problem_t *pb, int device, const DeviceInfo &dev,
                                const PersistentConfig **chosen, Geometry *geom) {
  *chosen = NULL;
  const unsigned long long large = pb->batch > kLargeBatch;
  const unsigned long long key =
      (unsigned long long)pb->hidden << 32 | large << 16 | (unsigned long long)pb->dtype << 8;
  unsigned long long *slot = &g_plan_cache[device][(pb->hidden * 8 + large * 4 + pb->dtype) % kPlanCacheSize];
  const unsigned long long cached = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  int index;
  if (cached != 0 && (cached & ~0xffull) == key) {
    index = (int)(cached & 0xff) - 1;
  } else {
    const prnn_status_t st = search_persistent(pb, dev, &index);
    if (st != PRNN_STATUS_SUCCESS) return st;
    __atomic_store_n(slot, key | (unsigned long long)(index + 1), __ATOMIC_RELEASE);
  }
  if (index < 0) return PRNN_STATUS_SUCCESS;
  const PersistentConfig *table;
  int count;
  persistent_table(pb->dtype, &table, &count);
  *chosen = &table[index];
  *geom = geometry_of(table[index], pb);
  return PRNN_STATUS_SUCCESS;
}

/* Registers alone, or registers and shared memory: the tier of the shape chosen. */
prnn_status_t take(const ElmanRequest &request, ElmanPlan *plan, bool *taken) {
  const prnn_problem_t *pb = request.problem;
  const PersistentConfig *config;
  Geometry geom;
  const prnn_status_t st = choose_persistent(pb, request.device, request.dev, &config, &geom);
  if (st != PRNN_STATUS_SUCCESS || config == NULL) return st;
  const PersistentConfig &c = *config;
  plan->summary.tier = c.reg_rows == c.rows ? PRNN_TIER_PERSISTENT_REGISTERS : PRNN_TIER_PERSISTENT_SHARED;
  plan->summary.workspace_bytes = 2 * (size_t)pb->batch * (geom.hidden_padded / c.pack) * sizeof(unsigned long long);
  plan->summary.grid = geom.grid;
  plan->summary.block = geom.block;
  plan->summary.rows_per_cta = c.rows;
  plan->summary.smem_bytes = geom.smem_bytes;
  plan->kernel = (const void *)c.kernel;
  plan->grid.hidden_padded = geom.hidden_padded;
  *taken = true;
  return PRNN_STATUS_SUCCESS;
}

/* Zero the exchange words, then one cooperative launch of the chosen shape. */
prnn_status_t launch(const ElmanPlan &plan, const prnn_problem_t *, RecurrenceParams params, InputProjection,
                     void *workspace, cudaStream_t stream) {
  const prnn_plan_t &s = plan.summary;
  params.grid.hidden_padded = plan.grid.hidden_padded;
  params.exchange = static_cast<unsigned long long *>(workspace);
  void *args[] = {&params};
  return launch_cooperative_zeroed(plan.kernel, s.grid, s.block, args, (size_t)s.smem_bytes, workspace,
                                   s.workspace_bytes, stream, "cudaLaunchCooperativeKernel(persistent_rnn_kernel)");
}

}  // namespace

extern const ElmanFamily persistent_family = {take, launch, false, true};

}  // namespace prnn
