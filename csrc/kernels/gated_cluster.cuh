/*
 * gated_cluster.cuh - the gated cells' cluster family (gated_cluster.cu):
 * its planning and launch, asked by gated.cu's planner before the
 * persistent family.
 */
#ifndef PRNN_GATED_CLUSTER_CUH
#define PRNN_GATED_CLUSTER_CUH

#include <cuda_runtime.h>

#include "gated_unit.cuh"

namespace prnn {

/* A launch of the family: kernel NULL when it declines the problem. */
struct GatedClusterLaunch {
  const void *kernel;
  int ctas;       /* CTAs a cluster */
  int rows;       /* gate rows of W_hh a CTA holds */
  int grid;       /* ctas x clusters, a cluster per group of sequences */
  int group_seqs; /* sequences a cluster carries */
  int smem_bytes;
};

/* Whether the family takes a checked problem's pass on `device` (the
 * current one; `clusters`: compute capability 9.0 or later with cluster
 * launches), and how. */
prnn_status_t choose_gated_cluster(const prnn_problem_t *pb, bool backward, int device, bool clusters,
                                   GatedClusterLaunch *l);
prnn_status_t launch_gated_cluster(const GatedClusterLaunch &l, GatedParams p, cudaStream_t stream);

}  // namespace prnn

#endif /* PRNN_GATED_CLUSTER_CUH */
