// RAII owners of CUDA resources: device memory and a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace qspec::cuda {

class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory: copies from it to the device are asynchronous.
class PinnedHostMemory {
 public:
  PinnedHostMemory() = default;
  explicit PinnedHostMemory(size_t bytes);
  ~PinnedHostMemory();
  PinnedHostMemory(PinnedHostMemory&& other) noexcept;
  PinnedHostMemory& operator=(PinnedHostMemory&& other) noexcept;
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class CudaStream {
 public:
  CudaStream();
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace qspec::cuda
