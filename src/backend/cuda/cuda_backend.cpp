// The CUDA backend: memory, argument checks (the CPU reference's, so both backends refuse the same calls) and
// the dispatch of every op to its launcher (launchers.h). Nothing here waits for the GPU except read() and
// synchronize(); write() returns once the host data has been copied out.
#include "backend/cuda/cuda_backend.h"

#include <fmt/ranges.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "backend/cpu/checks.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/device_resources.h"
#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace qspec {

namespace cuda {

namespace {

using cpu::require_activation;
using cpu::require_dtype;
using cpu::require_indices;
using cpu::require_shape;
using cpu::require_weight;

// Grid dimensions y are limited to 65535; rows of one call ride on them in some kernels.
constexpr int64_t kMaxRows = 65535;

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(DType dtype, int64_t rows, int64_t cols)
      : memory_(static_cast<size_t>(rows * cols) * dtype_size(dtype)) {
    tensor_ = Tensor::make(dtype, rows, cols, memory_.data());
  }

 private:
  DeviceMemory memory_;
};

size_t row_bytes(const Tensor& t) {
  return static_cast<size_t>(t.cols) * dtype_size(t.dtype);
}

size_t pitch_bytes(const Tensor& t) {
  return static_cast<size_t>(t.rows <= 1 ? t.cols : t.stride) * dtype_size(t.dtype);
}

void require_contiguous(std::string_view op, std::string_view arg, const Tensor& t) {
  if (!t.contiguous()) fail("{}: {} must be contiguous (stride {} != {} columns)", op, arg, t.stride, t.cols);
}

void require_rows_limit(std::string_view op, int64_t rows) {
  if (rows > kMaxRows) fail("{}: {} rows in one call; the CUDA backend takes at most {}", op, rows, kMaxRows);
}

void check_elementwise(std::string_view op, std::string_view a_name, std::string_view b_name,
                       const Tensor& out, const Tensor& a, const Tensor& b) {
  require_activation(op, a_name, a);
  require_activation(op, b_name, b);
  require_activation(op, "out", out);
  require_shape(op, b_name, b, a.rows, a.cols);
  require_shape(op, "out", out, a.rows, a.cols);
}

void check_norm(std::string_view op, const Tensor& out, const Tensor& x, const Tensor& weight) {
  require_activation(op, "x", x);
  require_activation(op, "out", out);
  require_weight(op, "weight", weight);
  if (weight.rows != 1 || weight.cols <= 0)
    fail("{}: weight has shape [{}, {}], expected [1, group]", op, weight.rows, weight.cols);
  if (x.cols % weight.cols != 0)
    fail("{}: x has {} columns, not a multiple of the weight's {} (the group size)", op, x.cols, weight.cols);
  require_shape(op, "out", out, x.rows, x.cols);
  require_rows_limit(op, x.rows);
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    int devices = 0;
    check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    if (devices == 0) fail("CUDA: no CUDA device is visible");
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&max_shared_bytes_, cudaDevAttrMaxSharedMemoryPerBlock, device),
               "cudaDeviceGetAttribute(max shared memory per block)");
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    device_name_ = properties.name;
    stream_ = std::make_unique<CudaStream>();
  }

  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }

  std::unique_ptr<Buffer> alloc(DType dtype, int64_t rows, int64_t cols) override {
    if (rows < 0 || cols < 0) fail("alloc: negative shape [{}, {}]", rows, cols);
    return std::make_unique<CudaBuffer>(dtype, rows, cols);
  }

  Tensor upload_weight(const TensorView& view, int64_t rows, int64_t cols) override {
    const int64_t numel =
        std::accumulate(view.shape.begin(), view.shape.end(), int64_t{1}, std::multiplies<>());
    if (rows < 0 || cols < 0 || numel != rows * cols)
      fail("upload_weight: tensor {} has shape [{}] ({} elements), expected [{}, {}]", view.name,
           fmt::join(view.shape, ", "), numel, rows, cols);
    DeviceMemory& memory = weights_.emplace_back(view.nbytes);
    if (view.nbytes > 0)
      check_cuda(cudaMemcpy(memory.data(), view.data, view.nbytes, cudaMemcpyHostToDevice),
                 fmt::format("upload of weight {} ({} bytes)", view.name, view.nbytes));
    return Tensor::make(view.dtype, rows, cols, memory.data());
  }

  void write(const Tensor& dst, const void* host) override {
    require_contiguous("write", "dst", dst);
    if (dst.numel() == 0) return;
    const size_t bytes = row_bytes(dst) * static_cast<size_t>(dst.rows);
    check_cuda(cudaMemcpyAsync(dst.data, host, bytes, cudaMemcpyHostToDevice, stream()), "write");
    // The caller may reuse `host` at once: wait for the copy (host memory here is pageable, not pinned).
    check_cuda(cudaStreamSynchronize(stream()), "write (synchronize)");
  }

  void read(void* host, const Tensor& src) override {
    require_contiguous("read", "src", src);
    if (src.numel() == 0) return;
    const size_t bytes = row_bytes(src) * static_cast<size_t>(src.rows);
    check_cuda(cudaMemcpyAsync(host, src.data, bytes, cudaMemcpyDeviceToHost, stream()), "read");
    check_cuda(cudaStreamSynchronize(stream()), "read (synchronize)");
  }

  void fill_zero(const Tensor& dst) override {
    if (dst.numel() == 0) return;
    check_cuda(cudaMemset2DAsync(dst.data, pitch_bytes(dst), 0, row_bytes(dst), static_cast<size_t>(dst.rows),
                                 stream()),
               "fill_zero");
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    if (dst.dtype != src.dtype)
      fail("copy: dst is {} but src is {}", dtype_name(dst.dtype), dtype_name(src.dtype));
    require_shape("copy", "dst", dst, src.rows, src.cols);
    if (dst.numel() == 0) return;
    check_cuda(cudaMemcpy2DAsync(dst.data, pitch_bytes(dst), src.data, pitch_bytes(src), row_bytes(src),
                                 static_cast<size_t>(src.rows), cudaMemcpyDeviceToDevice, stream()),
               "copy");
  }

  void synchronize() override { check_cuda(cudaStreamSynchronize(stream()), "synchronize"); }

  bool can_capture() const override { return true; }
  std::unique_ptr<StepGraph> capture(const std::function<void()>& record) override {
    return capture_graph(stream(), record);
  }

  void embed(const Tensor& out, const Tensor& table, const Tensor& ids) override {
    require_activation("embed", "out", out);
    require_weight("embed", "table", table);
    require_indices("embed", "ids", ids, out.rows);
    require_shape("embed", "out", out, ids.rows, table.cols);
    check_cuda(launch_embed(out, table, ids, stream()), "embed");
  }

  void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps,
               bool unit_offset) override {
    check_norm("rmsnorm", out, x, weight);
    check_cuda(launch_rmsnorm(out, x, weight, Tensor{}, eps, unit_offset, stream()), "rmsnorm");
  }

  void gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z,
                     float eps) override {
    check_norm("gated_rmsnorm", out, x, weight);
    require_activation("gated_rmsnorm", "z", z);
    require_shape("gated_rmsnorm", "z", z, x.rows, x.cols);
    check_cuda(launch_rmsnorm(out, x, weight, z, eps, false, stream()), "gated_rmsnorm");
  }

  void linear(const Tensor& out, const Tensor& x, const LinearWeight& w) override {
    require_activation("linear", "x", x);
    require_activation("linear", "out", out);
    if (x.cols != w.in_features)
      fail("linear: x has {} columns but the weight has in_features {}", x.cols, w.in_features);
    require_shape("linear", "out", out, x.rows, w.out_features);
    if (w.quantized()) {
      if (w.in_features % 8 != 0)
        fail("linear: W4A16 in_features {} is not a multiple of 8 (nibbles per packed word)", w.in_features);
      if (w.group_size <= 0) fail("linear: W4A16 group_size must be positive, got {}", w.group_size);
      require_dtype("linear", "packed weight", w.packed, DType::I32);
      require_shape("linear", "packed weight", w.packed, w.out_features, w.in_features / 8);
      require_weight("linear", "scales", w.scales);
      require_shape("linear", "scales", w.scales, w.out_features,
                    (w.in_features + w.group_size - 1) / w.group_size);
      check_cuda(launch_w4a16_linear(out, x, w.packed, w.scales, w.group_size, stream()), "linear (W4A16)");
    } else {
      require_weight("linear", "weight", w.weight);
      require_shape("linear", "weight", w.weight, w.out_features, w.in_features);
      check_cuda(launch_dense_linear(out, x, w.weight, stream()), "linear (dense)");
    }
  }

  void add(const Tensor& out, const Tensor& a, const Tensor& b) override {
    check_elementwise("add", "a", "b", out, a, b);
    check_cuda(launch_elementwise(Elementwise::Add, out, a, b, stream()), "add");
  }

  void silu_mul(const Tensor& out, const Tensor& gate, const Tensor& up) override {
    check_elementwise("silu_mul", "gate", "up", out, gate, up);
    check_cuda(launch_elementwise(Elementwise::SiluMul, out, gate, up, stream()), "silu_mul");
  }

  void sigmoid_mul(const Tensor& out, const Tensor& x, const Tensor& gate) override {
    check_elementwise("sigmoid_mul", "x", "gate", out, x, gate);
    check_cuda(launch_elementwise(Elementwise::SigmoidMul, out, x, gate, stream()), "sigmoid_mul");
  }

  void split_query_gate(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim) override {
    require_activation("split_query_gate", "qg", qg);
    require_activation("split_query_gate", "query", query);
    require_activation("split_query_gate", "gate", gate);
    if (head_dim <= 0 || qg.cols % (2 * head_dim) != 0)
      fail("split_query_gate: qg has {} columns, not a multiple of 2 * head_dim = {}", qg.cols, 2 * head_dim);
    require_shape("split_query_gate", "query", query, qg.rows, qg.cols / 2);
    require_shape("split_query_gate", "gate", gate, qg.rows, qg.cols / 2);
    check_cuda(launch_split_query_gate(query, gate, qg, head_dim, stream()), "split_query_gate");
  }

  void rope(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim, double theta) override {
    require_activation("rope", "x", x);
    require_indices("rope", "positions", positions, x.rows);
    if (head_dim <= 0 || x.cols % head_dim != 0)
      fail("rope: x has {} columns, not a multiple of head_dim {}", x.cols, head_dim);
    if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
      fail("rope: rotary_dim {} must be even and in (0, head_dim = {}]", rotary_dim, head_dim);
    if (rotary_dim / 2 > kMaxRotaryHalf)
      fail("rope: rotary_dim {} is above the CUDA backend's {}", rotary_dim, 2 * kMaxRotaryHalf);
    if (!(theta > 0.0)) fail("rope: theta must be positive, got {}", theta);
    // The CPU reference's formula, term for term, so that both backends rotate by the same fp32 angles.
    RopeFrequencies frequencies{};
    for (int i = 0; i < rotary_dim / 2; ++i)
      frequencies.inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                                                static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
    check_cuda(launch_rope(x, positions, head_dim, rotary_dim, frequencies, stream()), "rope");
  }

  void kv_store(const Tensor& cache, const Tensor& x, const Tensor& positions) override {
    require_activation("kv_store", "cache", cache);
    require_activation("kv_store", "x", x);
    require_indices("kv_store", "positions", positions, x.rows);
    if (x.cols != cache.cols) fail("kv_store: x has {} columns but the cache has {}", x.cols, cache.cols);
    check_cuda(launch_kv_store(cache, x, positions, stream()), "kv_store");
  }

  void attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const Tensor& positions, const AttentionShape& shape) override {
    require_activation("attention", "q", q);
    require_activation("attention", "out", out);
    require_activation("attention", "k_cache", k_cache);
    require_activation("attention", "v_cache", v_cache);
    if (shape.num_heads <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
        shape.num_heads % shape.num_kv_heads != 0)
      fail("attention: num_heads {} must be a positive multiple of num_kv_heads {} (head_dim {})",
           shape.num_heads, shape.num_kv_heads, shape.head_dim);
    if (shape.head_dim > kMaxAttentionHeadDim)
      fail("attention: head_dim {} is above the CUDA backend's {}", shape.head_dim, kMaxAttentionHeadDim);
    const int64_t q_cols = int64_t{shape.num_heads} * shape.head_dim;
    const int64_t kv_cols = int64_t{shape.num_kv_heads} * shape.head_dim;
    require_shape("attention", "q", q, q.rows, q_cols);
    require_shape("attention", "out", out, q.rows, q_cols);
    require_shape("attention", "k_cache", k_cache, k_cache.rows, kv_cols);
    require_shape("attention", "v_cache", v_cache, k_cache.rows, kv_cols);
    require_indices("attention", "positions", positions, q.rows);
    const size_t workspace_bytes =
        sizeof(float) * attention_workspace_floats(q.rows, shape.num_heads, shape.head_dim, k_cache.rows);
    // Grows rarely (the first call of a larger shape); cudaFree of the old one waits for its users.
    if (workspace_bytes > attention_workspace_.bytes()) attention_workspace_ = DeviceMemory(workspace_bytes);
    check_cuda(launch_attention(out, q, k_cache, v_cache, positions, shape.num_heads, shape.num_kv_heads,
                                shape.head_dim, shape.scale, static_cast<float*>(attention_workspace_.data()),
                                stream()),
               "attention");
  }

  void conv1d_silu(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight) override {
    require_activation("conv1d_silu", "x", x);
    require_activation("conv1d_silu", "out", out);
    require_activation("conv1d_silu", "state", state);
    require_weight("conv1d_silu", "weight", weight);
    if (weight.cols < 1 || weight.cols > kMaxConvKernel)
      fail("conv1d_silu: weight has {} columns, expected a kernel size in [1, {}]", weight.cols,
           kMaxConvKernel);
    require_shape("conv1d_silu", "weight", weight, x.cols, weight.cols);
    require_shape("conv1d_silu", "state", state, x.cols, weight.cols - 1);
    require_shape("conv1d_silu", "out", out, x.rows, x.cols);
    check_cuda(launch_conv1d_silu(out, x, state, weight, stream()), "conv1d_silu");
  }

  void gdn_gates(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a, const Tensor& a_log,
                 const Tensor& dt_bias) override {
    require_activation("gdn_gates", "b", b);
    require_activation("gdn_gates", "a", a);
    require_activation("gdn_gates", "beta", beta);
    require_activation("gdn_gates", "g", g);
    require_weight("gdn_gates", "a_log", a_log);
    require_weight("gdn_gates", "dt_bias", dt_bias);
    const int64_t heads = b.cols;
    require_shape("gdn_gates", "a", a, b.rows, heads);
    require_shape("gdn_gates", "beta", beta, b.rows, heads);
    require_shape("gdn_gates", "g", g, b.rows, heads);
    require_shape("gdn_gates", "a_log", a_log, 1, heads);
    require_shape("gdn_gates", "dt_bias", dt_bias, 1, heads);
    check_cuda(launch_gdn_gates(beta, g, b, a, a_log, dt_bias, stream()), "gdn_gates");
  }

  void gated_delta_rule(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                        const Tensor& state, const GdnShape& shape) override {
    constexpr std::string_view op = "gated_delta_rule";
    const auto& [nk, nv, dk, dv] = shape;
    if (nk <= 0 || nv <= 0 || dk <= 0 || dv <= 0 || nv % nk != 0)
      fail(
          "{}: bad GdnShape (num_key_heads {}, num_value_heads {}, key_head_dim {}, value_head_dim {}): dims "
          "must be positive and num_value_heads a multiple of num_key_heads",
          op, nk, nv, dk, dv);
    if (gated_delta_rule_shared_bytes(dk) > static_cast<size_t>(max_shared_bytes_))
      fail("{}: key_head_dim {} needs {} bytes of shared memory per block, the device has {}", op, dk,
           gated_delta_rule_shared_bytes(dk), max_shared_bytes_);
    require_activation(op, "qkv", qkv);
    require_activation(op, "out", out);
    require_activation(op, "beta", beta);
    require_activation(op, "g", g);
    require_activation(op, "state", state);
    const int64_t tokens = qkv.rows;
    require_shape(op, "qkv", qkv, tokens, 2 * int64_t{nk} * dk + int64_t{nv} * dv);
    require_shape(op, "out", out, tokens, int64_t{nv} * dv);
    require_shape(op, "beta", beta, tokens, nv);
    require_shape(op, "g", g, tokens, nv);
    require_shape(op, "state", state, int64_t{nv} * dk, dv);
    check_cuda(launch_gated_delta_rule(out, qkv, beta, g, state, nk, nv, dk, dv, stream()), op);
  }

 private:
  cudaStream_t stream() const { return stream_->get(); }

  std::string device_name_;
  int max_shared_bytes_ = 0;
  std::unique_ptr<CudaStream> stream_;
  std::vector<DeviceMemory> weights_;  // uploaded checkpoint tensors, freed with the backend
  DeviceMemory attention_workspace_;   // partial results of attention's key splits
};

}  // namespace

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend() {
  return std::make_unique<cuda::CudaBackend>();
}

}  // namespace qspec
