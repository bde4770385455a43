// The process-wide choices of programmatic dependent launch and of cluster launches (pdl.cuh).
#include <cstdint>
#include <limits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"
#include "core/env.h"

namespace qspec::cuda {

namespace {

// Never launched: compiled with the same architectures as every kernel of the backend (the W4A16 prefill
// kernel's 90 is sm_90a code plus compute_90 PTX: the same virtual architectures), its attributes say
// which virtual architecture the code the device runs was built for (a build for sm_80 alone runs on an
// H200 through the compute_80 PTX, whose kernels have no griddepcontrol.wait and no cluster barriers).
__global__ void pdl_probe_kernel() {
  wait_for_previous_kernel();
  allow_next_kernel();
}

bool sm90_code() {
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, pdl_probe_kernel), "cudaFuncGetAttributes (PDL probe)");
  return attributes.ptxVersion >= 90;
}

bool decide() {
  if (env_integer("QSPEC_PDL", 0, 1) == 0) return false;
  return sm90_code();
}

int64_t decide_max_blocks() {
  return env_integer("QSPEC_PDL_MAX_BLOCKS", 0, std::numeric_limits<int32_t>::max()).value_or(0);
}

}  // namespace

bool programmatic_launch_enabled() {
  static const bool enabled = decide();
  return enabled;
}

bool clusters_supported() {
  static const bool supported = sm90_code();
  return supported;
}

int64_t programmatic_launch_max_blocks() {
  static const int64_t max_blocks = decide_max_blocks();
  return max_blocks;
}

}  // namespace qspec::cuda
