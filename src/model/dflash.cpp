#include "model/dflash.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/weight_values.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/int4_quantize.h"
#include "model/weight_upload.h"

namespace qspec {

namespace {

DFlashWeights load_weights(const DFlashConfig& c, const TensorStore& store, Backend& backend) {
  const int64_t H = c.hidden_size, FF = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_heads) * c.head_dim, kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  DFlashWeights w;
  auto linear = [&](const std::string& module, int64_t out_features, int64_t in_features) {
    return upload_linear(backend, c.find_linear(store, module, out_features, in_features), out_features,
                         in_features, w.stacked_storage);
  };
  auto vector = [&](const std::string& name, int64_t length) {
    return upload_vector(backend, store, name, length);
  };
  auto stacked = [&](const std::vector<std::pair<std::string, int64_t>>& modules) {
    std::vector<LinearTensors> found;
    std::vector<int64_t> out_features;
    for (const auto& [module, n] : modules) {
      found.push_back(c.find_linear(store, module, n, H));
      out_features.push_back(n);
    }
    return upload_stacked_linear(backend, found, out_features, H, w.stacked_storage);
  };
  w.fc = linear("fc", H, int64_t(c.target_layer_ids.size()) * H);
  w.hidden_norm = vector("hidden_norm.weight", H);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    DFlashLayer layer;
    layer.input_norm = vector(p + "input_layernorm.weight", H);
    layer.qkv_proj = stacked({{p + "self_attn.q_proj", q_dim},
                              {p + "self_attn.k_proj", kv_dim},
                              {p + "self_attn.v_proj", kv_dim}});
    layer.o_proj = linear(p + "self_attn.o_proj", H, q_dim);
    layer.q_norm = vector(p + "self_attn.q_norm.weight", c.head_dim);
    layer.k_norm = vector(p + "self_attn.k_norm.weight", c.head_dim);
    layer.post_attention_norm = vector(p + "post_attention_layernorm.weight", H);
    layer.mlp_gate_up = stacked({{p + "mlp.gate_proj", FF}, {p + "mlp.up_proj", FF}});
    layer.mlp_down = linear(p + "mlp.down_proj", H, FF);
    w.layers.push_back(std::move(layer));
  }
  std::vector<std::pair<std::string, int64_t>> context_kv;
  for (int i = 0; i < c.num_layers; ++i)
    for (const char* projection : {"k_proj", "v_proj"})
      context_kv.emplace_back(fmt::format("layers.{}.self_attn.{}", i, projection), kv_dim);
  w.context_kv = stacked(context_kv);
  w.final_norm = vector("norm.weight", H);
  return w;
}

Tensor first_rows(const std::unique_ptr<Buffer>& buffer, int64_t rows) {
  return buffer->tensor().rows_view(0, rows);
}

}  // namespace

// Block buffers sized once (block_size rows); context buffers grown to the largest context chunk seen. The
// host-side vectors stage the index writes so that a step allocates nothing.
struct DFlashModel::Workspace {
  int64_t context_capacity = 0, feature_capacity = 0;
  std::unique_ptr<Buffer> context_positions, features, context, context_kv;
  std::vector<int32_t> context_positions_host;
  // ids, positions, key_begin and key_end of the block (block_size rows each), written at once.
  std::unique_ptr<Buffer> block_indices;
  std::vector<int32_t> block_indices_host;
  std::unique_ptr<Buffer> h, normed, qkv, attn, mixer_out, mlp_gate_up, mlp_act, mlp_out, logits;
  std::unique_ptr<Buffer> draft_ids;
  // The key of the context step being run, reused so that looking it up allocates nothing.
  GraphKey context_key;

  // Index block `which` (0 ids, 1 positions, 2 key_begin, 3 key_end, 4 key_end - 1): I32 [block_size, 1].
  static constexpr int kIndexBlocks = 5;
  Tensor block_index(int which) const {
    const int64_t block = block_indices->tensor().rows / kIndexBlocks;
    return block_indices->tensor().rows_view(which * block, block);
  }
};

DFlashModel::DFlashModel(DFlashConfig config, const TensorStore& store, const Qwen35Model& target,
                         const std::string& target_dir, DraftHead head)
    : config_(std::move(config)),
      backend_(target.backend()),
      target_(target.weights()),
      ws_(std::make_unique<Workspace>()),
      graphs_(target.backend(), kMaxStepGraphs) {
  config_.check_target(target.config(), target_dir);
  weights_ = load_weights(config_, store, backend_);
  head_ = head == DraftHead::W4A16 && !target_.lm_head.quantized() ? quantized_head() : target_.lm_head;
  const DFlashConfig& c = config_;
  const int64_t B = c.block_size, H = c.hidden_size, FF = c.intermediate_size;
  const int64_t q_dim = int64_t(c.num_heads) * c.head_dim, kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  Workspace& ws = *ws_;
  auto make = [&](std::unique_ptr<Buffer>& b, int64_t cols, DType dtype = DType::F32) {
    b = backend_.alloc(dtype, B, cols);
  };
  ws.block_indices = backend_.alloc(DType::I32, Workspace::kIndexBlocks * B, 1);
  ws.block_indices_host.resize(size_t(Workspace::kIndexBlocks * B));
  make(ws.h, H);
  make(ws.normed, H);
  make(ws.qkv, q_dim + 2 * kv_dim);
  make(ws.attn, q_dim);
  make(ws.mixer_out, H);
  make(ws.mlp_gate_up, 2 * FF);
  make(ws.mlp_act, FF);
  make(ws.mlp_out, H);
  ws.logits = backend_.alloc(DType::F32, B - 1, c.vocab_size);
  ws.draft_ids = backend_.alloc(DType::I32, B - 1, 1);
}

LinearWeight DFlashModel::quantized_head() {
  const Tensor& dense = target_.lm_head.weight;
  const int64_t rows = dense.rows, cols = dense.cols;
  if (cols % kDraftHeadGroupSize != 0)
    fail("--draft-head w4a16: the target's head has {} columns, expected a multiple of {}", cols,
         kDraftHeadGroupSize);
  head_packed_ = backend_.alloc(DType::I32, rows, cols / 8);
  head_scales_ = backend_.alloc(DType::BF16, rows, cols / kDraftHeadGroupSize);
  // A slice of rows at a time: read back, widened to F32, quantized, written into the copy.
  constexpr int64_t kSliceRows = 4096;
  const size_t value_bytes = dtype_size(dense.dtype);
  std::vector<uint8_t> raw(size_t(std::min(rows, kSliceRows) * cols) * value_bytes);
  std::vector<float> values(size_t(std::min(rows, kSliceRows) * cols));
  std::vector<uint32_t> packed(values.size() / 8);
  std::vector<uint16_t> scales(values.size() / kDraftHeadGroupSize);
  Progress progress("quantizing the draft head", rows, "rows");
  for (int64_t first = 0; first < rows; first += kSliceRows) {
    const int64_t count = std::min(kSliceRows, rows - first);
    backend_.read(raw.data(), dense.rows_view(first, count));
    const Tensor slice{dense.dtype, count, cols, cols, raw.data()};
    ThreadPool::global().parallel_for(size_t(count), [&](size_t begin, size_t end) {
      const auto r0 = int64_t(begin), rows_here = int64_t(end - begin);
      for (int64_t r = r0; r < r0 + rows_here; ++r) cpu::weight_row(slice, r, values.data() + r * cols);
      quantize_int4_rows(values.data() + r0 * cols, rows_here, cols, kDraftHeadGroupSize,
                         packed.data() + r0 * cols / 8, scales.data() + r0 * (cols / kDraftHeadGroupSize));
    });
    backend_.write_packed_int4(head_packed_->tensor().rows_view(first, count), packed.data());
    backend_.write(head_scales_->tensor().rows_view(first, count), scales.data());
    progress.advance(count);
  }
  progress.finish();
  LinearWeight head;
  head.out_features = rows;
  head.in_features = cols;
  head.packed = head_packed_->tensor();
  head.scales = head_scales_->tensor();
  head.group_size = kDraftHeadGroupSize;
  return head;
}

DFlashModel::~DFlashModel() = default;

std::unique_ptr<DFlashState> DFlashModel::new_state(int max_context) {
  const int64_t kv_dim = int64_t(config_.num_kv_heads) * config_.head_dim;
  auto state = std::make_unique<DFlashState>();
  state->max_context = max_context;
  state->id = next_state_id_++;
  for (int i = 0; i < config_.num_layers; ++i) {
    DFlashState::Layer layer;
    layer.k_cache = backend_.alloc(DType::F32, max_context + config_.block_size, kv_dim);
    layer.v_cache = backend_.alloc(DType::F32, max_context + config_.block_size, kv_dim);
    state->layers.push_back(std::move(layer));
  }
  return state;
}

void DFlashModel::reset(DFlashState& state) const {
  state.n_context = 0;
}

void DFlashModel::ensure_context_rows(int64_t rows) {
  Workspace& ws = *ws_;
  if (rows <= ws.context_capacity) return;
  const DFlashConfig& c = config_;
  const int64_t kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  ws.context_positions = backend_.alloc(DType::I32, rows, 1);
  ws.context = backend_.alloc(DType::F32, rows, c.hidden_size);
  ws.context_kv = backend_.alloc(DType::F32, rows, int64_t(c.num_layers) * 2 * kv_dim);
  ws.context_positions_host.resize(size_t(rows));
  ws.context_capacity = rows;
  graphs_.clear();  // recorded on the old buffers
}

void DFlashModel::ensure_feature_rows(int64_t rows) {
  Workspace& ws = *ws_;
  if (rows <= ws.feature_capacity) return;
  const DFlashConfig& c = config_;
  ws.features = backend_.alloc(DType::F32, rows, int64_t(c.target_layer_ids.size()) * c.hidden_size);
  ws.feature_capacity = rows;
  graphs_.clear();
}

void DFlashModel::add_context(DFlashState& state, std::span<const Tensor> features) {
  const DFlashConfig& c = config_;
  if (features.size() != c.target_layer_ids.size())
    fail("drafter context: {} feature tensors, expected one per target layer id ({})", features.size(),
         c.target_layer_ids.size());
  const int64_t rows = features.front().rows;
  for (const Tensor& f : features)
    if (f.rows != rows || f.cols != c.hidden_size)
      fail("drafter context: feature tensor [{}, {}], expected [{}, {}]", f.rows, f.cols, rows,
           c.hidden_size);
  if (state.n_context + rows > state.max_context)
    fail("drafter context: {} rows after {} exceed the context of {} tokens", rows, state.n_context,
         state.max_context);
  if (rows == 0) return;
  ensure_context_rows(rows);
  if (concatenated_columns(features).empty()) ensure_feature_rows(rows);
  Workspace& ws = *ws_;
  for (int64_t t = 0; t < rows; ++t) ws.context_positions_host[size_t(t)] = int32_t(state.n_context + t);
  backend_.write(first_rows(ws.context_positions, rows), ws.context_positions_host.data());
  GraphKey& key = ws.context_key;
  key.state_id = state.id;
  key.step = Step::Context;
  key.rows = rows;
  key.inputs.clear();
  for (const Tensor& f : features) key.inputs.emplace_back(f.data, f.stride);
  graphs_.run(key, [this, &state, features, rows] { context_step(state, features, rows); });
  state.n_context += int(rows);
}

void DFlashModel::context_step(DFlashState& state, std::span<const Tensor> features, int64_t rows) {
  const DFlashConfig& c = config_;
  Workspace& ws = *ws_;
  const Tensor pos = first_rows(ws.context_positions, rows);
  // C = hidden_norm(fc(concat(features))), then each layer's k_norm'd, rotated K and its V at the positions.
  // The target's forward hands its features over as adjacent columns of one tensor: no copies.
  Tensor concatenated = concatenated_columns(features);
  if (concatenated.empty()) {
    concatenated = first_rows(ws.features, rows);
    for (size_t i = 0; i < features.size(); ++i)
      backend_.copy(concatenated.cols_view(int64_t(i) * c.hidden_size, c.hidden_size), features[i]);
  }
  const Tensor context = first_rows(ws.context, rows);
  backend_.linear(context, concatenated, weights_.fc);
  backend_.rmsnorm(context, context, weights_.hidden_norm, c.rms_norm_eps, false);
  const int64_t kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  const Tensor kv = first_rows(ws.context_kv, rows);
  stacked_linear(backend_, kv, context, weights_.context_kv);
  // Keys and values only: the prologue without query heads norms, rotates and stores them.
  const AttentionPrologueShape keys{
      0, c.num_kv_heads, c.head_dim, c.head_dim, c.rope_theta, c.rms_norm_eps, false};
  std::vector<AttentionPrologueLayer> layers;
  for (size_t i = 0; i < weights_.layers.size(); ++i)
    layers.push_back({Tensor{}, Tensor{}, kv.cols_view(int64_t(i) * 2 * kv_dim, 2 * kv_dim), Tensor{},
                      weights_.layers[i].k_norm, state.layers[i].k_cache->tensor(),
                      state.layers[i].v_cache->tensor()});
  backend_.attention_prologues(layers, pos, keys);
}

void DFlashModel::mlp(const DFlashLayer& layer, const Tensor& x, const Tensor& out) {
  gated_mlp(backend_, out, ws_->mlp_gate_up->tensor(), ws_->mlp_act->tensor(), x, layer.mlp_gate_up,
            layer.mlp_down);
}

DraftOutput DFlashModel::draft(DFlashState& state, int32_t bonus, int window) {
  const DFlashConfig& c = config_;
  const int B = c.block_size;
  if (bonus < 0 || bonus >= c.vocab_size)
    fail("draft: bonus token {} outside the vocabulary [0, {})", bonus, c.vocab_size);
  if (window < 0) fail("draft: window {} must be >= 0", window);
  Workspace& ws = *ws_;
  const int start = state.n_context;
  const int keys = start + B;
  const bool windowed = window > 0 && keys > window;
  int32_t* ids = ws.block_indices_host.data();
  int32_t* positions = ids + B;
  int32_t* begin = positions + B;
  int32_t* end = begin + B;
  int32_t* last = end + B;
  for (int j = 0; j < B; ++j) {
    const int p = start + j;
    ids[j] = j == 0 ? bonus : c.mask_token_id;
    positions[j] = p;
    begin[j] = windowed ? std::max(0, p - (window - 1)) : 0;
    end[j] = windowed ? std::min(keys, p + window) : keys;
    last[j] = end[j] - 1;
  }
  backend_.write(ws.block_indices->tensor(), ws.block_indices_host.data());
  graphs_.run(GraphKey{state.id, windowed ? Step::DraftWindowed : Step::Draft, B, {}},
              [this, &state, windowed] { draft_step(state, windowed); });
  return {ws.logits->tensor(), ws.draft_ids->tensor()};
}

void DFlashModel::draft_step(DFlashState& state, bool windowed) {
  const DFlashConfig& c = config_;
  const int B = c.block_size;
  Workspace& ws = *ws_;
  const Tensor h = ws.h->tensor(), normed = ws.normed->tensor(), pos = ws.block_index(1);
  const int64_t q_dim = int64_t(c.num_heads) * c.head_dim;
  const Tensor qkv = ws.qkv->tensor(), attn = ws.attn->tensor();
  const Tensor q = qkv.cols_view(0, q_dim);
  const AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  // No output gate: the queries are normed and rotated in place.
  const AttentionPrologueShape prologue{c.num_heads,  c.num_kv_heads, c.head_dim, c.head_dim,
                                        c.rope_theta, c.rms_norm_eps, false};
  backend_.embed(h, target_.embed, ws.block_index(0));
  backend_.rmsnorm(normed, h, weights_.layers.front().input_norm, c.rms_norm_eps, false);
  // Each residual add is fused with the norm that follows it (the next layer's input norm; the final norm
  // after the last layer).
  for (size_t i = 0; i < weights_.layers.size(); ++i) {
    const DFlashLayer& layer = weights_.layers[i];
    const DFlashState::Layer& cache = state.layers[i];
    stacked_linear(backend_, qkv, normed, layer.qkv_proj);
    // The block's K/V go after the context (rows start..start+B-1); the next context overwrites them.
    backend_.attention_prologue(q, Tensor{}, qkv, layer.q_norm, layer.k_norm, cache.k_cache->tensor(),
                                cache.v_cache->tensor(), pos, prologue);
    // Without a window every query sees keys 0..start+B-1: the causal attention op with each row's last key
    // as its position. Both ops' CUDA kernels split the keys over blocks and read each key once for all 16
    // rows and the heads sharing it (a block per row and head read them 64 times: 3 ms a draft step at 8k
    // context on the H200).
    if (windowed)
      backend_.windowed_attention(attn, q, cache.k_cache->tensor(), cache.v_cache->tensor(),
                                  ws.block_index(2), ws.block_index(3), shape);
    else
      backend_.attention(attn, q, cache.k_cache->tensor(), cache.v_cache->tensor(), ws.block_index(4), shape);
    backend_.linear(ws.mixer_out->tensor(), attn, layer.o_proj);
    backend_.add_rmsnorm(normed, h, ws.mixer_out->tensor(), layer.post_attention_norm, c.rms_norm_eps, false);
    mlp(layer, normed, ws.mlp_out->tensor());
    const Tensor& next_norm =
        i + 1 < weights_.layers.size() ? weights_.layers[i + 1].input_norm : weights_.final_norm;
    backend_.add_rmsnorm(normed, h, ws.mlp_out->tensor(), next_norm, c.rms_norm_eps, false);
  }
  // Slot j (1..B-1) predicts the token at position start + j; slot 0 (the bonus) predicts nothing.
  backend_.linear(ws.logits->tensor(), normed.rows_view(1, B - 1), head_);
  backend_.argmax(ws.draft_ids->tensor(), ws.logits->tensor());
}

}  // namespace qspec
