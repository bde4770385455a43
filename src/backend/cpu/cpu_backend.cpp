// Memory of the CPU backend, and the factory.
#include "backend/cpu/cpu_backend.h"

#include <cstring>
#include <fstream>
#include <vector>

#include "backend/op_checks.h"
#include "io/safetensors.h"

namespace qspec {

namespace cpu {

namespace {

class CpuBuffer final : public Buffer {
 public:
  CpuBuffer(DType dtype, int64_t rows, int64_t cols)
      : storage_((static_cast<size_t>(rows * cols) * dtype_size(dtype) + sizeof(uint64_t) - 1) /
                 sizeof(uint64_t)) {
    tensor_ = Tensor::make(dtype, rows, cols, storage_.data());
  }

 private:
  std::vector<uint64_t> storage_;  // 8-byte words: aligned for every dtype, and zero-initialised
};

// Row r of a tensor of any dtype, as bytes.
char* row_start(const Tensor& t, int64_t r) {
  return static_cast<char*>(t.data) + r * t.stride * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace

std::string CpuBackend::device_name() const {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "cpu";
}

std::unique_ptr<Buffer> CpuBackend::alloc(DType dtype, int64_t rows, int64_t cols) {
  check_alloc_args(rows, cols);
  return std::make_unique<CpuBuffer>(dtype, rows, cols);
}

Tensor CpuBackend::upload_weight(const TensorView& view, int64_t rows, int64_t cols) {
  check_upload_weight_args(view, rows, cols);
  // The view of the read-only mapping is exposed as mutable memory only because Tensor has one pointer type;
  // ops never write their weight arguments.
  return Tensor::make(view.dtype, rows, cols, const_cast<uint8_t*>(view.data));
}

void CpuBackend::write(const Tensor& dst, const void* host) {
  require_contiguous("write", "dst", dst);
  if (dst.numel() > 0) std::memcpy(dst.data, host, dst.row_bytes() * static_cast<size_t>(dst.rows));
}

void CpuBackend::read(void* host, const Tensor& src) {
  if (src.numel() == 0) return;
  for (int64_t r = 0; r < src.rows; ++r)
    std::memcpy(static_cast<char*>(host) + static_cast<size_t>(r) * src.row_bytes(), row_start(src, r),
                src.row_bytes());
}

void CpuBackend::fill_zero(const Tensor& dst) {
  for (int64_t r = 0; r < dst.rows; ++r) std::memset(row_start(dst, r), 0, dst.row_bytes());
}

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  check_copy_args(dst, src);
  for (int64_t r = 0; r < dst.rows; ++r) std::memmove(row_start(dst, r), row_start(src, r), dst.row_bytes());
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<cpu::CpuBackend>();
}

}  // namespace qspec
