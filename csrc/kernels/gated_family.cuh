/*
 * gated_family.cuh - what the gated planner (gated.cu) and the gated kernel
 * families share, as elman_family.cuh for the Elman cell: the question a
 * family is asked (a pass of a problem on a device), its answer (a plan of
 * its own, or none) and the launch of that plan. Each family plans and
 * launches in the file of its kernels; the planner asks them in order and
 * the first that takes a problem runs it.
 */
#ifndef PRNN_GATED_FAMILY_CUH
#define PRNN_GATED_FAMILY_CUH

#include <cuda_runtime.h>

#include "cuda_status.cuh"
#include "device_info.cuh"
#include "gated_unit.cuh"

namespace prnn {

/* The question: a checked problem (sizes < 2^31) and pass on a device. */
struct GatedRequest {
  const prnn_problem_t *problem;
  bool backward;           /* the backward-data pass */
  int device;              /* the current device: its index into the families' caches */
  DeviceInfo dev;
};

struct GatedFamily;

/* The answer of the family that takes a problem: what the plan query
 * reports, and that family's launch. */
struct GatedPlan {
  prnn_plan_t summary;
  const GatedFamily *family;
  const void *kernel;      /* the persistent kernel (none for the stepwise family, which launches per step) */
  struct {
    int ctas;              /* CTAs a group of sequences (a cluster, in the cluster family) */
    int seqs;              /* sequences a group, 1..8 */
  } group;                 /* cluster and grid families */
  struct {
    int units;             /* hidden units a CTA */
    int k_padded;          /* K of the on-chip matrix, padded */
    int batch_tile;        /* sequences staged at once */
  } persistent;            /* persistent family */
};

/* A kernel family of the gated cells. */
struct GatedFamily {
  /* Whether the family takes the request: PRNN_STATUS_SUCCESS with *taken
   * and the plan filled, or with !*taken to leave it to the next family; any
   * other status (a CUDA error, or a problem no family after it can run
   * either) ends the planning. */
  prnn_status_t (*take)(const GatedRequest &request, GatedPlan *plan, bool *taken);
  /* Runs the plan of the problem's pass on the stream, the workspace checked
   * against it; params as the entry point filled them. */
  prnn_status_t (*launch)(const GatedPlan &plan, const prnn_problem_t *problem, bool backward, GatedParams params,
                          void *workspace, cudaStream_t stream);
  bool all_resident;       /* its CTAs wait for each other: all must be resident at once */
};

/* The launch of the grid families (gated_grid.cu, gated_ffma.cu), whose
 * plans are groups of plan.group.ctas CTAs with plan.group.seqs sequences
 * each, exchanging tagged words in the workspace: the words zeroed (tags
 * start at zero: no word of an earlier call can match a step's tag), then
 * one cooperative launch. */
inline prnn_status_t launch_grouped_words(const GatedPlan &plan, const prnn_problem_t *, bool, GatedParams p,
                                          void *workspace, cudaStream_t stream) {
  p.group.seqs = plan.group.seqs;
  p.group.words = static_cast<unsigned long long *>(workspace);
  const prnn_plan_t &s = plan.summary;
  void *args[] = {&p};
  return launch_cooperative_zeroed(plan.kernel, s.grid, s.block, args, (size_t)s.smem_bytes, workspace,
                                   s.workspace_bytes, stream, "cudaLaunchCooperativeKernel(gated grid kernel)");
}

/* The families, each in the file of its kernels: gated_cluster.cu (16-bit
 * clusters, sm_90), gated_grid.cu (16-bit, a cooperative grid),
 * gated_ffma.cu (float32, a cooperative grid), gated.cu (the persistent
 * family, any dtype but float64, and the stepwise one). */
extern const GatedFamily gated_cluster_family;
extern const GatedFamily gated_grid_family;
extern const GatedFamily gated_ffma_family;
extern const GatedFamily gated_persistent_family;
extern const GatedFamily gated_stepwise_family;

}  // namespace prnn

#endif /* PRNN_GATED_FAMILY_CUH */
