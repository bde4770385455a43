#include "backend/cuda/device_resources.h"

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace qspec::cuda {

DeviceMemory::DeviceMemory(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t status = cudaMalloc(&data_, bytes);
  if (status != cudaSuccess) {
    data_ = nullptr;
    fail("CUDA: cudaMalloc of {} bytes: {}: {}", bytes, cudaGetErrorName(status), cudaGetErrorString(status));
  }
}

DeviceMemory::~DeviceMemory() {
  release();
}

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

// cudaFree synchronises the device; an error here (a sticky error of an earlier launch) cannot be thrown
// from a destructor and was already reported by the call that caused it.
void DeviceMemory::release() noexcept {
  if (data_ != nullptr) static_cast<void>(cudaFree(data_));
  data_ = nullptr;
  bytes_ = 0;
}

PinnedHostMemory::PinnedHostMemory(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  cudaError_t status = cudaMallocHost(&data_, bytes);
  if (status != cudaSuccess) {
    data_ = nullptr;
    fail("CUDA: cudaMallocHost of {} bytes: {}: {}", bytes, cudaGetErrorName(status),
         cudaGetErrorString(status));
  }
}

PinnedHostMemory::~PinnedHostMemory() {
  release();
}

PinnedHostMemory::PinnedHostMemory(PinnedHostMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedHostMemory& PinnedHostMemory::operator=(PinnedHostMemory&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void PinnedHostMemory::release() noexcept {
  if (data_ != nullptr) static_cast<void>(cudaFreeHost(data_));
  data_ = nullptr;
  bytes_ = 0;
}

CudaStream::CudaStream() {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

CudaStream::~CudaStream() {
  static_cast<void>(cudaStreamDestroy(stream_));
}

}  // namespace qspec::cuda
