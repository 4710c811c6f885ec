/*
 * device_info.cuh - what every planner (cuda_api.cu's for the Elman cell,
 * gated.cu's for the gated cells) shares: what it needs to know of a device,
 * queried once per device, and the asking of its families in order.
 */
#ifndef PRNN_DEVICE_INFO_CUH
#define PRNN_DEVICE_INFO_CUH

#include <stddef.h>

#include "prnn.h"

namespace prnn {

/* Devices the planning caches have room for. */
const int kMaxDevices = 64;

/* The device's attributes alone: each planner reads its knobs (environment
 * variables) itself. */
struct DeviceInfo {
  int ready;
  int sms;                 /* multiprocessors */
  int smem_optin;          /* most dynamic shared memory a block may opt into */
  int cooperative;         /* cooperative launches supported */
  int cluster_launch;      /* thread-block cluster launches supported (sm_90+) */
  int major;               /* compute capability major */
};

/* The device's info, queried on its first call (cuda_api.cu); device in [0, kMaxDevices). */
prnn_status_t device_info(int device, DeviceInfo *info);

/* Both planners' question to their families, in order (those `asked` of
 * them): *taken and the plan of the first that takes the request, with its
 * family set; a status other than success from any ends the asking, *out
 * left as it was. */
template <class Family, size_t N, class Request, class Plan, class Asked>
prnn_status_t ask_families(const Family *const (&families)[N], const Request &request, Asked asked, Plan *out,
                           bool *taken) {
  *taken = false;
  for (const Family *family : families) {
    if (!asked(*family)) continue;
    Plan answer = {};
    const prnn_status_t st = family->take(request, &answer, taken);
    if (st != PRNN_STATUS_SUCCESS) {
      *taken = false;
      return st;
    }
    if (*taken) {
      answer.family = family;
      *out = answer;
      return PRNN_STATUS_SUCCESS;
    }
  }
  return PRNN_STATUS_SUCCESS;
}

}  // namespace prnn

#endif /* PRNN_DEVICE_INFO_CUH */
