// RAII owners of CUDA resources: device memory, pinned host memory, a stream and an event.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace qspec::cuda {

// Where a CudaMemory lives: device memory (cudaMalloc) or page-locked host memory (cudaMallocHost), whose
// copies to the device are asynchronous.
enum class MemoryPlace { Device, PinnedHost };

template <MemoryPlace kPlace>
class CudaMemory {
 public:
  CudaMemory() = default;
  explicit CudaMemory(size_t bytes);
  ~CudaMemory();
  CudaMemory(CudaMemory&& other) noexcept;
  CudaMemory& operator=(CudaMemory&& other) noexcept;
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceMemory = CudaMemory<MemoryPlace::Device>;
using PinnedHostMemory = CudaMemory<MemoryPlace::PinnedHost>;

class CudaStream {
 public:
  // priority: cudaDeviceGetStreamPriorityRange's scale (lower numbers first; 0, the default, is the lowest).
  explicit CudaStream(int priority = 0);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event without timing, ordering one stream's work after a point of another's.
class CudaEvent {
 public:
  CudaEvent();
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace qspec::cuda
