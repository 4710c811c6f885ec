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
const int kMaxDevices = PRNN_MAX_DEVICES;

/* The device's attributes, and what resident kernels hold of it: each
 * planner reads its knobs (environment variables) itself. */
struct DeviceInfo {
  int ready;
  int sms;                 /* multiprocessors */
  int smem_optin;          /* most dynamic shared memory a block may opt into */
  int cooperative;         /* cooperative launches supported */
  int cluster_launch;      /* thread-block cluster launches supported (sm_90+) */
  int major;               /* compute capability major */
  int64_t resident_sms;    /* SMs resident kernels hold now (prnn_resident_held_sms), read at each plan */
};

/* The device's info, queried on its first call (cuda_api.cu); device in [0, kMaxDevices). */
prnn_status_t device_info(int device, DeviceInfo *info);

/* The kernels of the tiers the planners choose while resident kernels hold
 * SMs (families not all_resident, and the few-steps kernel), each file's on
 * the current device: stepwise.cu, gated.cu (its stepwise family),
 * few_steps.cu. load_plain_kernels (cuda_api.cu) loads them all; a resident
 * launch does so first, so that none is first loaded beside it (load_kernels). */
prnn_status_t load_stepwise_kernels();
prnn_status_t load_gated_stepwise_kernels();
prnn_status_t load_few_steps_kernels();
prnn_status_t load_plain_kernels();

/* Both planners' question to their families, in order (those `asked` of
 * them, and while resident kernels hold SMs of the device only those whose
 * CTAs need not all be resident at once): *taken and the plan of the first
 * that takes the request, with its family set; a status other than success
 * from any ends the asking, *out left as it was. */
template <class Family, size_t N, class Request, class Plan, class Asked>
prnn_status_t ask_families(const Family *const (&families)[N], const Request &request, Asked asked, Plan *out,
                           bool *taken) {
  *taken = false;
  for (const Family *family : families) {
    if (!asked(*family) || (family->all_resident && request.dev.resident_sms > 0)) continue;
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
