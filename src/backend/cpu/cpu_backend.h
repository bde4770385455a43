// The CPU reference backend: plain fp32 arithmetic with fp32 accumulation, the oracle for every GPU op.
// Results do not depend on the number of threads: every output element is computed by one thread in a fixed
// order. The class is declared here; each op family is defined in its own file (linear.cpp, norm.cpp, ...).
#pragma once

#include <memory>
#include <string>

#include "backend/ops.h"

namespace qspec::cpu {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::string device_name() const override;

  std::unique_ptr<Buffer> alloc(DType dtype, int64_t rows, int64_t cols) override;
  Tensor upload_weight(const TensorView& view, int64_t rows, int64_t cols) override;
  void write(const Tensor& dst, const void* host) override;
  void read(void* host, const Tensor& src) override;
  void fill_zero(const Tensor& dst) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void synchronize() override {}

  void embed(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps,
               bool unit_offset) override;
  void add_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& delta, const Tensor& weight, float eps,
                   bool unit_offset) override;
  void linear(const Tensor& out, const Tensor& x, const LinearWeight& w) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void silu_mul(const Tensor& out, const Tensor& gate, const Tensor& up) override;
  void sigmoid_mul(const Tensor& out, const Tensor& x, const Tensor& gate) override;
  void split_query_gate(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim) override;
  void rope(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim, double theta) override;
  void kv_store(const Tensor& cache, const Tensor& x, const Tensor& positions) override;
  void attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const Tensor& positions, const AttentionShape& shape) override;
  void windowed_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& key_begin, const Tensor& key_end,
                          const AttentionShape& shape) override;
  void conv1d_silu(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                   bool update_state) override;
  void gdn_gates(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a, const Tensor& a_log,
                 const Tensor& dt_bias) override;
  void gated_delta_rule(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                        const Tensor& state, const GdnShape& shape, const GdnStateUpdate& update) override;
  void gdn_commit(std::span<const GdnCommitLayer> layers, const GdnShape& shape, const Tensor& rows) override;
  void gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z,
                     float eps) override;
  void argmax(const Tensor& out_ids, const Tensor& logits) override;
};

}  // namespace qspec::cpu
