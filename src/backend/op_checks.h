// Argument checks of the op set (backend/ops.h), shared by every backend so that all of them refuse the same
// calls with the same words. Each throws one Error "OP: ARG ..." that names the op, the argument and what was
// expected. A backend adds only what is its own (CUDA: kernel size limits; CPU: index ranges it reads on the
// host) between or after these, in the order it checks them.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "backend/ops.h"

namespace qspec {

// ---- single tensors
// An F32 activation with data (strided views allowed).
void require_activation(std::string_view op, std::string_view arg, const Tensor& t);
// A weight read as fp32: BF16, F16 or F32.
void require_weight(std::string_view op, std::string_view arg, const Tensor& t);
void require_dtype(std::string_view op, std::string_view arg, const Tensor& t, DType dtype);
void require_shape(std::string_view op, std::string_view arg, const Tensor& t, int64_t rows, int64_t cols);
// positions / ids: I32 [rows, 1].
void require_indices(std::string_view op, std::string_view arg, const Tensor& t, int64_t rows);
void require_contiguous(std::string_view op, std::string_view arg, const Tensor& t);

// ---- memory
void check_alloc_args(int64_t rows, int64_t cols);
// The checkpoint tensor holds rows * cols elements.
void check_upload_weight_args(const TensorView& view, int64_t rows, int64_t cols);
void check_copy_args(const Tensor& dst, const Tensor& src);

// ---- ops (arguments as in Backend)
void check_embed_args(const Tensor& out, const Tensor& table, const Tensor& ids);
// rmsnorm / gated_rmsnorm: x [T, C] normalised in groups of weight.cols columns; C a whole number of groups.
void check_norm_args(std::string_view op, const Tensor& out, const Tensor& x, const Tensor& weight);
// add_rmsnorm: delta shaped as x, out distinct from both.
void check_add_rmsnorm_args(const Tensor& out, const Tensor& x, const Tensor& delta, const Tensor& weight);
// add_rmsnorm_linear: the norm's tensors (delta, when given, shaped as x), each projection as linear checks
// it (its x: normed), and no output overlapping an input or normed.
void check_add_rmsnorm_linear_args(std::span<const LinearProjection> projections, const Tensor& normed,
                                   const Tensor& x, const Tensor& delta, const Tensor& weight);
// gated_rmsnorm's gate z, shaped as x.
void check_norm_gate_args(const Tensor& z, const Tensor& x);
void check_linear_args(const Tensor& out, const Tensor& x, const LinearWeight& w);
// sigmoid_gated_linear: x and gate F32 of one shape, out = x W^T's shape.
void check_sigmoid_gated_linear_args(const Tensor& out, const Tensor& x, const Tensor& gate,
                                     const LinearWeight& w);
// silu_gated_linear: gate_up [T, 2I] and act [T, I] for w [N, I], act distinct from gate_up and out.
void check_silu_gated_linear_args(const Tensor& out, const Tensor& gate_up, const Tensor& act,
                                  const LinearWeight& w);
// add, silu_mul, sigmoid_mul: out = combine(a, b), all F32 of one shape.
void check_elementwise_args(std::string_view op, std::string_view a_name, std::string_view b_name,
                            const Tensor& out, const Tensor& a, const Tensor& b);
void check_split_query_gate_args(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim);
// rope's tensors and head/rotary dims; its theta on its own.
void check_rope_args(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim);
void check_rope_theta(double theta);
void check_kv_store_args(const Tensor& cache, const Tensor& x, const Tensor& positions);
// attention_prologue: qkv's width against the shape, query/gate [T, nh hd], caches of nkv hd columns, norm
// weights [1, hd] of one dtype, positions, rotary_dim even and within hd, theta positive.
void check_attention_prologue_args(const Tensor& query, const Tensor& gate, const Tensor& qkv,
                                   const Tensor& q_norm, const Tensor& k_norm, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& positions,
                                   const AttentionPrologueShape& shape);
// attention_prologues: each layer as attention_prologue checks it (errors name the layer), every layer with
// the same rows, and no layer's outputs (query, gate, caches) overlapping another layer's tensors (by byte
// range: the layers' qkv may be column views of one buffer, their outputs not).
void check_attention_prologues_args(std::span<const AttentionPrologueLayer> layers, const Tensor& positions,
                                    const AttentionPrologueShape& shape);
// attention's dtypes and a valid GQA shape; then the tensors' widths against that shape.
void check_attention_operands(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                              const Tensor& v_cache, const AttentionShape& shape);
void check_attention_widths(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                            const Tensor& positions, const AttentionShape& shape);
// windowed_attention: everything but the key ranges' values (a backend that reads them checks those).
void check_windowed_attention_args(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& key_begin, const Tensor& key_end,
                                   const AttentionShape& shape);
// conv1d_silu's dtypes; then, once the backend has checked the kernel size (weight.cols), the shapes.
void check_conv1d_operands(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight);
void check_conv1d_shapes(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight);
void check_gdn_gates_args(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                          const Tensor& a_log, const Tensor& dt_bias);
// gdn_gates_linear: each projection as linear checks it (out beta / g), then the gates.
void check_gdn_gates_linear_args(const Tensor& beta, const Tensor& g, const Tensor& x,
                                 const LinearWeight& w_b, const LinearWeight& w_a, const Tensor& a_log,
                                 const Tensor& dt_bias);
// gated_delta_rule: a valid GdnShape; then the tensors against it; a replay record whole (keys, decays and
// deltas), F32 of the rows' shapes, T <= kGdnReplayMaxRows, its tensors apart from each other and from the
// op's other tensors.
void check_gdn_shape(const GdnShape& shape);
void check_gated_delta_rule_args(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                                 const Tensor& state, const GdnShape& shape, const GdnStateUpdate& update);
// gdn_mixer: qkvz [T, C + nv dv] (C = 2 nk dk + nv dv), then each composed op's arguments as that op checks
// them (conv1d_silu, gdn_gates_linear, gated_delta_rule, gated_rmsnorm).
void check_gdn_mixer_args(const Tensor& out, const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                          const Tensor& core, const Tensor& qkvz, const Tensor& x, const Tensor& conv_state,
                          const Tensor& recurrent_state, const GdnMixerWeights& w, const GdnShape& shape,
                          const GdnStateUpdate& update);
// gdn_mixer_linear: the mixer's arguments as gdn_mixer checks them (its out: gated), the projection as linear
// checks it (its x: gated), and projection.out overlapping none of the mixer's tensors.
void check_gdn_mixer_linear_args(const LinearProjection& projection, const Tensor& gated,
                                 const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                                 const Tensor& core, const Tensor& qkvz, const Tensor& x,
                                 const Tensor& conv_state, const Tensor& recurrent_state,
                                 const GdnMixerWeights& w, const GdnShape& shape,
                                 const GdnStateUpdate& update);
// gdn_commit: a valid GdnShape; then per layer the tensors against it, every layer with the same T (at most
// kGdnReplayMaxRows); rows empty or I32 [1, 1] (its value is the backend's to check: it may be on the
// device).
void check_gdn_commit_args(std::span<const GdnCommitLayer> layers, const GdnShape& shape, const Tensor& rows);
// argmax: logits F32 [rows, V] with 1 <= V <= INT32_MAX (ids are I32), out_ids I32 [rows, 1].
void check_argmax_args(const Tensor& out_ids, const Tensor& logits);

}  // namespace qspec
