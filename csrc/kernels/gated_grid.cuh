/*
 * gated_grid.cuh - the gated cells' grid family (gated_grid.cu): its planning
 * and launch, asked by gated.cu's planner after the cluster family.
 */
#ifndef PRNN_GATED_GRID_CUH
#define PRNN_GATED_GRID_CUH

#include <cuda_runtime.h>

#include "gated_unit.cuh"

namespace prnn {

/* A launch of the family: kernel NULL when it declines the problem. */
struct GatedGridLaunch {
  const void *kernel;
  int ctas;       /* CTAs a group of sequences */
  int rows;       /* gate rows of W_hh a CTA holds */
  int grid;       /* ctas x groups */
  int group_seqs; /* sequences a group carries */
  int smem_bytes;
  size_t workspace_bytes; /* the exchange words, zeroed by the launcher */
};

/* Whether the family takes a checked problem's pass on `device` (the current
 * one, of compute capability `major`, with `sms` multiprocessors and
 * cooperative launches if `cooperative`), and how. */
prnn_status_t choose_gated_grid(const prnn_problem_t *pb, bool backward, int device, int major, int sms,
                                bool cooperative, GatedGridLaunch *l);
prnn_status_t launch_gated_grid(const GatedGridLaunch &l, GatedParams p, void *workspace, cudaStream_t stream);

}  // namespace prnn

#endif /* PRNN_GATED_GRID_CUH */
