/*
 * cluster_tier.cuh - the planning and launch that the cluster tier's two
 * families share (the tensor-core kernel in 16 bits, cluster.cu; the FFMA
 * kernel in float32, cluster_ffma.cu): the device's room for clusters, the
 * batch spread over clusters, and the producers of a fused layer. Each family
 * only picks its kernel's shape.
 */
#ifndef PRNN_CLUSTER_TIER_CUH
#define PRNN_CLUSTER_TIER_CUH

#include "elman_family.cuh"

namespace prnn {

/* How many clusters of `ctas` CTAs of a kernel launched with smem_bytes the
 * device holds at once (-1: none), cached in *known (0: not known yet). Also
 * the cluster grid's (cluster_grid.cu). */
prnn_status_t cluster_room(int *known, const void *kernel, int ctas, int smem_bytes, const DeviceInfo &dev,
                           int *room);

/* A cluster kernel that can take a problem: its shape and where its room is cached. */
struct ClusterCandidate {
  const void *kernel;
  int rows;                /* rows of A per CTA */
  int smem_bytes;
  int max_group;           /* sequences a cluster can carry: 8 (tensor cores) or 1 (FFMA) */
  int k_extent;            /* columns of A a CTA covers */
  int *room;               /* [kClusterMaxCtas + 1]: the kernel's room by cluster size, this device */
  int *fused_room;         /* the same for a fused layer's launch */
};

/* The cluster tier's plan of a candidate (ElmanFamily::take), and its launch
 * (ElmanFamily::launch). */
prnn_status_t plan_cluster_tier(const ElmanRequest &request, const ClusterCandidate &candidate, ElmanPlan *plan,
                                bool *taken);
prnn_status_t launch_cluster_tier(const ElmanPlan &plan, const prnn_problem_t *problem, RecurrenceParams params,
                                  InputProjection proj, void *workspace, cudaStream_t stream);

}  // namespace prnn

#endif /* PRNN_CLUSTER_TIER_CUH */
