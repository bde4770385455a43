#include "backend/cuda/device_resources.h"

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace qspec::cuda {

template <MemoryPlace kPlace>
CudaMemory<kPlace>::CudaMemory(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t status =
      kPlace == MemoryPlace::Device ? cudaMalloc(&data_, bytes) : cudaMallocHost(&data_, bytes);
  if (status != cudaSuccess) {
    data_ = nullptr;
    fail("CUDA: {} of {} bytes: {}: {}", kPlace == MemoryPlace::Device ? "cudaMalloc" : "cudaMallocHost",
         bytes, cudaGetErrorName(status), cudaGetErrorString(status));
  }
}

template <MemoryPlace kPlace>
CudaMemory<kPlace>::~CudaMemory() {
  release();
}

template <MemoryPlace kPlace>
CudaMemory<kPlace>::CudaMemory(CudaMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

template <MemoryPlace kPlace>
CudaMemory<kPlace>& CudaMemory<kPlace>::operator=(CudaMemory&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

// cudaFree synchronises the device; an error here (a sticky error of an earlier launch) cannot be thrown
// from a destructor and was already reported by the call that caused it.
template <MemoryPlace kPlace>
void CudaMemory<kPlace>::release() noexcept {
  if (data_ != nullptr)
    static_cast<void>(kPlace == MemoryPlace::Device ? cudaFree(data_) : cudaFreeHost(data_));
  data_ = nullptr;
  bytes_ = 0;
}

template class CudaMemory<MemoryPlace::Device>;
template class CudaMemory<MemoryPlace::PinnedHost>;

CudaStream::CudaStream(int priority) {
  check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority), "cudaStreamCreate");
}

CudaStream::~CudaStream() {
  static_cast<void>(cudaStreamDestroy(stream_));
}

CudaEvent::CudaEvent() {
  check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
}

CudaEvent::~CudaEvent() {
  static_cast<void>(cudaEventDestroy(event_));
}

}  // namespace qspec::cuda
