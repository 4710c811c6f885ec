/*
 * device_info.cuh - what every planner (cuda_api.cu's for the Elman cell,
 * gated.cu's for the gated cells) needs to know of a device, queried once
 * per device.
 */
#ifndef PRNN_DEVICE_INFO_CUH
#define PRNN_DEVICE_INFO_CUH

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

}  // namespace prnn

#endif /* PRNN_DEVICE_INFO_CUH */
