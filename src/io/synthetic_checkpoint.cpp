#include "io/synthetic_checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/dflash_config.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace qspec {

namespace {

using nlohmann::json;

// Qwen/Qwen3.5-4B's config.json (values from the reference notes, qwen35-model.md §1.1).
json qwen35_4b_config() {
  json layer_types = json::array();
  for (int i = 0; i < 32; ++i)
    layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  json text = {
      {"model_type", "qwen3_5_text"},
      {"vocab_size", 248320},
      {"hidden_size", 2560},
      {"intermediate_size", 9216},
      {"num_hidden_layers", 32},
      {"num_attention_heads", 16},
      {"num_key_value_heads", 4},
      {"head_dim", 256},
      {"attn_output_gate", true},
      {"attention_bias", false},
      {"linear_num_key_heads", 16},
      {"linear_num_value_heads", 32},
      {"linear_key_head_dim", 128},
      {"linear_value_head_dim", 128},
      {"linear_conv_kernel_dim", 4},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 262144},
      {"layer_types", layer_types},
      {"full_attention_interval", 4},
      {"rope_parameters",
       {{"rope_type", "default"},
        {"rope_theta", 10000000},
        {"partial_rotary_factor", 0.25},
        {"mrope_section", {11, 11, 10}},
        {"mrope_interleaved", true}}},
      {"partial_rotary_factor", 0.25},
      {"tie_word_embeddings", true},
      {"mtp_num_hidden_layers", 1},
      {"mtp_use_dedicated_embeddings", false},
      {"mamba_ssm_dtype", "float32"},
      {"dtype", "bfloat16"},
      {"eos_token_id", 248044},
      {"bos_token_id", nullptr},
  };
  json vision = {{"depth", 24},
                 {"hidden_size", 1024},
                 {"intermediate_size", 4096},
                 {"num_heads", 16},
                 {"out_hidden_size", 2560},
                 {"patch_size", 16},
                 {"temporal_patch_size", 2},
                 {"spatial_merge_size", 2},
                 {"num_position_embeddings", 2304},
                 {"in_channels", 3},
                 {"hidden_act", "gelu_pytorch_tanh"}};
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
          {"model_type", "qwen3_5"},
          {"tie_word_embeddings", true},
          {"pad_token_id", 248044},
          {"image_token_id", 248056},
          {"video_token_id", 248057},
          {"vision_start_token_id", 248053},
          {"vision_end_token_id", 248054},
          {"dtype", "bfloat16"},
          {"text_config", text},
          {"vision_config", vision}};
}

// A tiny Qwen3.5 with the real 248,320-entry vocabulary, for demos and text tests on the CPU: the 4B's layer
// pattern, partial rotary factor and head ratios at hidden size 64, four layers.
json qwen35_tiny_config() {
  json config = qwen35_4b_config();
  json& text = config["text_config"];
  text["hidden_size"] = 64;
  text["intermediate_size"] = 128;
  text["num_hidden_layers"] = 4;
  text["layer_types"] = {"linear_attention", "linear_attention", "linear_attention", "full_attention"};
  text["num_attention_heads"] = 4;
  text["num_key_value_heads"] = 1;
  text["head_dim"] = 32;
  text["linear_num_key_heads"] = 2;
  text["linear_num_value_heads"] = 4;
  text["linear_key_head_dim"] = 16;
  text["linear_value_head_dim"] = 16;
  text["max_position_embeddings"] = 32768;
  text["mtp_num_hidden_layers"] = 0;
  config.erase("vision_config");
  return config;
}

// The nota drafter's config.json (SpecForge configs/qwen3.5-4b-dflash.json, dflash-system.md §1.1).
json dflash_qwen35_4b_config() {
  json layer_types = json::array();
  for (int i = 0; i < 5; ++i) layer_types.push_back("full_attention");
  return {{"architectures", {"DFlashDraftModel"}},
          {"auto_map", {{"AutoModel", "dflash.DFlashDraftModel"}}},
          {"model_type", "qwen3"},
          {"block_size", 16},
          {"dflash_config", {{"mask_token_id", 248070}, {"target_layer_ids", {1, 8, 15, 22, 29}}}},
          {"num_hidden_layers", 5},
          {"num_target_layers", 32},
          {"hidden_size", 2560},
          {"intermediate_size", 9728},
          {"hidden_act", "silu"},
          {"num_attention_heads", 32},
          {"num_key_value_heads", 8},
          {"head_dim", 128},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"layer_types", layer_types},
          {"sliding_window", nullptr},
          {"use_sliding_window", false},
          {"max_window_layers", 5},
          {"rope_theta", 10000000},
          {"rope_scaling", nullptr},
          {"max_position_embeddings", 262144},
          {"rms_norm_eps", 1e-06},
          {"tie_word_embeddings", true},
          {"vocab_size", 248320},
          {"bos_token_id", 248043},
          {"eos_token_id", 248044},
          {"pad_token_id", 248044},
          {"dtype", "bfloat16"},
          {"initializer_range", 0.02},
          {"transformers_version", "4.57.1"}};
}

// A drafter for qwen3.5-tiny: the real vocabulary and mask id, two layers at hidden size 64.
json dflash_qwen35_tiny_config() {
  json config = dflash_qwen35_4b_config();
  config["dflash_config"]["target_layer_ids"] = {1, 2};
  config["num_hidden_layers"] = 2;
  config["num_target_layers"] = 4;
  config["hidden_size"] = 64;
  config["intermediate_size"] = 128;
  config["num_attention_heads"] = 4;
  config["num_key_value_heads"] = 2;
  config["head_dim"] = 16;
  config["layer_types"] = {"full_attention", "full_attention"};
  config["max_window_layers"] = 2;
  return config;
}

// compressed-tensors W4A16 as llm-compressor writes it: for the target every Linear of the language model
// except the 32-row GDN b/a projections (the vision tower and the MTP head stay dense); for the drafter every
// Linear, fc included (the nota GPTQ recipe, dflash-system.md §6.4).
json w4a16_quantization_config(int group_size, bool drafter) {
  const json ignore = drafter
                          ? json::array()
                          : json{"lm_head", "re:.*in_proj_[ab]$", "re:^model\\.visual\\..*", "re:^mtp\\..*"};
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"global_compression_ratio", nullptr},
          {"kv_cache_scheme", nullptr},
          {"ignore", ignore},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"input_activations", nullptr},
              {"output_activations", nullptr},
              {"weights",
               {{"num_bits", 4},
                {"type", "int"},
                {"symmetric", true},
                {"strategy", "group"},
                {"group_size", group_size},
                {"dynamic", false},
                {"actorder", nullptr},
                {"observer", "minmax"}}}}}}}};
}

struct SynthTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;

  size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    return n;
  }
  size_t nbytes() const { return numel() * dtype_size(dtype); }
};

// The vision tower and MTP head of the 4B (skipped by qspec, present in the published files).
void add_skipped_tensors(std::vector<SynthTensor>& out) {
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    out.push_back({std::move(name), DType::BF16, std::move(shape)});
  };
  const std::string v = "model.visual.";
  add(v + "patch_embed.proj.weight", {1024, 3, 2, 16, 16});
  add(v + "patch_embed.proj.bias", {1024});
  add(v + "pos_embed.weight", {2304, 1024});
  for (int b = 0; b < 24; ++b) {
    const std::string p = fmt::format("{}blocks.{}.", v, b);
    for (const char* norm : {"norm1", "norm2"}) {
      add(p + norm + ".weight", {1024});
      add(p + norm + ".bias", {1024});
    }
    add(p + "attn.qkv.weight", {3072, 1024});
    add(p + "attn.qkv.bias", {3072});
    add(p + "attn.proj.weight", {1024, 1024});
    add(p + "attn.proj.bias", {1024});
    add(p + "mlp.linear_fc1.weight", {4096, 1024});
    add(p + "mlp.linear_fc1.bias", {4096});
    add(p + "mlp.linear_fc2.weight", {1024, 4096});
    add(p + "mlp.linear_fc2.bias", {1024});
  }
  add(v + "merger.norm.weight", {1024});
  add(v + "merger.norm.bias", {1024});
  add(v + "merger.linear_fc1.weight", {4096, 4096});
  add(v + "merger.linear_fc1.bias", {4096});
  add(v + "merger.linear_fc2.weight", {2560, 4096});
  add(v + "merger.linear_fc2.bias", {2560});

  add("mtp.fc.weight", {2560, 5120});
  for (const char* norm :
       {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
        "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight"})
    add(norm, {2560});
  add("mtp.layers.0.self_attn.q_proj.weight", {8192, 2560});
  add("mtp.layers.0.self_attn.k_proj.weight", {1024, 2560});
  add("mtp.layers.0.self_attn.v_proj.weight", {1024, 2560});
  add("mtp.layers.0.self_attn.o_proj.weight", {2560, 4096});
  add("mtp.layers.0.self_attn.q_norm.weight", {256});
  add("mtp.layers.0.self_attn.k_norm.weight", {256});
  add("mtp.layers.0.mlp.gate_proj.weight", {9216, 2560});
  add("mtp.layers.0.mlp.up_proj.weight", {9216, 2560});
  add("mtp.layers.0.mlp.down_proj.weight", {2560, 9216});
}

// Dense tensors are BF16 except the two the published checkpoint keeps in F32.
DType dense_dtype(const std::string& name) {
  return name.ends_with("linear_attn.A_log") || name.ends_with("linear_attn.norm.weight") ? DType::F32
                                                                                          : DType::BF16;
}

std::vector<SynthTensor> checkpoint_tensors(const Qwen35Config& config, bool with_skipped_tensors) {
  std::vector<SynthTensor> tensors;
  for (const TensorSpec& spec : text_model_schema(config)) {
    DType dtype = spec.dtypes.size() == 1        ? spec.dtypes[0]
                  : spec.dtypes[0] == DType::I64 ? DType::I64
                                                 : dense_dtype(spec.name);
    tensors.push_back({spec.name, dtype, spec.shape});
  }
  if (with_skipped_tensors) add_skipped_tensors(tensors);
  return tensors;
}

// splitmix64: a counter-based generator, so any chunk of any tensor can be filled independently.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

// How the values of a tensor are drawn: uniform on [low, high), or log of such a draw.
struct Distribution {
  float low, high;
  bool log = false;
};

// Scales chosen so the residual stream stays O(1): projections have unit gain, zero-centred norms start near
// 0 (weight 1 + w) and plain norms (the drafter's, w) near 1, decays and step sizes lie in the ranges the
// real initialisation uses.
Distribution distribution_for(const std::string& name, const std::vector<int64_t>& shape, bool plain_norms) {
  const float fan_in = shape.size() >= 2 ? float(shape[1]) : 1.0f;
  if (name.ends_with("A_log")) return {0.05f, 0.95f, true};
  if (name.ends_with("dt_bias")) return {-6.0f, -2.0f};
  if (name.ends_with("linear_attn.norm.weight")) return {0.9f, 1.1f};
  if (plain_norms && name.find("norm") != std::string::npos) return {0.9f, 1.1f};
  if (name.find("norm") != std::string::npos || name.ends_with(".bias")) return {-0.1f, 0.1f};
  if (name.ends_with("conv1d.weight")) return {-0.8f, 0.8f};
  if (name.find("embed_tokens") != std::string::npos) return {-0.035f, 0.035f};  // std 0.02
  const float bound = std::sqrt(3.0f / fan_in);                                  // std 1/sqrt(K)
  return {-bound, bound};
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  if (!out.flush()) fail("{}: cannot write", path);
}

// The tokenizer files a model directory carries, so `--model DIR` alone serves text.
void copy_tokenizer_files(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(from) / "tokenizer.json")) fail("--tokenizer: no tokenizer.json in {}", from);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "NOTICE"}) {
    fs::path source = fs::path(from) / name;
    std::error_code error;
    if (fs::exists(source))
      fs::copy_file(source, fs::path(to) / name, fs::copy_options::overwrite_existing, error);
    if (error) fail("{}: cannot copy to {}: {}", source.string(), to, error.message());
  }
}

constexpr size_t kChunk = size_t(1) << 20;

void fill_tensor(const SynthTensor& t, uint8_t* out, uint64_t seed, const std::vector<int64_t>& linear_shape,
                 bool plain_norms) {
  const size_t n = t.numel();
  const uint64_t base = mix(seed ^ name_hash(t.name));
  if (t.name.ends_with(".weight_shape")) {
    for (size_t i = 0; i < n; ++i) {
      int64_t v = linear_shape[i];
      if (t.dtype == DType::I64)
        std::memcpy(out + 8 * i, &v, 8);
      else {
        int32_t v32 = int32_t(v);
        std::memcpy(out + 4 * i, &v32, 4);
      }
    }
    return;
  }
  const bool packed = t.name.ends_with(".weight_packed");
  const bool scale = t.name.ends_with(".weight_scale");
  // A nibble uniform on [0, 16) minus 8 has std ~4.6: the scale gives the dequantized weight std 1/sqrt(K).
  const float scale_value = scale ? 1.0f / std::sqrt(float(linear_shape[1])) / 4.6f : 0.0f;
  const Distribution d = distribution_for(t.name, t.shape, plain_norms);
  ThreadPool::global().parallel_for((n + kChunk - 1) / kChunk, [&](size_t begin, size_t end) {
    for (size_t c = begin; c < end; ++c) {
      for (size_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
        uint64_t r = mix(base + i);
        if (packed) {
          uint32_t word = uint32_t(r);
          std::memcpy(out + 4 * i, &word, 4);
          continue;
        }
        float u = float(r >> 40) * (1.0f / 16777216.0f);
        float v = scale ? scale_value * (0.8f + 0.4f * u) : d.low + (d.high - d.low) * u;
        if (d.log && !scale) v = std::log(v);
        if (t.dtype == DType::F32) {
          std::memcpy(out + 4 * i, &v, 4);
        } else {
          uint16_t h = t.dtype == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
          std::memcpy(out + 2 * i, &h, 2);
        }
      }
    }
  });
}

}  // namespace

std::vector<std::string> synth_architectures() {
  return {"qwen3.5-4b", "qwen3.5-tiny", "dflash-qwen3.5-4b", "dflash-qwen3.5-tiny"};
}
std::vector<std::string> synth_formats() {
  return {"bf16", "w4a16-g32", "w4a16-g128"};
}

json synthetic_config(const SynthOptions& options) {
  json config;
  if (options.arch == "qwen3.5-4b")
    config = qwen35_4b_config();
  else if (options.arch == "qwen3.5-tiny")
    config = qwen35_tiny_config();
  else if (options.arch == "dflash-qwen3.5-4b")
    config = dflash_qwen35_4b_config();
  else if (options.arch == "dflash-qwen3.5-tiny")
    config = dflash_qwen35_tiny_config();
  else
    fail("--arch: unknown architecture '{}' (available: {})", options.arch,
         fmt::join(synth_architectures(), ", "));
  if (options.format == "w4a16-g32" || options.format == "w4a16-g128")
    config["quantization_config"] =
        w4a16_quantization_config(options.format == "w4a16-g32" ? 32 : 128, is_drafter_config(config));
  else if (options.format != "bf16")
    fail("--format: unknown format '{}' (available: {})", options.format, fmt::join(synth_formats(), ", "));
  return config;
}

bool is_drafter_config(const json& config) {
  const auto architectures = config.find("architectures");
  return architectures != config.end() && architectures->is_array() && !architectures->empty() &&
         (*architectures)[0] == "DFlashDraftModel";
}

namespace {

void write_checkpoint(const std::string& dir, const json& config, const std::vector<SynthTensor>& tensors,
                      uint64_t seed, uint64_t shard_bytes) {
  const bool plain_norms = is_drafter_config(config);
  // Assign tensors to shards in order, a new shard past shard_bytes.
  std::vector<size_t> shard_of(tensors.size());
  size_t shards = 1, used = 0;
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (used > 0 && used + tensors[i].nbytes() > shard_bytes) {
      ++shards;
      used = 0;
    }
    shard_of[i] = shards - 1;
    used += tensors[i].nbytes();
    total += tensors[i].nbytes();
  }

  std::filesystem::create_directories(dir);
  auto shard_name = [&](size_t s) {
    return fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
  };
  json weight_map = json::object();
  Progress progress("synth", int64_t(total / 1000000), "MB");
  std::vector<int64_t> linear_shape;  // [N, K] of the module whose tensors are being written
  for (size_t s = 0, i = 0; s < shards; ++s) {
    std::vector<TensorData> data;
    for (; i < tensors.size() && shard_of[i] == s; ++i) {
      const SynthTensor& t = tensors[i];
      if (t.name.ends_with(".weight_packed")) linear_shape = {t.shape[0], t.shape[1] * 8};
      TensorData td{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.nbytes())};
      fill_tensor(t, td.bytes.data(), seed, linear_shape, plain_norms);
      progress.advance(int64_t(t.nbytes() / 1000000));
      weight_map[t.name] = shard_name(s);
      data.push_back(std::move(td));
    }
    write_safetensors(dir + "/" + shard_name(s), data, {{"format", "pt"}});
  }
  progress.finish();
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text_file(dir + "/model.safetensors.index.json", index.dump(2));
  write_text_file(dir + "/config.json", config.dump(2));
}

std::vector<SynthTensor> drafter_tensors(const DFlashConfig& config) {
  std::vector<SynthTensor> tensors;
  for (const TensorSpec& spec : config.tensor_specs())
    tensors.push_back(
        {spec.name, spec.dtypes[0], spec.shape});  // BF16 dense, I32 packed, BF16 scales, I64 shapes
  return tensors;
}

}  // namespace

void write_synthetic_drafter(const std::string& dir, const json& config, uint64_t seed) {
  const DFlashConfig parsed = DFlashConfig::parse(config.dump(), "synthetic drafter config");
  write_checkpoint(dir, config, drafter_tensors(parsed), seed, uint64_t(2) << 30);
}

void write_synthetic_checkpoint(const std::string& dir, const SynthOptions& options) {
  const json config = synthetic_config(options);
  if (is_drafter_config(config)) {
    const DFlashConfig parsed = DFlashConfig::parse(config.dump(), "synthetic drafter config");
    write_checkpoint(dir, config, drafter_tensors(parsed), options.seed, options.shard_bytes);
  } else {
    write_checkpoint(dir, config,
                     checkpoint_tensors(Qwen35Config::parse(config.dump(), "synthetic config"),
                                        options.arch == "qwen3.5-4b"),
                     options.seed, options.shard_bytes);
  }
  if (!options.tokenizer_dir.empty()) copy_tokenizer_files(options.tokenizer_dir, dir);
}

}  // namespace qspec
