// The op set a Qwen3.5 / DFlash forward needs. model/ is written once against this interface; the CPU backend
// (the exact fp32 reference) and the CUDA backend implement it. Every op here has a CPU reference.
//
// Shapes use T for the number of tokens in the step. Activations are F32 on the CPU backend; weights may be
// BF16, F16 or F32. Op inputs and outputs may be strided views (stride >= cols). Outputs may alias inputs of
// the same shape in rmsnorm, gated_rmsnorm, add, silu_mul, sigmoid_mul, conv1d_silu (out = x) and gdn_gates
// (beta = b, g = a), not in linear or attention. Bad shapes, dtypes, ids or positions throw Error naming the
// op and the argument.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "backend/tensor.h"

namespace qspec {

struct TensorView;

// What a backend is made with (qspec's --bf16-copies); each backend reads what concerns it.
struct BackendOptions {
  // Keep a BF16 copy of each W4A16 weight where the backend has a use for one (Backend::dequantized_copy).
  bool bf16_copies = true;
};

// Memory owned by a backend (RAII); the Tensor it holds is a contiguous view of it.
class Buffer {
 public:
  virtual ~Buffer() = default;
  const Tensor& tensor() const { return tensor_; }

 protected:
  Tensor tensor_;
};

struct GdnShape {
  int num_key_heads;    // nk
  int num_value_heads;  // nv; value head h reads key head h / (nv / nk)
  int key_head_dim;     // dk
  int value_head_dim;   // dv
};

// A GDN layer's weights between its input projection (qkvz) and its output projection.
struct GdnMixerWeights {
  Tensor conv_weight;     // [C, K], C = 2 nk dk + nv dv
  LinearWeight w_b, w_a;  // [nv, H]: in_proj_b, in_proj_a
  Tensor a_log, dt_bias;  // [1, nv]
  Tensor norm_weight;     // [1, dv]
};

// What the per-token recurrence of a verify step keeps of its rows for gdn_commit: per row, the keys as it
// used them (L2-normalised), the decays exp(g) and delta = beta (v - S^T k) of every value column. Replaying
// S = decay S; S += k delta^T over the first rows gives the state the recurrence reached there, bit for bit,
// without the prediction S^T k (a reduction over dk per column and token).
inline constexpr int64_t kGdnReplayMaxRows = 16;  // a verify block: the per-token recurrence's calls

struct GdnReplayRows {
  Tensor keys;    // [T, nk * dk]
  Tensor decays;  // [T, nv]
  Tensor deltas;  // [T, nv * dv]

  // No record: none of the three given (a partial one is refused by the ops' checks).
  bool empty() const { return keys.empty() && decays.empty() && deltas.empty(); }
  // Rows [first, first + count) of each, as Tensor::rows_view.
  GdnReplayRows rows_view(int64_t first, int64_t count) const {
    return {keys.rows_view(first, count), decays.rows_view(first, count), deltas.rows_view(first, count)};
  }
};

// What a GDN op does with a layer's states: advance them past its rows (prefill, decode), or only read them,
// keeping the rows' replay record when one is given (a verify step). From a bool: no record.
struct GdnStateUpdate {
  bool advance = true;
  GdnReplayRows replay;

  GdnStateUpdate(bool advance_states) : advance(advance_states) {}  // NOLINT(google-explicit-constructor)
  explicit GdnStateUpdate(GdnReplayRows rows) : advance(false), replay(std::move(rows)) {}
};

// One GDN layer's part of a commit: its states and the T accepted rows to advance them past.
struct GdnCommitLayer {
  Tensor conv_state;       // [C, K-1], as conv1d_silu's state
  Tensor conv_input;       // [T, C], conv1d_silu's x of the rows
  Tensor recurrent_state;  // [nv * dk, dv], as gated_delta_rule's state
  GdnReplayRows replay;    // the verify step's record of the same T rows
};

// One layer's operands of attention_prologue (attention_prologues).
struct AttentionPrologueLayer {
  Tensor query, gate, qkv, q_norm, k_norm, k_cache, v_cache;
};

struct AttentionShape {
  int num_heads;  // query heads; query head h reads KV head h / (num_heads / num_kv_heads)
  int num_kv_heads;
  int head_dim;
  float scale;  // softmax scale, head_dim^-0.5
};

// The projections' layout and the norms / rotation of attention_prologue.
struct AttentionPrologueShape {
  int num_heads, num_kv_heads, head_dim;
  int rotary_dim;  // RoPE over the first rotary_dim dims of each head
  double rope_theta;
  float eps;         // of the per-head RMSNorm of queries and keys
  bool unit_offset;  // the norms' weights as 1 + w
};

// One of the linears that read the same rows (add_rmsnorm_linear, gdn_mixer_linear): out = rows W^T.
struct LinearProjection {
  Tensor out;
  LinearWeight w;
};

// Whether an op's normed rows must be in its `normed` tensor afterwards (something else reads them) or are
// the op's scratch.
enum class NormedRows { Kept, Scratch };

// A recorded sequence of ops replayed as one unit: on CUDA a graph, so a step costs one launch instead of one
// per op. It reads and writes the same buffers it was recorded with.
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual void launch() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The hardware it runs on, for benchmark records ("NVIDIA H200", the CPU model).
  virtual std::string device_name() const { return name(); }
  // Bytes of device memory in use by the whole process (CUDA: its context included), -1 where not measured.
  virtual int64_t device_memory_in_use() const { return -1; }

  // ---- memory
  virtual std::unique_ptr<Buffer> alloc(DType dtype, int64_t rows, int64_t cols) = 0;
  // A checkpoint tensor as a backend tensor [rows, cols] (CPU: a view of the mapping; GPU: a device copy).
  virtual Tensor upload_weight(const TensorView& view, int64_t rows, int64_t cols) = 0;
  // The packed words of a W4A16 weight (I32 [rows, words], checkpoint order). A backend may keep the words of
  // a row in an order of its own that its kernels know (CUDA: backend/cuda/packed_int4_order.h); rows stay
  // rows, so row views of the tensor are row views of the weight.
  virtual Tensor upload_packed_int4(const TensorView& view, int64_t rows, int64_t words) {
    return upload_weight(view, rows, words);
  }
  // A W4A16 weight's BF16 copy for LinearWeight::dequantized, or null where the backend has no use for one
  // or declines the memory (CUDA: kept for prefill's products unless BackendOptions::bf16_copies is off or
  // memory is short; cuda_backend.cpp).
  virtual std::unique_ptr<Buffer> dequantized_copy(const LinearWeight& w) {
    static_cast<void>(w);
    return nullptr;
  }
  // Checkpoint-order packed words into rows of a tensor made by alloc (stacked modules), as above.
  virtual void write_packed_int4(const Tensor& dst, const void* host) { write(dst, host); }
  virtual void write(const Tensor& dst,
                     const void* host) = 0;              // dst contiguous, host has dst.numel() elements
  virtual void read(void* host, const Tensor& src) = 0;  // src any strides; host gets its rows packed
  virtual void fill_zero(const Tensor& dst) = 0;
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;  // same shape and dtype, any strides
  virtual void synchronize() = 0;

  // ---- step graphs (backends whose launches cost enough to be worth recording)
  virtual bool can_capture() const { return false; }
  // Records the ops `record` issues (only ops: no alloc, write, read or synchronize inside).
  virtual std::unique_ptr<StepGraph> capture(const std::function<void()>& record);
  // Changes whenever the backend reallocates a workspace that its ops use (they grow on a step's first,
  // unrecorded run): step graphs recorded before then hold freed memory and must be recorded again.
  virtual uint64_t workspace_generation() const { return 0; }

  // ---- side work (a CUDA stream of its own; other backends run it at once)
  // Runs the ops `ops` issues (ops or step graphs only: no alloc, write, read or synchronize inside) after
  // everything issued so far and alongside what is issued after it, until join_side(), read() or
  // synchronize(), which wait for it. The caller promises that the ops issued alongside neither touch what
  // `ops` reads or writes nor share a backend workspace with it (gdn_commit, which has none, beside a draft).
  virtual void beside(const std::function<void()>& ops) { ops(); }
  // Orders everything issued from now on after the side work issued so far.
  virtual void join_side() {}

  // ---- ops
  // out[t] = table[ids[t]] ; ids I32 [T, 1], table [V, H] (any weight dtype)
  virtual void embed(const Tensor& out, const Tensor& table, const Tensor& ids) = 0;
  // RMSNorm over groups of weight.cols columns: y = x_hat * (unit_offset ? 1 + w : w)
  virtual void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps,
                       bool unit_offset) = 0;
  // The residual add and the next norm in one pass: x += delta, then out = rmsnorm(x) as rmsnorm does (out
  // must not alias x or delta).
  virtual void add_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& delta, const Tensor& weight,
                           float eps, bool unit_offset) = 0;
  // A sublayer's norm and the linears that read its rows, in one op so that a backend may hand the rows to
  // the linears in their own format (CUDA's prefill writes them in BF16 for cuBLAS): x += delta (no add when
  // delta is empty), normed = rmsnorm(x) as add_rmsnorm (or rmsnorm) makes it, then each projection's out =
  // normed W^T as linear makes it. `rows`: whether normed holds the rows afterwards or is the op's scratch.
  // Neither normed nor the outputs may overlap x or delta, nor the outputs normed.
  virtual void add_rmsnorm_linear(std::span<const LinearProjection> projections, const Tensor& normed,
                                  NormedRows rows, const Tensor& x, const Tensor& delta, const Tensor& weight,
                                  float eps, bool unit_offset);
  // out = x W^T
  virtual void linear(const Tensor& out, const Tensor& x, const LinearWeight& w) = 0;
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // out = silu(gate) * up
  virtual void silu_mul(const Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  // The gated MLP's down projection: out = (silu(gate) * up) W^T for gate_up [T, 2I] = [gate | up]. act
  // [T, I] is the op's scratch: the default writes silu(gate) * up into it and runs linear; a backend may
  // fuse the two (values as the two ops make them).
  virtual void silu_gated_linear(const Tensor& out, const Tensor& gate_up, const Tensor& act,
                                 const LinearWeight& w);
  // out = x * sigmoid(gate)
  virtual void sigmoid_mul(const Tensor& out, const Tensor& x, const Tensor& gate) = 0;
  // The gated attention's output projection: out = (x * sigmoid(gate)) W^T. x is the op's scratch: the
  // default writes x * sigmoid(gate) into it and runs linear; a backend may fuse the two (values as the two
  // ops make them).
  virtual void sigmoid_gated_linear(const Tensor& out, const Tensor& x, const Tensor& gate,
                                    const LinearWeight& w);
  // q_proj output [T, nh * 2 * hd] interleaved per head (query, gate) -> query [T, nh*hd], gate [T, nh*hd]
  virtual void split_query_gate(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim) = 0;
  // In place, NeoX (rotate-half) pairing (i, i + rotary_dim/2) over the first rotary_dim dims of each head.
  // positions I32 [T, 1].
  virtual void rope(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim, double theta) = 0;
  // cache[positions[t]] = x[t]
  virtual void kv_store(const Tensor& cache, const Tensor& x, const Tensor& positions) = 0;
  // Everything between the q|k|v projection and attention, as split_query_gate, the per-head q and k norms,
  // rope and kv_store would do it: qkv [T, 2 nh hd + 2 nkv hd] = (query, gate) interleaved per head | keys |
  // values. Writes query [T, nh hd] (normed, rotated) and gate [T, nh hd], and at positions[t] the cache rows
  // k (normed, rotated) and v. The key columns of qkv may be overwritten. With an empty gate, qkv
  // [T, nh hd + 2 nkv hd] = queries | keys | values (attention without an output gate, as the DFlash
  // drafter's), and query may be qkv's query columns themselves. With no query heads (shape.num_heads 0),
  // qkv [T, 2 nkv hd] = keys | values, and query, gate and q_norm are empty (the drafter's context rows). The
  // default composes those ops; a backend may do it in one pass.
  virtual void attention_prologue(const Tensor& query, const Tensor& gate, const Tensor& qkv,
                                  const Tensor& q_norm, const Tensor& k_norm, const Tensor& k_cache,
                                  const Tensor& v_cache, const Tensor& positions,
                                  const AttentionPrologueShape& shape);
  // attention_prologue for several layers over the same rows, positions and shape (the DFlash drafter's
  // context rows: every layer's keys and values); one launch on CUDA, the layers one after another by
  // default. A layer's outputs (query, gate, caches) share no memory with another layer's tensors; their qkv
  // may be column views of one buffer (each layer's key columns are its own).
  virtual void attention_prologues(std::span<const AttentionPrologueLayer> layers, const Tensor& positions,
                                   const AttentionPrologueShape& shape);
  // Causal attention of q [T, nh*hd] over cache rows 0..positions[t] (inclusive) -> out [T, nh*hd].
  virtual void attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const Tensor& positions, const AttentionShape& shape) = 0;
  // Attention of q [T, nh*hd] over cache rows key_begin[t] .. key_end[t] - 1 (I32 [T, 1] each, a non-empty
  // range within the cache) -> out [T, nh*hd], with no other mask: the DFlash drafter's block sees all its
  // context and itself, or a window of it. Every cache row from the least key_begin to the largest key_end
  // must be finite, also between disjoint ranges (a backend may read them all and weight them 0).
  virtual void windowed_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                  const Tensor& v_cache, const Tensor& key_begin, const Tensor& key_end,
                                  const AttentionShape& shape) = 0;
  // Causal depthwise conv1d (kernel K = weight.cols, no bias) + SiLU over channels C.
  // x [T, C]; state [C, K-1] holds the previous K-1 inputs (oldest first). It is advanced past the T inputs
  // when update_state, else only read (a verify step, whose accepted prefix is replayed later).
  virtual void conv1d_silu(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                           bool update_state) = 0;
  // beta = sigmoid(b); g = -exp(a_log) * softplus(a + dt_bias). b, a [T, nv]; a_log, dt_bias [1, nv].
  virtual void gdn_gates(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                         const Tensor& a_log, const Tensor& dt_bias) = 0;
  // gdn_gates of the layer's input projections b = x W_b^T, a = x W_a^T (x [T, H]; W_b, W_a [nv, H]): one
  // launch on CUDA for a decode or verify step instead of the projections' and the gates'. The default
  // projects into beta and g, then applies gdn_gates in place.
  virtual void gdn_gates_linear(const Tensor& beta, const Tensor& g, const Tensor& x, const LinearWeight& w_b,
                                const LinearWeight& w_a, const Tensor& a_log, const Tensor& dt_bias);
  // Gated delta rule over T tokens from `state` [nv * dk, dv] (fp32; advanced past the T tokens when
  // update.advance, else only read, and update.replay, if given, filled: T up to a verify block, the
  // per-token recurrence's rows). qkv [T, 2*nk*dk + nv*dv] is the conv output (q | k | v); q and k are
  // L2-normalised inside (eps 1e-6) and q scaled by dk^-0.5. out [T, nv*dv].
  virtual void gated_delta_rule(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                                const Tensor& state, const GdnShape& shape, const GdnStateUpdate& update) = 0;
  // The states' side of accepting T rows of a verify step, for many GDN layers in one call (one launch on
  // CUDA): each conv state advances as conv1d_silu with update_state would, each recurrent state by the
  // replay of its record (GdnReplayRows: bit for bit the state gated_delta_rule reached); no outputs. All
  // layers have the same T and shape. `rows` (I32 [1, 1], or empty for all T) accepts only the first rows[0]
  // of the T rows, read when the op runs, so that one recorded commit takes any count: CPU refuses a count
  // outside [0, T], CUDA takes it clamped to that range.
  virtual void gdn_commit(std::span<const GdnCommitLayer> layers, const GdnShape& shape,
                          const Tensor& rows) = 0;
  // A GDN layer's mixer, between its input and output projections: conv1d_silu of qkvz's first C columns into
  // conv_out, gdn_gates_linear of x into beta and g, gated_delta_rule into core, then gated_rmsnorm of core
  // with z (qkvz's last nv*dv columns) into out; `update` as conv1d_silu (advance) and gated_delta_rule take
  // it. The default composes the four ops; CUDA runs a decode or verify step's as two kernels (core: their
  // scratch). The outputs (out, conv_out, beta, g, core, update's replay record) overlap neither each other
  // nor qkvz, x or the conv state.
  virtual void gdn_mixer(const Tensor& out, const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                         const Tensor& core, const Tensor& qkvz, const Tensor& x, const Tensor& conv_state,
                         const Tensor& recurrent_state, const GdnMixerWeights& w, const GdnShape& shape,
                         float eps, const GdnStateUpdate& update);
  // A GDN layer's mixer and its output projection, in one op so that a backend may hand the mixer's rows to
  // the projection in its own format (CUDA's prefill writes them in BF16 for cuBLAS): gdn_mixer into gated,
  // then projection.out = gated W^T as linear makes it. gated [T, nv dv] is the op's scratch; the other
  // tensors are gdn_mixer's, none of which projection.out may overlap.
  virtual void gdn_mixer_linear(const LinearProjection& projection, const Tensor& gated,
                                const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                                const Tensor& core, const Tensor& qkvz, const Tensor& x,
                                const Tensor& conv_state, const Tensor& recurrent_state,
                                const GdnMixerWeights& w, const GdnShape& shape, float eps,
                                const GdnStateUpdate& update);
  // Per group of weight.cols: y = w * rmsnorm(x) * silu(z)   (plain weight, no unit offset)
  virtual void gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z,
                             float eps) = 0;
  // out_ids[r] = the index of row r's largest logit: logits F32 [rows, V] (V >= 1), out_ids I32 [rows, 1].
  // The lowest index on ties; the first NaN when the row holds one (backend/argmax.h, as torch.argmax).
  virtual void argmax(const Tensor& out_ids, const Tensor& logits) = 0;

 protected:
  // gdn_mixer's ops before its gated norm (conv1d_silu, gdn_gates_linear, gated_delta_rule into core), for
  // the mixers that end with a norm of their own; the caller has checked the arguments.
  void gdn_mixer_to_core(const Tensor& conv_out, const Tensor& beta, const Tensor& g, const Tensor& core,
                         const Tensor& qkvz, const Tensor& x, const Tensor& conv_state,
                         const Tensor& recurrent_state, const GdnMixerWeights& w, const GdnShape& shape,
                         const GdnStateUpdate& update);
};

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace qspec
