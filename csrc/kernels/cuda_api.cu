/*
 * cuda_api.cu - the CUDA half of prnn.h: the plan query (which tier and tile
 * shape a problem gets on this device) and the forward / backward-data entry
 * points, one launcher per kernel family.
 */
#include <stdlib.h>
#include <string.h>

#include "cluster.cuh"
#include "cluster_ffma.cuh"
#include "cluster_grid.cuh"
#include "cuda_status.cuh"
#include "gated.cuh"
#include "persistent.cuh"
#include "prnn_internal.h"
#include "stepwise.cuh"

using namespace prnn;

namespace {

/* Largest hidden size of the stepwise tier: its workspace holds a copy of W_hh. */
const int64_t kMaxStepwiseHidden = 32768;
const int kMaxDevices = 64;

struct DeviceInfo {
  int ready;
  int sms;                 /* multiprocessors */
  int smem_optin;          /* most dynamic shared memory a block may opt into */
  int cooperative;         /* cooperative launches supported */
  int cluster;             /* thread-block cluster launches supported (sm_90+) */
  int major;               /* compute capability major */
  int fuse_projection;     /* PRNN_FUSED_PROJECTION: -1 never, 0 where the planner's rule says, 1 wherever a kernel can */
};
/* Filled once per device: the fields first, then `ready` with a release store
 * (read with acquire), so a reader that sees ready sees the fields; a racing
 * fill writes the same values. */
DeviceInfo g_devices[kMaxDevices];

/* PRNN_DISABLE_CLUSTER_TIER=1 (any value but empty or "0"; read when a device
 * is first queried) plans as on GPUs without clusters: the grid tier, which
 * sm_80-89 run at every H up to the on-chip limits, is then testable on
 * sm_90 too. */
int cluster_tier_disabled() {
  const char *v = getenv("PRNN_DISABLE_CLUSTER_TIER");
  return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

/* PRNN_FUSED_PROJECTION (read when a device is first queried): "0" never
 * fuses a layer's input projection into the recurrence's launch, "1" fuses it
 * wherever a kernel can, even where the producers would not keep ahead (to
 * measure that); unset or anything else, the planner's rule. */
int fused_projection_override() {
  const char *v = getenv("PRNN_FUSED_PROJECTION");
  if (v == NULL) return 0;
  return strcmp(v, "0") == 0 ? -1 : strcmp(v, "1") == 0 ? 1 : 0;
}

prnn_status_t device_info(int device, DeviceInfo *info) {
  if (device < 0 || device >= kMaxDevices)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "device %d out of range [0, %d)", device, kMaxDevices);
  DeviceInfo *d = &g_devices[device];
  if (!__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE)) {
    DeviceInfo fresh;
    cudaError_t err = cudaDeviceGetAttribute(&fresh.sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&fresh.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&fresh.cooperative, cudaDevAttrCooperativeLaunch, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&fresh.cluster, cudaDevAttrClusterLaunch, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&fresh.major, cudaDevAttrComputeCapabilityMajor, device);
    if (err != cudaSuccess) return cuda_fail(err, "cudaDeviceGetAttribute");
    d->sms = fresh.sms;
    d->smem_optin = fresh.smem_optin;
    d->cooperative = fresh.cooperative;
    d->major = fresh.major;
    d->cluster = fresh.cluster && !cluster_tier_disabled();
    d->fuse_projection = fused_projection_override();
    __atomic_store_n(&d->ready, 1, __ATOMIC_RELEASE);
  }
  *info = *d;
  return PRNN_STATUS_SUCCESS;
}

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

/* The cluster kernel's launch for a problem. */
struct ClusterLaunch {
  const void *kernel;      /* NULL: the problem does not take a cluster tier */
  int ctas;                /* cluster size: one CTA per rows_per_cta rows, at least two (8 on the cluster grid) */
  int rows_per_cta;        /* 64 or 72 on the tensor-core kernel, 8 WR on the FFMA kernel, 20 on the cluster grid */
  int group_seqs;          /* sequences per cluster, 1..8 (1 on the FFMA kernel; unused on the cluster grid) */
  int grid;                /* ctas x groups, or 8 G on the cluster grid */
  int smem_bytes;
  int team_rows;           /* cluster grid only (else 0): the 160 G rows its G clusters cover */
  int producers;           /* the fused layer only (else 0): clusters computing xp, ahead of the batch's */
};

/* How many clusters of `ctas` CTAs of a kernel the device holds at once, per
 * (device, kernel, cluster size): 0 unknown, -1 none, else the count. The
 * kernels: the tensor-core ones (bf16 then f16, cluster_config_count each),
 * then the FFMA ones, then the cluster-grid ones, in their tables' order. */
const int kClusterKernels = 2 * cluster_config_count + cluster_ffma_config_count + cluster_grid_config_count;
int g_cluster_room[kMaxDevices][kClusterKernels][kClusterMaxCtas + 1];
/* The same for a fused layer's launch, whose shared memory (the projection's
 * staging, projection.cuh) can hold fewer CTAs on an SM. */
int g_fused_room[kMaxDevices][kClusterKernels][kClusterMaxCtas + 1];

/* The room of a cluster kernel launched with smem_bytes, cached in *known. Its
 * shared-memory limit is set to the device's whole opt-in limit, so that a
 * later, smaller problem never lowers it. */
prnn_status_t cluster_room(int *known, const void *fn, int ctas, int smem_bytes, const DeviceInfo &dev,
                           int *room) {
  *room = __atomic_load_n(known, __ATOMIC_ACQUIRE);
  if (*room != 0) return PRNN_STATUS_SUCCESS;
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.smem_optin);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err != cudaSuccess) return cuda_fail(err, "cudaFuncSetAttribute(cluster kernel)");
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(ctas, ctas, smem_bytes, 0, &attr); /* one cluster */
  int clusters = 0;
  err = cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg);
  if (err != cudaSuccess) return cuda_fail(err, "cudaOccupancyMaxActiveClusters");
  *room = clusters >= 1 ? clusters : -1;
  __atomic_store_n(known, *room, __ATOMIC_RELEASE);
  return PRNN_STATUS_SUCCESS;
}

/* CTAs of a cluster for H rows, `rows` a CTA: at least two (compute-sanitizer
 * refuses st.async within a cluster of one CTA; the second one's rows are all
 * padding). */
int cluster_ctas(int64_t hidden, int rows) {
  const int64_t ctas = (hidden + rows - 1) / rows;
  return (int)(ctas < 2 ? 2 : ctas);
}

/* A cluster kernel that can take a problem: its shape and where its room is cached. */
struct ClusterCandidate {
  const void *kernel;      /* NULL: none */
  int rows;                /* rows of A per CTA */
  int smem_bytes;
  int max_group;           /* sequences a cluster can carry: 8 (tensor cores) or 1 (FFMA) */
  int room_slot;           /* index into g_cluster_room's kernels */
  int k_extent;            /* columns of A a CTA covers */
};

/* The cluster kernel for a problem: the 16-bit dtypes up to H = 1152 on the
 * tensor-core kernel (cluster.cuh), where all of A fits in the register files
 * of one cluster as tensor-core fragments; float32 up to 1152 on the FFMA
 * kernel (cluster_ffma.cuh). Each table's first shape whose K extent covers H. */
ClusterCandidate cluster_candidate(const prnn_problem_t *pb) {
  ClusterCandidate c = {};
  const int is_half = pb->dtype == PRNN_DTYPE_FLOAT16;
  if (pb->dtype == PRNN_DTYPE_BFLOAT16 || is_half) {
    const ClusterConfig *table = is_half ? cluster_configs_f16 : cluster_configs_bf16;
    for (int i = 0; i < cluster_config_count; ++i)
      if (128 * (int64_t)table[i].k_tiles >= pb->hidden) {
        c = {table[i].kernel, table[i].rows, cluster_smem_bytes(128 * table[i].k_tiles, table[i].rows), kClusterSeqs,
             is_half * cluster_config_count + i, 128 * table[i].k_tiles};
        return c;
      }
  }
  for (int i = 0; i < cluster_ffma_config_count; ++i) {
    const ClusterFfmaConfig &f = cluster_ffma_configs[i];
    if (f.dtype == pb->dtype && 128 * (int64_t)f.k_chunks >= pb->hidden) {
      c = {f.kernel, kClusterWarps * f.warp_rows,
           cluster_ffma_smem_bytes((int)prnn_dtype_size(pb->dtype), f.k_chunks, f.warp_rows, f.reg_rows), 1,
           2 * cluster_config_count + i, 128 * f.k_chunks};
      return c;
    }
  }
  return c;
}

/* Batches from which the cluster grid beats the grid tier: at H = 2048 its
 * step took 15-21% less time at B = 8 and 16, about the same at B = 5-6 (and
 * 19-41% less at H = 1280), and 13-27% more at B = 4 (and in 16 bits at
 * B = 1, 2), where every SM polling the whole state costs less than its
 * longer exchange (bench/NOTES.md step 29). */
const int64_t kClusterGridMinBatch = 5;
/* The cluster grid takes what one cluster cannot hold: H past the FFMA
 * cluster kernel's 1152 (a smaller H, declined by the cluster tier on some
 * other GPU, keeps the grid tier, rather than a cluster grid of fewer than 8
 * clusters, which has not run). */
const int64_t kClusterGridMinHidden = 1153;

/* The cluster-grid tier (cluster_grid.cuh): past what one cluster holds, up
 * to H = 2048, for batches from kClusterGridMinBatch, on G = ceil(H / 160)
 * clusters of 8 CTAs that must all be resident at once (none if the device
 * holds fewer); groups of 8 sequences in turn. On compute capability 9.x
 * only: its bulk multicast is built for sm_90, not sm_90a, and ptxas warns
 * that later architectures may run that much slower. */
prnn_status_t choose_cluster_grid(const prnn_problem_t *pb, int device, const DeviceInfo &dev, ClusterLaunch *c) {
  memset(c, 0, sizeof *c);
  if (!dev.cluster || !dev.cooperative || dev.major != 9 || pb->batch < kClusterGridMinBatch ||
      pb->hidden < kClusterGridMinHidden)
    return PRNN_STATUS_SUCCESS;
  for (int i = 0; i < cluster_grid_config_count; ++i) {
    const ClusterGridConfig &f = cluster_grid_configs[i];
    if (f.dtype != pb->dtype || pb->hidden > 128 * (int64_t)f.k_chunks) continue;
    const int clusters = (int)((pb->hidden + kGridClusterRows - 1) / kGridClusterRows);
    const int smem = cluster_grid_smem_bytes((int)prnn_dtype_size(pb->dtype), f.k_chunks, f.reg_rows);
    if (clusters > kGridMaxClusters || smem > dev.smem_optin) return PRNN_STATUS_SUCCESS;
    int room;
    const int slot = 2 * cluster_config_count + cluster_ffma_config_count + i;
    const prnn_status_t st =
        cluster_room(&g_cluster_room[device][slot][kGridClusterCtas], f.kernel, kGridClusterCtas, smem, dev, &room);
    if (st != PRNN_STATUS_SUCCESS || room < clusters) return st;
    c->kernel = f.kernel;
    c->ctas = kGridClusterCtas;
    c->rows_per_cta = kGridRows;
    c->grid = clusters * kGridClusterCtas;
    c->smem_bytes = smem;
    c->team_rows = clusters * kGridClusterRows;
    return PRNN_STATUS_SUCCESS;
  }
  return PRNN_STATUS_SUCCESS;
}

/* Whether `producer_ctas` CTAs computing the input projection keep ahead of
 * the recurrence: each does its share of a step's projection (batch x input x
 * hidden FMAs) at some multiple of the rate a stepping CTA does its rows x K
 * extent: about 1.6 in float32 (bench/NOTES.md step 31: at H = I = 1024,
 * B = 4, 48 producer CTAs with 1.33 of a stepper's work each finished alone
 * in 0.82 of the recurrence's time, and the fused launch took 0.88 of the
 * GEMM and recurrence's), so each may take up to 1.4 of a stepper's, which
 * leaves room for the first chunk and for the steppers' slowdown beside
 * them. The 16-bit producers multiply by mma and keep the same bound. */
bool projection_keeps_up(const prnn_problem_t *pb, int64_t input, int producer_ctas, const ClusterCandidate &cand) {
  const int64_t tile = kProjTile;
  const int64_t work = pb->batch * ((input + tile - 1) / tile * tile) * ((pb->hidden + tile - 1) / tile * tile);
  return 14 * producer_ctas * cand.rows * cand.k_extent >= 10 * work;
}

/* The cluster tier, on a device with cluster launches. A step costs less the
 * fewer sequences a cluster carries (the tensor-core kernel's exchange carries
 * only those: bench/NOTES.md), so the batch is spread over as many clusters as
 * the device holds at once, up to one sequence each; past that, groups of up
 * to the kernel's maximum (8, or 1 on the FFMA kernel) and clusters in turn:
 * they are independent, so that is safe, and in float32 it beat the grid tier
 * at every batch measured (bench/NOTES.md step 26). With input > 0 (the
 * fused layer), one sequence a cluster and the clusters the batch leaves free
 * computing xp, where they keep ahead; none otherwise. */
prnn_status_t choose_cluster(const prnn_problem_t *pb, int64_t input, int device, const DeviceInfo &dev,
                             ClusterLaunch *c) {
  memset(c, 0, sizeof *c);
  if (!dev.cluster) return PRNN_STATUS_SUCCESS;
  const ClusterCandidate cand = cluster_candidate(pb);
  if (cand.kernel == NULL) return PRNN_STATUS_SUCCESS;
  const int ctas = cluster_ctas(pb->hidden, cand.rows);
  if (ctas > kClusterMaxCtas || cand.smem_bytes > dev.smem_optin) return PRNN_STATUS_SUCCESS;
  int room;
  const prnn_status_t st =
      cluster_room(&g_cluster_room[device][cand.room_slot][ctas], cand.kernel, ctas, cand.smem_bytes, dev, &room);
  if (st != PRNN_STATUS_SUCCESS || room < 0) return st;
  int smem = cand.smem_bytes, producers = 0;
  if (input > 0) { /* then one sequence a cluster: the batch is below the room */
    smem = cand.smem_bytes > kProjSmemOffset + kProjSmemBytes ? cand.smem_bytes : kProjSmemOffset + kProjSmemBytes;
    /* an item's 32 columns hold at least one step of the batch */
    if (dev.fuse_projection < 0 || pb->batch > kProjTile || smem > dev.smem_optin)
      return PRNN_STATUS_SUCCESS;
    const prnn_status_t fst =
        cluster_room(&g_fused_room[device][cand.room_slot][ctas], cand.kernel, ctas, smem, dev, &room);
    if (fst != PRNN_STATUS_SUCCESS || pb->batch >= room) return fst;
    producers = room - (int)pb->batch;
    if (dev.fuse_projection == 0 && !projection_keeps_up(pb, input, producers * ctas, cand))
      return PRNN_STATUS_SUCCESS;
  }
  const int64_t spread = (pb->batch + room - 1) / room; /* sequences per cluster if all run at once */
  const int group = (int)(spread < 1 ? 1 : (spread > cand.max_group ? cand.max_group : spread));
  const int64_t groups = (pb->batch + group - 1) / group;
  if (ctas * (groups + producers) > 0x7fffffff) return PRNN_STATUS_SUCCESS;
  c->kernel = cand.kernel;
  c->ctas = ctas;
  c->rows_per_cta = cand.rows;
  c->group_seqs = group;
  c->grid = (int)(ctas * (groups + producers));
  c->smem_bytes = smem;
  c->producers = producers;
  return PRNN_STATUS_SUCCESS;
}

/* How a problem runs on `device`: the recurrence alone (input = 0), or the
 * whole layer with its input projection fused (input > 0; not supported
 * where no kernel fuses it). */
prnn_status_t plan(const prnn_problem_t *pb, int64_t input, int device, prnn_plan_t *out, ClusterLaunch *cluster,
                   const PersistentConfig **config, Geometry *geom) {
  memset(out, 0, sizeof *out);
  memset(cluster, 0, sizeof *cluster);
  *config = NULL;
  prnn_status_t st = prnn_check_problem(pb);
  if (st != PRNN_STATUS_SUCCESS) return st;
  /* Before any cache: the plan cache keys hold hidden in 32 bits. */
  if (pb->steps > 0x7fffffff || pb->batch > 0x7fffffff || pb->hidden > 0x7fffffff)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "steps, batch and hidden must be < 2^31, got steps=%lld batch=%lld hidden=%lld",
                     (long long)pb->steps, (long long)pb->batch, (long long)pb->hidden);
  DeviceInfo dev;
  st = device_info(device, &dev);
  if (st != PRNN_STATUS_SUCCESS) return st;
  st = choose_cluster(pb, input, device, dev, cluster);
  if (st != PRNN_STATUS_SUCCESS) return st;
  if (input > 0 && cluster->kernel == NULL)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "no kernel fuses the input projection of this layer on this device (dtype %d, batch %lld, "
                     "hidden %lld, input %lld)",
                     (int)pb->dtype, (long long)pb->batch, (long long)pb->hidden, (long long)input);
  if (cluster->kernel == NULL) st = choose_cluster_grid(pb, device, dev, cluster);
  if (st != PRNN_STATUS_SUCCESS) return st;
  if (cluster->kernel != NULL) {
    out->tier = cluster->team_rows > 0 ? PRNN_TIER_PERSISTENT_CLUSTER_GRID : PRNN_TIER_PERSISTENT_CLUSTER;
    /* one cluster keeps the state in its shared memory; the cluster grid exchanges it through L2; a
     * fused layer keeps xp and its chunk flags in the workspace */
    out->workspace_bytes = cluster->team_rows > 0   ? cluster_grid_workspace_bytes(cluster->team_rows)
                           : cluster->producers > 0 ? projection_workspace_bytes(pb->steps, pb->batch, pb->hidden,
                                                                                 prnn_dtype_size(pb->dtype))
                                                    : 0;
    out->grid = cluster->grid;
    out->block = kClusterThreads;
    out->rows_per_cta = cluster->rows_per_cta;
    out->smem_bytes = cluster->smem_bytes;
    return PRNN_STATUS_SUCCESS;
  }
  st = choose_persistent(pb, device, dev, config, geom);
  if (st != PRNN_STATUS_SUCCESS) return st;
  const size_t elem = prnn_dtype_size(pb->dtype);
  if (*config != NULL) {
    const PersistentConfig &c = **config;
    out->tier = c.reg_rows == c.rows ? PRNN_TIER_PERSISTENT_REGISTERS : PRNN_TIER_PERSISTENT_SHARED;
    out->workspace_bytes = 2 * (size_t)pb->batch * (geom->hidden_padded / c.pack) * sizeof(unsigned long long);
    out->grid = geom->grid;
    out->block = geom->block;
    out->rows_per_cta = c.rows;
    out->smem_bytes = geom->smem_bytes;
    return PRNN_STATUS_SUCCESS;
  }
  if (pb->hidden > kMaxStepwiseHidden)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED,
                     "hidden=%lld is larger than the largest supported hidden size, %lld",
                     (long long)pb->hidden, (long long)kMaxStepwiseHidden);
  out->tier = PRNN_TIER_STEPWISE;
  out->workspace_bytes = stepwise_workspace_bytes((int)pb->batch, (int)pb->hidden, elem);
  out->grid = (int)((pb->hidden + 7) / 8);
  out->block = 256;
  out->rows_per_cta = 8;
  return PRNN_STATUS_SUCCESS;
}

/* Zero the exchange words, then one cooperative launch of the chosen shape. */
prnn_status_t launch_persistent(const PersistentConfig &c, const Geometry &g, RecurrenceParams params,
                                void *workspace, size_t workspace_bytes, cudaStream_t stream) {
  params.hidden_padded = g.hidden_padded;
  params.xchg = static_cast<unsigned long long *>(workspace);
  cudaError_t err = cudaMemsetAsync(workspace, 0, workspace_bytes, stream);
  if (err != cudaSuccess) return cuda_fail(err, "cudaMemsetAsync");
  void *args[] = {&params};
  err = cudaLaunchCooperativeKernel((const void *)c.kernel, dim3(g.grid), dim3(g.block), args,
                                    (size_t)g.smem_bytes, stream);
  if (err != cudaSuccess) return cuda_fail(err, "cudaLaunchCooperativeKernel(persistent_rnn_kernel)");
  return PRNN_STATUS_SUCCESS;
}

/* One launch of a cluster kernel. A cluster is co-scheduled, and those of
 * the cluster tier are independent; the cluster grid's wait for each other,
 * and so do a fused layer's steppers for its producers, so those launches
 * are cooperative too (all resident at once, or an error), after their flags
 * are zeroed. */
prnn_status_t launch_cluster(const ClusterLaunch &c, RecurrenceParams params, InputProjection proj,
                             void *workspace, cudaStream_t stream) {
  params.group_seqs = c.group_seqs;
  size_t flag_bytes = 0;
  if (c.team_rows > 0) {
    params.team_rows = c.team_rows;
    params.team_flags = static_cast<unsigned *>(workspace);
    flag_bytes = (size_t)kGridFlagWords * 4;
  }
  if (c.producers > 0) { /* xp goes to the workspace, after the chunk flags */
    flag_bytes = projection_flag_bytes(params.steps, params.batch);
    proj.clusters = c.producers;
    proj.flags = static_cast<unsigned *>(workspace);
    params.in = static_cast<unsigned char *>(workspace) + flag_bytes;
    params.in_stride_b = params.hidden;
    params.in_stride_t = (int64_t)params.batch * params.hidden;
  }
  if (flag_bytes > 0) {
    const cudaError_t err = cudaMemsetAsync(workspace, 0, flag_bytes, stream);
    if (err != cudaSuccess) return cuda_fail(err, "cudaMemsetAsync");
  }
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t cfg =
      c.team_rows > 0   ? cluster_grid_launch_config(c.grid / kGridClusterCtas, c.smem_bytes, stream, attrs)
      : c.producers > 0 ? cooperative_cluster_launch_config(c.grid, c.ctas, c.smem_bytes, stream, attrs)
                        : cluster_launch_config(c.grid, c.ctas, c.smem_bytes, stream, &attrs[0]);
  void *args[] = {&params, &proj};
  const cudaError_t err = cudaLaunchKernelExC(&cfg, c.kernel, args); /* the cluster grid kernel takes params alone */
  if (err != cudaSuccess) return cuda_fail(err, "cudaLaunchKernelEx(cluster kernel)");
  return PRNN_STATUS_SUCCESS;
}

/* Shared by both passes: plan, check the workspace, launch the chosen tier. */
prnn_status_t run(const prnn_problem_t *pb, const RecurrenceParams &params, const InputProjection &proj,
                  void *workspace, size_t workspace_bytes, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_fail(err, "cudaGetDevice");
  prnn_plan_t pl;
  ClusterLaunch cluster;
  const PersistentConfig *config;
  Geometry geom;
  prnn_status_t st = plan(pb, proj.input, device, &pl, &cluster, &config, &geom);
  if (st != PRNN_STATUS_SUCCESS) return st;
  st = check_workspace(workspace, workspace_bytes, pl.workspace_bytes);
  if (st != PRNN_STATUS_SUCCESS) return st;
  if (cluster.kernel != NULL) return launch_cluster(cluster, params, proj, workspace, stream);
  if (config != NULL) return launch_persistent(*config, geom, params, workspace, pl.workspace_bytes, stream);
  err = launch_stepwise(pb->dtype, params, workspace, stream);
  if (err != cudaSuccess) return cuda_fail(err, "stepwise_rnn_kernel launch");
  return PRNN_STATUS_SUCCESS;
}

/* The fields both passes fill alike. */
RecurrenceParams params_of(const prnn_problem_t *pb, int backward, const void *w_hh, int64_t w_hh_stride,
                           const int32_t *lengths, void *out) {
  RecurrenceParams p;
  memset(&p, 0, sizeof p);
  p.steps = (int)pb->steps;
  p.batch = (int)pb->batch;
  p.hidden = (int)pb->hidden;
  p.backward = backward;
  p.activation = pb->activation;
  p.a = w_hh;
  p.a_stride_row = backward ? 1 : w_hh_stride; /* backward: A = W_hh^T, A[i][k] = W_hh[k][i] */
  p.a_stride_col = backward ? w_hh_stride : 1;
  p.lengths = pb->has_lengths ? lengths : NULL;
  p.out = out;
  return p;
}

/* Both plan queries: plan on `device` (the gated cells' families plan per pass). */
prnn_status_t plan_on(const prnn_problem_t *problem, prnn_pass_t pass, int64_t input, int device, prnn_plan_t *out) {
  /* Planning sets kernel attributes, which apply to the current device: make
   * `device` current for it, and restore the caller's. */
  int current = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess) return cuda_fail(err, "cudaGetDevice");
  if (device != current && (err = cudaSetDevice(device)) != cudaSuccess) {
    cudaGetLastError(); /* not sticky: clear it */
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "device %d: %s", device, cudaGetErrorString(err));
  }
  ClusterLaunch cluster;
  const PersistentConfig *config;
  Geometry geom;
  prnn_status_t st = prnn_check_problem(problem);
  if (st == PRNN_STATUS_SUCCESS) {
    if (problem->cell == PRNN_CELL_ELMAN) st = plan(problem, input, device, out, &cluster, &config, &geom);
    else if (input > 0) st = prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "no kernel fuses the input projection of a gated cell");
    else st = gated_plan(problem, pass, device, out);
  }
  if (st == PRNN_STATUS_NOT_SUPPORTED) out->tier = PRNN_TIER_NONE;
  if (device != current && (err = cudaSetDevice(current)) != cudaSuccess && st == PRNN_STATUS_SUCCESS)
    st = cuda_fail(err, "cudaSetDevice");
  return st;
}

}  // namespace

extern "C" {

prnn_status_t prnn_plan_cuda(const prnn_problem_t *problem, prnn_pass_t pass, int device, prnn_plan_t *out) {
  prnn_clear_error();
  if (problem == NULL || out == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "problem and plan must not be NULL");
  if (pass != PRNN_PASS_FORWARD && pass != PRNN_PASS_BACKWARD_DATA)
    return prnn_fail(PRNN_STATUS_BAD_PARAM, "pass must be PRNN_PASS_FORWARD or PRNN_PASS_BACKWARD_DATA, got %d",
                     (int)pass);
  return plan_on(problem, pass, 0, device, out);
}

prnn_status_t prnn_plan_layer_cuda(const prnn_problem_t *problem, int64_t input, int device, prnn_plan_t *out) {
  prnn_clear_error();
  if (problem == NULL || out == NULL) return prnn_fail(PRNN_STATUS_BAD_PARAM, "problem and plan must not be NULL");
  if (input < 1) return prnn_fail(PRNN_STATUS_BAD_PARAM, "input must be >= 1, got %lld", (long long)input);
  return plan_on(problem, PRNN_PASS_FORWARD, input, device, out);
}

prnn_status_t prnn_forward_cuda(const prnn_problem_t *problem, const prnn_forward_args_t *args,
                                void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  const prnn_status_t st = prnn_check_forward_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  RecurrenceParams p = params_of(problem, 0, args->w_hh, args->w_hh_stride, args->lengths, args->y);
  p.in = args->xp;
  p.in_stride_t = args->xp_stride_t;
  p.in_stride_b = args->xp_stride_b;
  p.h0 = args->h0;
  p.h0_stride_b = args->h0_stride_b;
  return run(problem, p, InputProjection{}, workspace, workspace_bytes, (cudaStream_t)stream);
}

prnn_status_t prnn_layer_forward_cuda(const prnn_problem_t *problem, const prnn_layer_args_t *args,
                                      void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  const prnn_status_t st = prnn_check_layer_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  if (args->input > 0x7fffffff)
    return prnn_fail(PRNN_STATUS_NOT_SUPPORTED, "input must be < 2^31, got %lld", (long long)args->input);
  RecurrenceParams p = params_of(problem, 0, args->w_hh, args->w_hh_stride, args->lengths, args->y);
  p.h0 = args->h0;
  p.h0_stride_b = args->h0_stride_b;
  InputProjection proj = {};
  proj.input = (int)args->input;
  proj.x = args->x;
  proj.x_stride_t = args->x_stride_t;
  proj.x_stride_b = args->x_stride_b;
  proj.w = args->w_ih;
  proj.w_stride = args->w_ih_stride;
  proj.b_ih = args->b_ih;
  proj.b_hh = args->b_hh;
  return run(problem, p, proj, workspace, workspace_bytes, (cudaStream_t)stream);
}

prnn_status_t prnn_backward_data_cuda(const prnn_problem_t *problem, const prnn_backward_args_t *args,
                                      void *workspace, size_t workspace_bytes, prnn_stream_t stream) {
  prnn_clear_error();
  const prnn_status_t st = prnn_check_backward_args(problem, args);
  if (st != PRNN_STATUS_SUCCESS) return st;
  RecurrenceParams p = params_of(problem, 1, args->w_hh, args->w_hh_stride, args->lengths, args->grad_xp);
  p.in = args->grad_y;
  p.in_stride_t = args->grad_y_stride_t;
  p.in_stride_b = args->grad_y_stride_b;
  p.y = args->y;
  return run(problem, p, InputProjection{}, workspace, workspace_bytes, (cudaStream_t)stream);
}

}  // extern "C"
