// The CUDA backend: memory, argument checks (backend/op_checks.h, so both backends refuse the same calls) and
// the dispatch of every op to its launcher (launchers.h). Nothing here waits for the GPU except read() and
// synchronize(); write() returns once the host data has been copied out.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/device_resources.h"
#include "backend/cuda/gemm_linear.h"
#include "backend/cuda/launchers.h"
#include "backend/cuda/packed_int4_order.h"
#include "backend/cuda/pdl.cuh"
#include "backend/op_checks.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace qspec {

namespace cuda {

namespace {

// Grid dimensions y are limited to 65535; rows of one call ride on them in some kernels.
constexpr int64_t kMaxRows = 65535;
// Rows of logits the argmax workspace holds at least.
constexpr int64_t kArgmaxWorkspaceRows = 64;

// The last linear's output when its split partials were left for the op that reads it (add_rmsnorm's
// delta, silu_gated_linear's gate_up): one sums kernel node fewer in a verify or draft step for each.
// Shared with the buffers, so that a buffer freed first drops it: no sums kernel may write freed memory.
struct UnsummedOutput {
  Tensor values;
  UnsummedSplits splits;
};

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(DType dtype, int64_t rows, int64_t cols, std::weak_ptr<UnsummedOutput> unsummed)
      : memory_(static_cast<size_t>(rows * cols) * dtype_size(dtype)), unsummed_(std::move(unsummed)) {
    tensor_ = Tensor::make(dtype, rows, cols, memory_.data());
  }
  ~CudaBuffer() override {
    const std::shared_ptr<UnsummedOutput> unsummed = unsummed_.lock();
    if (!unsummed || !unsummed->splits.any()) return;
    const auto begin = reinterpret_cast<uintptr_t>(memory_.data()),
               at = reinterpret_cast<uintptr_t>(unsummed->values.data);
    if (at >= begin && at < begin + memory_.bytes()) *unsummed = UnsummedOutput{};
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

 private:
  DeviceMemory memory_;
  std::weak_ptr<UnsummedOutput> unsummed_;
};

size_t pitch_bytes(const Tensor& t) {
  return static_cast<size_t>(t.rows <= 1 ? t.cols : t.stride) * dtype_size(t.dtype);
}

void require_rows_limit(std::string_view op, int64_t rows) {
  if (rows > kMaxRows) fail("{}: {} rows in one call; the CUDA backend takes at most {}", op, rows, kMaxRows);
}

void check_norm(std::string_view op, const Tensor& out, const Tensor& x, const Tensor& weight) {
  check_norm_args(op, out, x, weight);
  require_rows_limit(op, x.rows);
}

// The CPU reference's formula, term for term, so that both backends rotate by the same fp32 angles.
RopeFrequencies rope_frequencies(std::string_view op, int rotary_dim, double theta) {
  if (rotary_dim / 2 > kMaxRotaryHalf)
    fail("{}: rotary_dim {} is above the CUDA backend's {}", op, rotary_dim, 2 * kMaxRotaryHalf);
  check_rope_theta(theta);
  RopeFrequencies frequencies{};
  for (int i = 0; i < rotary_dim / 2; ++i)
    frequencies.inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                                              static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
  return frequencies;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options) : bf16_copies_(options.bf16_copies) {
    int devices = 0;
    check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    if (devices == 0) fail("CUDA: no CUDA device is visible");
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&max_shared_bytes_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
               "cudaDeviceGetAttribute(max shared memory per block, opt-in)");
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    device_name_ = properties.name;
    // The side stream's blocks (beside: a commit next to a draft step) only fill what the main stream's leave
    // free: the main stream runs at the highest priority, the side stream at the lowest.
    int lowest_priority = 0, highest_priority = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&lowest_priority, &highest_priority),
               "cudaDeviceGetStreamPriorityRange");
    stream_ = std::make_unique<CudaStream>(highest_priority);
    side_stream_ = std::make_unique<CudaStream>(lowest_priority);
    issued_ = std::make_unique<CudaEvent>();
    side_done_ = std::make_unique<CudaEvent>();
    // Decided here, before any launch can be inside a stream capture (pdl.cuh).
    static_cast<void>(programmatic_launch_enabled());
    static_cast<void>(clusters_supported());
    static_cast<void>(linear_tensor_copies_supported());
    w4a16_gemm_init();
  }

  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return device_name_; }

  std::unique_ptr<Buffer> alloc(DType dtype, int64_t rows, int64_t cols) override {
    require_main_stream("alloc");
    check_alloc_args(rows, cols);
    return std::make_unique<CudaBuffer>(dtype, rows, cols, unsummed_);
  }

  Tensor upload_weight(const TensorView& view, int64_t rows, int64_t cols) override {
    check_upload_weight_args(view, rows, cols);
    DeviceMemory& memory = weights_.emplace_back(view.nbytes);
    if (view.nbytes > 0)
      check_cuda(cudaMemcpy(memory.data(), view.data, view.nbytes, cudaMemcpyHostToDevice),
                 fmt::format("upload of weight {} ({} bytes)", view.name, view.nbytes));
    return Tensor::make(view.dtype, rows, cols, memory.data());
  }

  Tensor upload_packed_int4(const TensorView& view, int64_t rows, int64_t words) override {
    check_upload_weight_args(view, rows, words);
    if (view.dtype != DType::I32)
      fail("upload_packed_int4: tensor {} is {}, expected I32", view.name, dtype_name(view.dtype));
    std::vector<uint32_t> ordered(static_cast<size_t>(rows * words));
    packed_int4_device_order(ordered.data(), view.data, rows, words);
    TensorView ordered_view = view;
    ordered_view.data = reinterpret_cast<const uint8_t*>(ordered.data());
    return upload_weight(ordered_view, rows, words);
  }

  // Made unless bf16_copies is off, while a quarter of the device's memory stays free after it (room for the
  // KV cache and workspaces of long contexts); the 4B's body is 7.1 GB of BF16 beside its 2.1 GB of W4A16.
  std::unique_ptr<Buffer> dequantized_copy(const LinearWeight& w) override {
    if (!w.quantized() || !bf16_copies_) return nullptr;
    const auto bytes = static_cast<double>(w.out_features * w.in_features) * 2.0;
    size_t free = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    if (static_cast<double>(free) - bytes < 0.25 * static_cast<double>(total)) return nullptr;
    auto copy = std::make_unique<CudaBuffer>(DType::BF16, w.out_features, w.in_features, unsummed_);
    GemmLinear::dequantize(copy->tensor().data, w, stream());
    return copy;
  }

  void write_packed_int4(const Tensor& dst, const void* host) override {
    if (dst.dtype != DType::I32) fail("write_packed_int4: dst is {}, expected I32", dtype_name(dst.dtype));
    std::vector<uint32_t> ordered(static_cast<size_t>(dst.rows * dst.cols));
    packed_int4_device_order(ordered.data(), host, dst.rows, dst.cols);
    write(dst, ordered.data());
  }

  void write(const Tensor& dst, const void* host) override {
    require_main_stream("write");
    require_contiguous("write", "dst", dst);
    if (dst.numel() == 0) return;
    const size_t bytes = dst.row_bytes() * static_cast<size_t>(dst.rows);
    // The caller may reuse `host` at once, so the bytes go through pinned staging memory, whose regions are
    // reused only after a synchronisation: a step's small writes (ids, positions) then cost no wait.
    if (bytes > kStagingBytes) {
      check_cuda(cudaMemcpyAsync(dst.data, host, bytes, cudaMemcpyHostToDevice, stream()), "write");
      synchronize();
      return;
    }
    if (staging_used_ + bytes > kStagingBytes) synchronize();
    if (staging_.bytes() == 0) staging_ = PinnedHostMemory(kStagingBytes);
    void* slot = static_cast<char*>(staging_.data()) + staging_used_;
    std::memcpy(slot, host, bytes);
    staging_used_ += (bytes + 15) / 16 * 16;
    check_cuda(cudaMemcpyAsync(dst.data, slot, bytes, cudaMemcpyHostToDevice, stream()), "write");
  }

  void read(void* host, const Tensor& src) override {
    require_main_stream("read");
    if (src.numel() == 0) return;
    join_side();
    check_cuda(cudaMemcpy2DAsync(host, src.row_bytes(), src.data, pitch_bytes(src), src.row_bytes(),
                                 static_cast<size_t>(src.rows), cudaMemcpyDeviceToHost, stream()),
               "read");
    synchronize();
  }

  void fill_zero(const Tensor& dst) override {
    if (dst.numel() == 0) return;
    check_cuda(cudaMemset2DAsync(dst.data, pitch_bytes(dst), 0, dst.row_bytes(),
                                 static_cast<size_t>(dst.rows), stream()),
               "fill_zero");
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    check_copy_args(dst, src);
    if (dst.numel() == 0) return;
    check_cuda(cudaMemcpy2DAsync(dst.data, pitch_bytes(dst), src.data, pitch_bytes(src), src.row_bytes(),
                                 static_cast<size_t>(src.rows), cudaMemcpyDeviceToDevice, stream()),
               "copy");
  }

  void synchronize() override {
    require_main_stream("synchronize");
    join_side();
    check_cuda(cudaStreamSynchronize(stream()), "synchronize");
    staging_used_ = 0;  // every staged copy has completed
  }

  int64_t device_memory_in_use() const override {
    size_t free = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return static_cast<int64_t>(total - free);
  }

  void beside(const std::function<void()>& ops) override {
    if (on_side_) {
      ops();
      return;
    }
    settle_split_sums();  // on the main stream, before the side stream starts after it
    check_cuda(cudaEventRecord(issued_->get(), stream_->get()), "beside: cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(side_stream_->get(), issued_->get(), 0), "beside: cudaStreamWaitEvent");
    on_side_ = true;
    side_pending_ = true;  // also after a throw: whatever `ops` issued is waited for
    try {
      ops();
      settle_split_sums();  // on the side stream, before its end is recorded
    } catch (...) {
      *unsummed_ = UnsummedOutput{};  // a failed op's partials: no sums kernel on the wrong stream
      on_side_ = false;
      static_cast<void>(cudaEventRecord(side_done_->get(), side_stream_->get()));
      throw;
    }
    on_side_ = false;
    check_cuda(cudaEventRecord(side_done_->get(), side_stream_->get()), "beside: cudaEventRecord");
  }

  void join_side() override {
    require_main_stream("join_side");
    if (!side_pending_) return;
    check_cuda(cudaStreamWaitEvent(stream_->get(), side_done_->get(), 0), "join_side: cudaStreamWaitEvent");
    side_pending_ = false;
  }

  bool can_capture() const override { return true; }
  uint64_t workspace_generation() const override {
    return workspace_generation_ + (gemm_ ? gemm_->scratch_generation() : 0);
  }
  // A replay, like any op, comes after the pending split sums: the graph reads its inputs from memory and may
  // overwrite the partials.
  class SettlingStepGraph final : public StepGraph {
   public:
    SettlingStepGraph(CudaBackend& backend, std::unique_ptr<StepGraph> graph)
        : backend_(backend), graph_(std::move(graph)) {}
    void launch() override {
      backend_.settle_split_sums();
      graph_->launch();
    }

   private:
    CudaBackend& backend_;
    std::unique_ptr<StepGraph> graph_;
  };

  std::unique_ptr<StepGraph> capture(const std::function<void()>& record) override {
    return std::make_unique<SettlingStepGraph>(*this, capture_graph(stream(), [&] {
      try {
        record();
        settle_split_sums();  // inside the graph
      } catch (...) {
        *unsummed_ = UnsummedOutput{};  // a linear only recorded, never run: no sums of its partials
        throw;
      }
    }));
  }

  void embed(const Tensor& out, const Tensor& table, const Tensor& ids) override {
    check_embed_args(out, table, ids);
    check_cuda(launch_embed(out, table, ids, stream()), "embed");
  }

  void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps,
               bool unit_offset) override {
    check_norm("rmsnorm", out, x, weight);
    check_cuda(launch_rmsnorm(out, x, weight, Tensor{}, eps, unit_offset, stream()), "rmsnorm");
  }

  void add_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& delta, const Tensor& weight, float eps,
                   bool unit_offset) override {
    check_add_rmsnorm_args(out, x, delta, weight);
    require_rows_limit("add_rmsnorm", x.rows);
    const UnsummedSplits delta_splits = take_unsummed(delta, {x, out});
    check_cuda(launch_add_rmsnorm(out, x, delta, delta_splits, weight, eps, unit_offset, stream()),
               "add_rmsnorm");
  }

  // Prefill: the norm kernel writes the rows in BF16 straight into cuBLAS's operand (and in F32 only when
  // kept), so the projections skip linear's pass that rounds them: the same values, one pass over the rows
  // fewer per call and, with the rows as scratch, half the norm's writes.
  void add_rmsnorm_linear(std::span<const LinearProjection> projections, const Tensor& normed,
                          NormedRows rows, const Tensor& x, const Tensor& delta, const Tensor& weight,
                          float eps, bool unit_offset) override {
    const auto takes = [&](const LinearProjection& p) { return gemm_takes(x, p.w); };
    if (projections.empty() || !std::all_of(projections.begin(), projections.end(), takes)) {
      // checks the arguments itself
      Backend::add_rmsnorm_linear(projections, normed, rows, x, delta, weight, eps, unit_offset);
      return;
    }
    check_add_rmsnorm_linear_args(projections, normed, x, delta, weight);
    require_rows_limit("add_rmsnorm_linear", x.rows);
    GemmLinear& gemm = gemm_linear();
    void* operand = gemm.operand(x.rows, x.cols, stream());
    check_cuda(launch_rmsnorm_to_bf16(operand, rows == NormedRows::Kept ? normed : Tensor{}, x, delta, weight,
                                      eps, unit_offset, stream()),
               "add_rmsnorm_linear (norm)");
    for (const LinearProjection& p : projections) gemm.multiply(p.out, operand, p.w, stream());
  }

  void gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z,
                     float eps) override {
    check_norm("gated_rmsnorm", out, x, weight);
    check_norm_gate_args(z, x);
    check_cuda(launch_rmsnorm(out, x, weight, z, eps, false, stream()), "gated_rmsnorm");
  }

  void linear(const Tensor& out, const Tensor& x, const LinearWeight& w) override {
    check_linear_args(out, x, w);
    if (linear_mma_supports(x, w)) {
      LinearMmaWorkspace workspace = linear_mma_workspace(x.rows, w);
      int splits = 0;
      workspace.unsummed_splits = &splits;
      check_cuda(launch_linear_mma(out, x, w, workspace, stream()), "linear (tensor cores)");
      if (splits > 1)
        *unsummed_ = {out, UnsummedSplits::packed(workspace.partials, splits, out.rows, out.cols)};
      return;
    }
    if (gemm_takes(x, w)) {
      gemm_linear().run(out, x, nullptr, RowGate::None, w, stream());
      return;
    }
    if (w.quantized())
      check_cuda(launch_w4a16_linear(out, x, w.packed, w.scales, w.group_size, stream()), "linear (W4A16)");
    else
      check_cuda(launch_dense_linear(out, x, w.weight, stream()), "linear (dense)");
  }

  // One row (decode): the tensor-core linear stages silu(gate) * up itself, no silu_mul launch (act unused).
  // More rows than the tensor-core linears take (prefill): the BF16 operand is made from gate_up in one pass
  // (GemmLinear::run; act unused). Between the two, the two ops: the many-row kernel stages x on its
  // critical path, where the activation made verify 3% slower (H200, session 6). The values are the same
  // every way.
  void silu_gated_linear(const Tensor& out, const Tensor& gate_up, const Tensor& act,
                         const LinearWeight& w) override {
    check_silu_gated_linear_args(out, gate_up, act, w);
    const bool one_row = gated_linear_mma_supports(gate_up, w);
    const int64_t intermediate = w.in_features;
    if (!one_row && !gemm_takes(gate_up, w)) {  // the two ops, gate_up's split sums made by silu_mul's kernel
      const UnsummedSplits splits = take_unsummed(gate_up, {act});
      check_cuda(launch_elementwise(Elementwise::SiluMul, act, gate_up.cols_view(0, intermediate),
                                    gate_up.cols_view(intermediate, intermediate), stream(), splits,
                                    splits.cols_from(intermediate)),
                 "silu_gated_linear (silu_mul)");
      linear(out, act, w);
      return;
    }
    if (one_row) {
      check_cuda(launch_gated_linear_mma(out, gate_up, w, linear_mma_workspace(gate_up.rows, w), stream()),
                 "silu_gated_linear (tensor cores)");
      return;
    }
    gemm_linear().run(out, gate_up.cols_view(0, intermediate),
                      gate_up.cols_view(intermediate, intermediate).ptr<const float>(), RowGate::SiluMul, w,
                      stream());
  }

  // Prefill: x * sigmoid(gate) made by the pass that rounds x to BF16 for cuBLAS (x left as it is).
  void sigmoid_gated_linear(const Tensor& out, const Tensor& x, const Tensor& gate,
                            const LinearWeight& w) override {
    if (!gemm_takes(x, w) || gate.stride != x.stride) {
      Backend::sigmoid_gated_linear(out, x, gate, w);  // checks the arguments itself
      return;
    }
    check_sigmoid_gated_linear_args(out, x, gate, w);
    gemm_linear().run(out, x, gate.ptr<const float>(), RowGate::SigmoidMul, w, stream());
  }

  void add(const Tensor& out, const Tensor& a, const Tensor& b) override {
    check_elementwise_args("add", "a", "b", out, a, b);
    check_cuda(launch_elementwise(Elementwise::Add, out, a, b, stream()), "add");
  }

  void silu_mul(const Tensor& out, const Tensor& gate, const Tensor& up) override {
    check_elementwise_args("silu_mul", "gate", "up", out, gate, up);
    check_cuda(launch_elementwise(Elementwise::SiluMul, out, gate, up, stream()), "silu_mul");
  }

  void sigmoid_mul(const Tensor& out, const Tensor& x, const Tensor& gate) override {
    check_elementwise_args("sigmoid_mul", "x", "gate", out, x, gate);
    check_cuda(launch_elementwise(Elementwise::SigmoidMul, out, x, gate, stream()), "sigmoid_mul");
  }

  void split_query_gate(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim) override {
    check_split_query_gate_args(query, gate, qg, head_dim);
    check_cuda(launch_split_query_gate(query, gate, qg, head_dim, stream()), "split_query_gate");
  }

  void rope(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim, double theta) override {
    check_rope_args(x, positions, head_dim, rotary_dim);
    check_cuda(launch_rope(x, positions, head_dim, rotary_dim, rope_frequencies("rope", rotary_dim, theta),
                           stream()),
               "rope");
  }

  void attention_prologue(const Tensor& query, const Tensor& gate, const Tensor& qkv, const Tensor& q_norm,
                          const Tensor& k_norm, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& positions, const AttentionPrologueShape& shape) override {
    check_attention_prologue_args(query, gate, qkv, q_norm, k_norm, k_cache, v_cache, positions, shape);
    const AttentionPrologueLayer layer{query, gate, qkv, q_norm, k_norm, k_cache, v_cache};
    launch_prologues({&layer, 1}, positions, shape);
  }

  void attention_prologues(std::span<const AttentionPrologueLayer> layers, const Tensor& positions,
                           const AttentionPrologueShape& shape) override {
    check_attention_prologues_args(layers, positions, shape);
    launch_prologues(layers, positions, shape);
  }

  void kv_store(const Tensor& cache, const Tensor& x, const Tensor& positions) override {
    check_kv_store_args(cache, x, positions);
    check_cuda(launch_kv_store(cache, x, positions, stream()), "kv_store");
  }

  void attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const Tensor& positions, const AttentionShape& shape) override {
    check_attention_operands(out, q, k_cache, v_cache, shape);
    if (shape.head_dim > kMaxAttentionHeadDim)
      fail("attention: head_dim {} is above the CUDA backend's {}", shape.head_dim, kMaxAttentionHeadDim);
    check_attention_widths(out, q, k_cache, v_cache, positions, shape);
    run_attention("attention", out, q, k_cache, v_cache, positions, shape, {});
  }

  // Up to 64 query rows per KV head (the drafter's block: 16 tokens x 4 heads) go to the attention kernels,
  // which split the keys over blocks and read each once for all rows of a KV head; more rows to the kernel
  // of a block per (row, head), which reads its range once per row and head.
  void windowed_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& key_begin, const Tensor& key_end,
                          const AttentionShape& shape) override {
    check_windowed_attention_args(out, q, k_cache, v_cache, key_begin, key_end, shape);
    if (shape.head_dim > kMaxAttentionHeadDim)
      fail("windowed_attention: head_dim {} is above the CUDA backend's {}", shape.head_dim,
           kMaxAttentionHeadDim);
    require_rows_limit("windowed_attention", q.rows);
    if (attention_takes_first_keys(out, q, k_cache, v_cache, shape.num_heads, shape.num_kv_heads,
                                   shape.head_dim)) {
      run_attention("windowed_attention", out, q, k_cache, v_cache, key_end, shape, {key_begin, true});
      return;
    }
    check_cuda(launch_windowed_attention(out, q, k_cache, v_cache, key_begin, key_end, shape.num_heads,
                                         shape.num_kv_heads, shape.head_dim, shape.scale, stream()),
               "windowed_attention");
  }

  void conv1d_silu(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                   bool update_state) override {
    check_conv1d_operands(out, x, state, weight);
    if (weight.cols < 1 || weight.cols > kMaxConvKernel)
      fail("conv1d_silu: weight has {} columns, expected a kernel size in [1, {}]", weight.cols,
           kMaxConvKernel);
    check_conv1d_shapes(out, x, state, weight);
    check_cuda(launch_conv1d_silu(out, x, state, weight, update_state, stream()), "conv1d_silu");
  }

  void gdn_gates(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a, const Tensor& a_log,
                 const Tensor& dt_bias) override {
    check_gdn_gates_args(beta, g, b, a, a_log, dt_bias);
    check_cuda(launch_gdn_gates(beta, g, b, a, a_log, dt_bias, stream()), "gdn_gates");
  }

  void gdn_gates_linear(const Tensor& beta, const Tensor& g, const Tensor& x, const LinearWeight& w_b,
                        const LinearWeight& w_a, const Tensor& a_log, const Tensor& dt_bias) override {
    check_gdn_gates_linear_args(beta, g, x, w_b, w_a, a_log, dt_bias);
    if (gemm_takes(x, w_b) && gemm_takes(x, w_a)) {
      // Prefill: as the default's two linears (same values), with x rounded to BF16 once.
      gemm_linear().run_pair(beta, w_b, g, w_a, x, stream());
      gdn_gates(beta, g, beta, g, a_log, dt_bias);
      return;
    }
    if (!gdn_gates_linear_supports(x, w_b, w_a)) {
      Backend::gdn_gates_linear(beta, g, x, w_b, w_a, a_log, dt_bias);
      return;
    }
    check_cuda(launch_gdn_gates_linear(beta, g, x, w_b, w_a, a_log, dt_bias, stream()), "gdn_gates_linear");
  }

  void gated_delta_rule(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                        const Tensor& state, const GdnShape& shape, const GdnStateUpdate& update) override {
    const auto& [nk, nv, dk, dv] = shape;
    check_gdn_shape(shape);
    check_gated_delta_rule_args(out, qkv, beta, g, state, shape, update);
    if (!update.replay.empty() && dv > kGdnCommitMaxValueDim)  // refused here, not at the commit after it
      fail("gated_delta_rule: a replay record with value_head_dim {}, above the CUDA commit's {}", dv,
           kGdnCommitMaxValueDim);
    if (qkv.rows >= kGdnChunkedMinTokens && gated_delta_rule_chunked_fits(dk, dv, max_shared_bytes_)) {
      const size_t bytes = gated_delta_rule_chunked_workspace_bytes(qkv.rows, nv, dk, dv);
      // Grows rarely (the first prefill of a longer prompt); cudaFree of the old one waits for its users.
      grow(gdn_workspace_, bytes);
      check_cuda(launch_gated_delta_rule_chunked(out, qkv, beta, g, state, nk, nv, dk, dv, update.advance,
                                                 gdn_workspace_.data(), stream()),
                 "gated_delta_rule (chunked)");
      return;
    }
    if (dk > kGdnRecurrentMaxKeyDim)
      fail("gated_delta_rule: key_head_dim {} is above the CUDA backend's {}", dk, kGdnRecurrentMaxKeyDim);
    check_cuda(launch_gated_delta_rule_recurrent(out, qkv, beta, g, state, nk, nv, dk, dv, update, stream()),
               "gated_delta_rule");
  }

  void gdn_mixer(const Tensor& out, const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                 const Tensor& core, const Tensor& qkvz, const Tensor& x, const Tensor& conv_state,
                 const Tensor& recurrent_state, const GdnMixerWeights& w, const GdnShape& shape, float eps,
                 const GdnStateUpdate& update) override {
    if (!gdn_mixer_fits(qkvz, x, recurrent_state, w, shape)) {
      Backend::gdn_mixer(out, conv_out, beta, g, core, qkvz, x, conv_state, recurrent_state, w, shape, eps,
                         update);  // checks the arguments itself
      return;
    }
    check_gdn_mixer_args(out, conv_out, beta, g, core, qkvz, x, conv_state, recurrent_state, w, shape,
                         update);
    check_cuda(launch_gdn_mixer({out, conv_out, beta, g, core, qkvz, x, conv_state, recurrent_state}, w,
                                shape, eps, update, stream()),
               "gdn_mixer");
  }

  // Prefill: the mixer's ops up to core, then its gated norm writes the rows in BF16 straight into cuBLAS's
  // operand and not in F32 (only the projection reads them), so the projection skips linear's pass that
  // rounds them: the same values, the F32 rows neither written nor read back.
  void gdn_mixer_linear(const LinearProjection& projection, const Tensor& gated, const Tensor& conv_out,
                        const Tensor& beta, const Tensor& g, const Tensor& core, const Tensor& qkvz,
                        const Tensor& x, const Tensor& conv_state, const Tensor& recurrent_state,
                        const GdnMixerWeights& w, const GdnShape& shape, float eps,
                        const GdnStateUpdate& update) override {
    if (!gemm_takes(gated, projection.w)) {
      // the fused mixer kernel or the mixer's ops, then linear; checks the arguments itself
      Backend::gdn_mixer_linear(projection, gated, conv_out, beta, g, core, qkvz, x, conv_state,
                                recurrent_state, w, shape, eps, update);
      return;
    }
    check_gdn_mixer_linear_args(projection, gated, conv_out, beta, g, core, qkvz, x, conv_state,
                                recurrent_state, w, shape, update);
    require_rows_limit("gdn_mixer_linear", gated.rows);
    gdn_mixer_to_core(conv_out, beta, g, core, qkvz, x, conv_state, recurrent_state, w, shape, update);
    // After the gates' projections, whose BF16 copy of x may have grown (moved) the operand's scratch.
    GemmLinear& gemm = gemm_linear();
    void* operand = gemm.operand(gated.rows, gated.cols, stream());
    const Tensor z = qkvz.cols_view(conv_out.cols, qkvz.cols - conv_out.cols);
    check_cuda(launch_gated_rmsnorm_to_bf16(operand, core, w.norm_weight, z, eps, stream()),
               "gdn_mixer_linear (gated norm)");
    gemm.multiply(projection.out, operand, projection.w, stream());
  }

  void gdn_commit(std::span<const GdnCommitLayer> layers, const GdnShape& shape,
                  const Tensor& rows) override {
    check_gdn_commit_args(layers, shape, rows);
    for (size_t i = 0; i < layers.size(); ++i)
      if (layers[i].conv_state.cols > kMaxConvKernel - 1)
        fail("gdn_commit: layers[{}].conv_state has {} columns, expected at most {} (kernel sizes up to {})",
             i, layers[i].conv_state.cols, kMaxConvKernel - 1, kMaxConvKernel);
    if (shape.value_head_dim > kGdnCommitMaxValueDim)
      fail("gdn_commit: value_head_dim {} is above the CUDA backend's {}", shape.value_head_dim,
           kGdnCommitMaxValueDim);
    check_cuda(launch_gdn_commit(layers.data(), layers.size(), rows.ptr<const int32_t>(), shape.num_key_heads,
                                 shape.num_value_heads, shape.key_head_dim, shape.value_head_dim, stream()),
               "gdn_commit");
  }

  void argmax(const Tensor& out_ids, const Tensor& logits) override {
    check_argmax_args(out_ids, logits);
    require_rows_limit("argmax", logits.rows);
    // Sized for at least kArgmaxWorkspaceRows rows, so that the calls inside step graphs (a draft step's 15
    // rows) never see it reallocated by a later call of up to that many rows (a verify's 16, a decode's 1): a
    // recorded graph keeps the old pointer. Wider or many-row calls grow it (cudaFree waits for its users).
    const int64_t rows = logits.rows > kArgmaxWorkspaceRows ? logits.rows : kArgmaxWorkspaceRows;
    const size_t bytes = argmax_workspace_bytes(rows, logits.cols);
    grow(argmax_workspace_, bytes);
    check_cuda(launch_argmax(out_ids, logits, argmax_workspace_.data(), stream()), "argmax");
  }

 private:
  // attention_prologue(s) after their checks: one launch per kMaxPrologueLayers layers.
  void launch_prologues(std::span<const AttentionPrologueLayer> layers, const Tensor& positions,
                        const AttentionPrologueShape& shape) {
    if (shape.head_dim > kMaxAttentionHeadDim)
      fail("attention_prologue: head_dim {} is above the CUDA backend's {}", shape.head_dim,
           kMaxAttentionHeadDim);
    if (layers.empty()) return;
    require_rows_limit("attention_prologue", layers.front().qkv.rows);
    for (size_t i = 1; i < layers.size(); ++i)
      if (layers[i].k_norm.dtype != layers.front().k_norm.dtype)
        fail("attention_prologues: layers[{}].k_norm is {}, layers[0]'s {} (one weight type a launch)", i,
             dtype_name(layers[i].k_norm.dtype), dtype_name(layers.front().k_norm.dtype));
    const RopeFrequencies frequencies =
        rope_frequencies("attention_prologue", shape.rotary_dim, shape.rope_theta);
    const PrologueShape prologue{shape.num_heads,  shape.num_kv_heads, shape.head_dim,
                                 shape.rotary_dim, shape.eps,          shape.unit_offset};
    for (size_t first = 0; first < layers.size(); first += kMaxPrologueLayers)
      check_cuda(launch_attention_prologues(layers.data() + first,
                                            std::min(kMaxPrologueLayers, layers.size() - first), positions,
                                            prologue, frequencies, stream()),
                 "attention_prologue");
  }

  // Where ops go: the main stream, or inside beside() the side stream. An op that asks for it reads its
  // inputs from memory, so a linear's partials left unsummed are summed first.
  cudaStream_t stream() {
    settle_split_sums();
    return current_stream();
  }
  cudaStream_t current_stream() const { return on_side_ ? side_stream_->get() : stream_->get(); }

  // A linear's output left unsummed (UnsummedOutput): any other op, or a later linear, has it summed first
  // (stream()), on the stream the linear ran on (beside() settles before it switches).
  void settle_split_sums() {
    if (!unsummed_->splits.any()) return;
    const UnsummedOutput u = std::exchange(*unsummed_, UnsummedOutput{});
    check_cuda(launch_split_partial_sums(u.values, u.splits, current_stream()), "linear (split sums)");
  }

  // The unsummed partials of `values` (the last linear's whole output), handed to the op that reads them;
  // none (the values are in memory) for any other tensor, or where the op's other operands overlap them
  // (they would read or write the values before their sums are stored).
  UnsummedSplits take_unsummed(const Tensor& values, std::initializer_list<Tensor> others) {
    const Tensor& last = unsummed_->values;
    if (!unsummed_->splits.any() || values.data != last.data || values.rows != last.rows ||
        values.cols != last.cols || values.stride != last.stride)
      return {};
    for (const Tensor& other : others)
      if (other.overlaps(values)) return {};
    return std::exchange(*unsummed_, UnsummedOutput{}).splits;
  }

  void require_main_stream(const char* what) const {
    if (on_side_) fail("{}: not allowed inside Backend::beside (ops only)", what);
  }

  // Reallocates `memory` when it holds fewer than `bytes` (the old contents are dropped).
  void grow(DeviceMemory& memory, size_t bytes) {
    if (bytes <= memory.bytes()) return;
    memory = DeviceMemory(bytes);
    ++workspace_generation_;
  }

  // More rows of x than the tensor-core linears take, with weights cuBLAS takes: the BF16 GEMM path.
  static bool gemm_takes(const Tensor& x, const LinearWeight& w) {
    return x.rows > kLinearMmaMaxRows && GemmLinear::supports(w);
  }

  GemmLinear& gemm_linear() {
    if (!gemm_) gemm_ = std::make_unique<GemmLinear>();
    return *gemm_;
  }

  // The attention kernels over the workspace they need (grown rarely: the first call of a larger shape;
  // cudaFree of the old one waits for its users).
  void run_attention(const char* op, const Tensor& out, const Tensor& q, const Tensor& k_cache,
                     const Tensor& v_cache, const Tensor& positions, const AttentionShape& shape,
                     const KeyRanges& ranges) {
    grow(attention_workspace_, attention_workspace_bytes(out, q, k_cache, v_cache, shape.num_heads,
                                                         shape.num_kv_heads, shape.head_dim));
    check_cuda(launch_attention(out, q, k_cache, v_cache, positions, shape.num_heads, shape.num_kv_heads,
                                shape.head_dim, shape.scale, attention_workspace_.data(), stream(), ranges),
               op);
  }

  // Grown outside step graphs: a step's first run is direct, and only a later run of the same shape is
  // recorded.
  LinearMmaWorkspace linear_mma_workspace(int64_t rows, const LinearWeight& w) {
    settle_split_sums();  // before the partials they read are overwritten or freed
    grow(linear_partials_, linear_mma_partial_floats(rows, w.out_features, w.in_features) * sizeof(float));
    return {static_cast<float*>(linear_partials_.data())};
  }

  bool bf16_copies_;  // BackendOptions::bf16_copies
  std::string device_name_;
  int max_shared_bytes_ = 0;  // per block, with the opt-in above the 48 KB default
  std::unique_ptr<CudaStream> stream_;
  // beside(): its stream, the main stream's point it starts after, its own end, and whether main has yet to
  // wait for that end.
  std::unique_ptr<CudaStream> side_stream_;
  std::unique_ptr<CudaEvent> issued_, side_done_;
  bool on_side_ = false, side_pending_ = false;
  std::vector<DeviceMemory> weights_;  // uploaded checkpoint tensors, freed with the backend
  static constexpr size_t kStagingBytes = size_t{1} << 20;
  PinnedHostMemory staging_;  // host bytes of write() in flight, made on first use
  size_t staging_used_ = 0;
  uint64_t workspace_generation_ = 0;  // bumped by grow()
  DeviceMemory attention_workspace_;   // attention's split partials and prefill's BF16 K/V
  DeviceMemory gdn_workspace_;         // the chunked gated delta rule's per-chunk operands
  DeviceMemory linear_partials_;       // split-K partial sums of the tensor-core linear
  // The last linear's, where it left them to its output's reader (the buffers hold it weakly).
  std::shared_ptr<UnsummedOutput> unsummed_ = std::make_shared<UnsummedOutput>();
  DeviceMemory argmax_workspace_;     // argmax's per-slice candidates
  std::unique_ptr<GemmLinear> gemm_;  // many-row linear on cuBLAS, made on first use
};

}  // namespace

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace qspec
