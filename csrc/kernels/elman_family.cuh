/*
 * elman_family.cuh - what the Elman planner (cuda_api.cu) and the Elman
 * kernel families share: the question a family is asked (a problem on a
 * device), its answer (a plan of its own, or none) and the launch of that
 * plan. Each family plans and launches in the file of its kernels; the planner
 * asks them in order and the first that takes a problem runs it.
 */
#ifndef PRNN_ELMAN_FAMILY_CUH
#define PRNN_ELMAN_FAMILY_CUH

#include <cuda_runtime.h>

#include "device_info.cuh"
#include "prnn.h"
#include "projection.cuh"
#include "rnn_math.cuh"

namespace prnn {

/* A device as the Elman planner sees it: its attributes and the planner's
 * knobs, read once a process, at its first plan on the device. */
struct ElmanDevice : DeviceInfo {
  int knobs_ready;
  int cluster;             /* cluster launches, and PRNN_DISABLE_CLUSTER_TIER unset, empty or "0" */
  int fuse_projection;     /* PRNN_FUSED_PROJECTION: -1 never, 0 where the planner's rule says, 1 wherever a kernel can */
};

/* The question: a checked problem (steps, batch and hidden < 2^31) on a device. */
struct ElmanRequest {
  const prnn_problem_t *problem;
  int64_t input;           /* the whole layer with its input projection fused (I > 0), or the recurrence alone (0) */
  int device;              /* the current device: its index into the families' caches */
  ElmanDevice dev;
};

struct ElmanFamily;

/* The answer of the family that takes a problem: what the plan query
 * reports, and that family's launch. */
struct ElmanPlan {
  prnn_plan_t summary;
  const ElmanFamily *family;
  const void *kernel;      /* the persistent kernel (none for the stepwise tier, which launches per step) */
  struct {
    int hidden_padded;     /* blockDim.x * KL >= H, the K extent a CTA covers */
  } grid;                  /* grid tier */
  struct {
    int ctas;              /* CTAs a cluster: one per rows_per_cta rows, at least two */
    int group_seqs;        /* sequences a cluster, 1..8 (1 on the FFMA kernel) */
    int producers;         /* clusters computing xp ahead of the batch's (a fused layer), else 0 */
  } cluster;               /* cluster tier */
  struct {
    int team_rows;         /* 160 G >= H: the rows its G clusters of 8 CTAs cover */
  } cluster_grid;          /* cluster grid */
};

/* A kernel family of the Elman cell. */
struct ElmanFamily {
  /* Whether the family takes the problem: PRNN_STATUS_SUCCESS with *taken and
   * the plan filled, or with !*taken to leave it to the next family; any other
   * status (a CUDA error, or a problem no family after it can run either)
   * ends the planning. */
  prnn_status_t (*take)(const ElmanRequest &request, ElmanPlan *plan, bool *taken);
  /* Runs the plan of the problem on the stream, the workspace checked against
   * it; params and proj as the entry point filled them (proj.input > 0: a
   * fused layer). */
  prnn_status_t (*launch)(const ElmanPlan &plan, const prnn_problem_t *problem, RecurrenceParams params,
                          InputProjection proj, void *workspace, cudaStream_t stream);
  bool fuses_projection;   /* can take a layer with its input projection (input > 0) */
  bool all_resident;       /* its CTAs wait for each other: all must be resident at once */
};

/* The families, each in the file of its kernels: cluster.cu (tensor cores,
 * 16-bit), cluster_ffma.cu (float32), cluster_grid.cu, persistent.cu (the
 * grid tier), stepwise.cu. */
extern const ElmanFamily cluster_family;
extern const ElmanFamily cluster_ffma_family;
extern const ElmanFamily cluster_grid_family;
extern const ElmanFamily persistent_family;
extern const ElmanFamily stepwise_family;

}  // namespace prnn

#endif /* PRNN_ELMAN_FAMILY_CUH */
