#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "error_message.h"
#include "io/checkpoint.h"
#include "tiny_checkpoint.h"

namespace qspec {
namespace {

using nlohmann::json;
using tiny::find_tensor;
using tiny::schema_tensors;
using tiny::TempDir;
using tiny::tiny_wrapper_config;
using tiny::zero_tensor;

// Parameters of the tiny model, by hand: embed 256*64 + norm 64; per layer norms 2*64 + MLP 3*128*64;
// GDN qkv 128*64 + z 64*64 + b,a 2*4*64 + conv 128*4 + dt_bias,A_log 2*4 + norm 16 + out 64*64;
// attention q 256*64 + k,v 2*64*64 + o 64*128 + q/k norms 2*32.
constexpr int64_t kTinyParams = 16384 + 64 + 3 * (24704 + 17432) + (24704 + 32832);

Qwen35Config parse(const json& config) {
  return Qwen35Config::parse(config.dump(), "config.json");
}

json quantized_config(int group_size) {
  json config = tiny_wrapper_config(true);
  config["quantization_config"] = tiny::w4a16_quantization_config(group_size);
  return config;
}

// A checkpoint directory written from `config` and `tensors`, opened as a store.
struct Checkpoint {
  TempDir dir;
  Qwen35Config config;
  TensorStore store;

  Checkpoint(const json& config_json, const std::vector<TensorData>& tensors)
      : config(parse(config_json)), store(open(dir, config_json, tensors)) {}

  static TensorStore open(const TempDir& dir, const json& config_json,
                          const std::vector<TensorData>& tensors) {
    tiny::write_checkpoint(dir.path(), config_json, tensors);
    return TensorStore::open_dir(dir.str());
  }
};

std::vector<TensorData> tensors_for(const json& config) {
  return schema_tensors(parse(config));
}

std::string error_of(const std::function<void()>& action) {
  return testing_support::error_message(action, "no error");
}

TEST(CheckpointSchema, TinyModelNamesShapesAndDtypes) {
  const std::vector<TensorSpec> schema = text_model_schema(parse(tiny_wrapper_config(true)));
  EXPECT_EQ(schema.size(), 2u + 3 * 14 + 11);
  auto spec = [&](const std::string& name) {
    auto it = std::find_if(schema.begin(), schema.end(), [&](const TensorSpec& s) { return s.name == name; });
    return it == schema.end() ? std::string("absent") : fmt::format("{}", fmt::join(it->shape, "x"));
  };
  const std::string p = "model.language_model.";
  EXPECT_EQ(spec(p + "embed_tokens.weight"), "256x64");
  EXPECT_EQ(spec(p + "norm.weight"), "64");
  EXPECT_EQ(spec("lm_head.weight"), "absent");  // tied
  EXPECT_EQ(spec(p + "layers.0.input_layernorm.weight"), "64");
  EXPECT_EQ(spec(p + "layers.0.post_attention_layernorm.weight"), "64");
  EXPECT_EQ(spec(p + "layers.0.mlp.gate_proj.weight"), "128x64");
  EXPECT_EQ(spec(p + "layers.0.mlp.up_proj.weight"), "128x64");
  EXPECT_EQ(spec(p + "layers.0.mlp.down_proj.weight"), "64x128");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.in_proj_qkv.weight"), "128x64");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.in_proj_z.weight"), "64x64");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.in_proj_b.weight"), "4x64");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.in_proj_a.weight"), "4x64");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.conv1d.weight"), "128x1x4");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.dt_bias"), "4");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.A_log"), "4");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.norm.weight"), "16");
  EXPECT_EQ(spec(p + "layers.0.linear_attn.out_proj.weight"), "64x64");
  EXPECT_EQ(spec(p + "layers.0.self_attn.q_proj.weight"), "absent");
  EXPECT_EQ(spec(p + "layers.3.self_attn.q_proj.weight"), "256x64");
  EXPECT_EQ(spec(p + "layers.3.self_attn.k_proj.weight"), "64x64");
  EXPECT_EQ(spec(p + "layers.3.self_attn.v_proj.weight"), "64x64");
  EXPECT_EQ(spec(p + "layers.3.self_attn.o_proj.weight"), "64x128");
  EXPECT_EQ(spec(p + "layers.3.self_attn.q_norm.weight"), "32");
  EXPECT_EQ(spec(p + "layers.3.self_attn.k_norm.weight"), "32");
  EXPECT_EQ(spec(p + "layers.3.linear_attn.in_proj_qkv.weight"), "absent");
  for (const TensorSpec& s : schema)
    EXPECT_EQ(s.dtypes, (std::vector<DType>{DType::BF16, DType::F16, DType::F32})) << s.name;
}

TEST(CheckpointSchema, Qwen35_4BHas426TextTensorsAnd4_2BParameters) {
  json config = tiny_wrapper_config(true);
  config["text_config"] = tiny::qwen35_4b_text_config();
  const std::vector<TensorSpec> schema = text_model_schema(parse(config));
  // reference/qwen35-model.md §1.1-2.1: 426 text tensors, 4,205,751,296 text parameters.
  EXPECT_EQ(schema.size(), 426u);
  int64_t params = 0;
  for (const TensorSpec& s : schema) params += s.params;
  EXPECT_EQ(params, 4'205'751'296);
}

TEST(CheckpointSchema, NameHelpers) {
  Qwen35Config wrapper = parse(tiny_wrapper_config(true));
  EXPECT_EQ(model_tensor(wrapper, "embed_tokens.weight"), "model.language_model.embed_tokens.weight");
  EXPECT_EQ(layer_module(wrapper, 3, "self_attn.q_proj"), "model.language_model.layers.3.self_attn.q_proj");
  json causal = tiny::tiny_text_config();
  causal["architectures"] = {"Qwen3_5ForCausalLM"};
  EXPECT_EQ(layer_module(parse(causal), 0, "mlp.up_proj"), "model.layers.0.mlp.up_proj");
}

TEST(CheckpointSchema, QuantizedLinearsAreThreeTensorsAndCountNTimesKParameters) {
  const std::vector<TensorSpec> schema = text_model_schema(parse(quantized_config(32)));
  auto find = [&](const std::string& name) -> const TensorSpec& {
    return *std::find_if(schema.begin(), schema.end(), [&](const TensorSpec& s) { return s.name == name; });
  };
  const std::string m = "model.language_model.layers.0.mlp.down_proj";  // [64, 128]
  EXPECT_EQ(find(m + ".weight_packed").shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(find(m + ".weight_packed").dtypes, std::vector<DType>{DType::I32});
  EXPECT_EQ(find(m + ".weight_packed").format, "W4A16 g32");
  EXPECT_EQ(find(m + ".weight_scale").shape, (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(find(m + ".weight_scale").dtypes, (std::vector<DType>{DType::BF16, DType::F16}));
  EXPECT_EQ(find(m + ".weight_shape").shape, std::vector<int64_t>{2});
  EXPECT_EQ(find(m + ".weight_shape").dtypes, (std::vector<DType>{DType::I64, DType::I32}));
  // in_proj_a is ignored by the quantization config: dense.
  EXPECT_EQ(find("model.language_model.layers.0.linear_attn.in_proj_a.weight").format, "dense");
  int64_t params = 0;
  for (const TensorSpec& s : schema) params += s.params;
  EXPECT_EQ(params, kTinyParams);
}

TEST(CheckpointSchema, RejectsInFeaturesNotAMultipleOfTheGroup) {
  EXPECT_EQ(
      error_of([] { text_model_schema(parse(quantized_config(48))); }),
      "model.language_model.layers.0.linear_attn.in_proj_qkv: in_features 64 must be a multiple of 8 and of "
      "the group size 48 to be W4A16 (quantization_config targets this module)");
}

TEST(CheckCheckpoint, GoodDenseCheckpointWithSkippedTensors) {
  json config = tiny_wrapper_config(true);
  std::vector<TensorData> tensors = tensors_for(config);
  // The 4B stores A_log in F32: any dense dtype is accepted.
  find_tensor(tensors, "model.language_model.layers.0.linear_attn.A_log")->dtype = DType::F32;
  find_tensor(tensors, "model.language_model.layers.0.linear_attn.A_log")->bytes.resize(16);
  tensors.push_back(zero_tensor("mtp.fc.weight", DType::BF16, {64, 128}));
  tensors.push_back(zero_tensor("mtp.norm.weight", DType::BF16, {64}));
  tensors.push_back(zero_tensor("model.visual.patch_embed.proj.weight", DType::BF16, {8, 8}));
  Checkpoint ck(config, tensors);

  CheckpointReport report = check_checkpoint(ck.config, ck.store);
  EXPECT_TRUE(report.ok()) << report.problems();
  EXPECT_EQ(report.problems(), "");
  EXPECT_EQ(report.source, ck.dir.str());
  EXPECT_EQ(report.architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(report.layer_pattern, "linear linear linear full");
  EXPECT_EQ(report.expected_tensors, 55u);
  EXPECT_EQ(report.text_params, kTinyParams);
  ASSERT_EQ(report.skipped.size(), 2u);
  EXPECT_EQ(report.skipped.at("mtp.").names, (std::vector<std::string>{"mtp.fc.weight", "mtp.norm.weight"}));
  EXPECT_EQ(report.skipped.at("mtp.").bytes, (64u * 128 + 64) * 2);
  EXPECT_EQ(report.skipped.at("model.visual.").names.size(), 1u);
  EXPECT_EQ(report.bytes_by_dtype.at("BF16"), uint64_t(kTinyParams - 4) * 2);
  EXPECT_EQ(report.bytes_by_dtype.at("F32"), 16u);
  EXPECT_EQ(report.bytes_by_format.size(), 1u);
  EXPECT_EQ(report.bytes_by_format.at("dense"), uint64_t(kTinyParams - 4) * 2 + 16);
}

TEST(CheckCheckpoint, CausalLmUntiedHasTopLevelLmHeadAndSkipsVisualUnderModel) {
  json config = tiny::tiny_text_config();
  config["architectures"] = {"Qwen3_5ForCausalLM"};
  std::vector<TensorData> tensors = tensors_for(config);
  EXPECT_NE(find_tensor(tensors, "lm_head.weight"), nullptr);
  EXPECT_NE(find_tensor(tensors, "model.layers.3.self_attn.q_norm.weight"), nullptr);
  tensors.push_back(zero_tensor("model.visual.merger.norm.weight", DType::BF16, {8}));
  Checkpoint ck(config, tensors);
  CheckpointReport report = check_checkpoint(ck.config, ck.store);
  EXPECT_TRUE(report.ok()) << report.problems();
  EXPECT_EQ(report.text_params, kTinyParams + 256 * 64);
  EXPECT_EQ(report.skipped.at("model.visual.").names,
            std::vector<std::string>{"model.visual.merger.norm.weight"});

  tensors.pop_back();
  std::erase_if(tensors, [](const TensorData& t) { return t.name == "lm_head.weight"; });
  Checkpoint no_head(config, tensors);
  EXPECT_EQ(check_checkpoint(no_head.config, no_head.store).missing,
            std::vector<std::string>{"lm_head.weight"});
}

TEST(CheckCheckpoint, ReportsMissingUnexpectedMisshapedAndWrongDtype) {
  json config = tiny_wrapper_config(true);
  const std::string p = "model.language_model.layers.";
  std::vector<TensorData> tensors = tensors_for(config);
  std::erase_if(tensors, [&](const TensorData& t) { return t.name == p + "1.linear_attn.in_proj_z.weight"; });
  tensors.push_back(zero_tensor("lm_head.weight", DType::BF16, {256, 64}));  // tied: must not be there
  tensors.push_back(zero_tensor(p + "0.mlp.gate_proj.bias", DType::BF16, {128}));
  *find_tensor(tensors, p + "2.linear_attn.conv1d.weight") =
      zero_tensor(p + "2.linear_attn.conv1d.weight", DType::BF16, {128, 4});
  *find_tensor(tensors, p + "3.self_attn.k_norm.weight") =
      zero_tensor(p + "3.self_attn.k_norm.weight", DType::I8, {32});
  Checkpoint ck(config, tensors);

  CheckpointReport report = check_checkpoint(ck.config, ck.store);
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.missing, std::vector<std::string>{p + "1.linear_attn.in_proj_z.weight"});
  EXPECT_EQ(report.unexpected, (std::vector<std::string>{"lm_head.weight", p + "0.mlp.gate_proj.bias"}));
  ASSERT_EQ(report.mismatched.size(), 2u);
  EXPECT_EQ(report.mismatched[0].name, p + "2.linear_attn.conv1d.weight");
  EXPECT_EQ(report.mismatched[0].expected, "BF16|F16|F32 [128, 1, 4]");
  EXPECT_EQ(report.mismatched[0].got, "BF16 [128, 4]");
  EXPECT_EQ(report.mismatched[1].name, p + "3.self_attn.k_norm.weight");
  EXPECT_EQ(report.mismatched[1].got, "I8 [32]");
  EXPECT_EQ(report.problems(),
            "missing " + p + "1.linear_attn.in_proj_z.weight\n" + "unexpected lm_head.weight\n" +
                "unexpected " + p + "0.mlp.gate_proj.bias\n" + p +
                "2.linear_attn.conv1d.weight: expected BF16|F16|F32 [128, 1, 4], got BF16 [128, 4]\n" + p +
                "3.self_attn.k_norm.weight: expected BF16|F16|F32 [32], got I8 [32]");
}

TEST(CheckCheckpoint, GoodW4A16Checkpoint) {
  json config = quantized_config(32);
  Checkpoint ck(config, tensors_for(config));
  CheckpointReport report = check_checkpoint(ck.config, ck.store);
  EXPECT_TRUE(report.ok()) << report.problems();
  EXPECT_EQ(report.text_params, kTinyParams);
  ASSERT_EQ(report.bytes_by_format.size(), 2u);
  // Quantized: MLP 3*128*64 per layer, GDN qkv/z/out (8192+4096+4096) * 3, attention q/k/v/o
  // (16384+3*4096+8192).
  const uint64_t quantized_params = 4 * 24576 + 3 * 16384 + 32768;
  const uint64_t linears = 4 * 3 + 3 * 3 + 4;  // each with a 16-byte I64 weight_shape
  EXPECT_EQ(report.bytes_by_format.at("W4A16 g32"),
            quantized_params / 2 + quantized_params / 32 * 2 + linears * 16);
  EXPECT_EQ(report.bytes_by_format.at("dense"), (kTinyParams - quantized_params) * 2);
  EXPECT_EQ(report.bytes_by_dtype.at("I32"), quantized_params / 2);
  EXPECT_EQ(report.bytes_by_dtype.at("I64"), linears * 16);
}

TEST(CheckCheckpoint, ReportsWrongPackedShapeAndZeroPointsAndGroupIndices) {
  json config = quantized_config(32);
  const std::string m = "model.language_model.layers.0.mlp.up_proj";
  std::vector<TensorData> tensors = tensors_for(config);
  *find_tensor(tensors, m + ".weight_packed") = zero_tensor(m + ".weight_packed", DType::I32, {128, 16});
  tensors.push_back(zero_tensor(m + ".weight_zero_point", DType::I32, {16, 2}));
  tensors.push_back(zero_tensor(m + ".weight_g_idx", DType::I32, {64}));
  Checkpoint ck(config, tensors);
  CheckpointReport report = check_checkpoint(ck.config, ck.store);
  EXPECT_TRUE(report.missing.empty());
  EXPECT_TRUE(report.unexpected.empty());
  EXPECT_EQ(report.problems(),
            m + ".weight_packed: expected I32 [128, 8], got I32 [128, 16]\n" + m +
                ".weight_g_idx: expected no such tensor: act-order g_idx not supported, got I32 "
                "[64]\n" +
                m +
                ".weight_zero_point: expected no such tensor: asymmetric (zero points) not "
                "supported, got I32 [16, 2]");
}

TEST(CheckCheckpoint, DenseWeightsWhereTheConfigSaysW4A16) {
  json config = quantized_config(32);
  Checkpoint ck(config, tensors_for(tiny_wrapper_config(true)));
  CheckpointReport report = check_checkpoint(ck.config, ck.store);
  EXPECT_EQ(report.missing.size(), 25u * 3);  // packed, scale, shape of each quantized module
  EXPECT_EQ(report.unexpected.size(), 25u);   // their dense .weight
  EXPECT_EQ(std::count(report.missing.begin(), report.missing.end(),
                       "model.language_model.layers.3.self_attn.o_proj.weight_packed"),
            1);
}

TEST(FindLinear, ReturnsDenseOrQuantizedViews) {
  json config = quantized_config(32);
  Checkpoint ck(config, tensors_for(config));
  const std::string layer = "model.language_model.layers.0.";
  LinearTensors up = find_linear(ck.config, ck.store, layer + "mlp.up_proj", 128, 64);
  ASSERT_TRUE(up.quantized());
  EXPECT_EQ(up.weight, nullptr);
  EXPECT_EQ(up.packed->name, layer + "mlp.up_proj.weight_packed");
  EXPECT_EQ(up.scales->name, layer + "mlp.up_proj.weight_scale");
  EXPECT_EQ(up.group_size, 32);
  LinearTensors a = find_linear(ck.config, ck.store, layer + "linear_attn.in_proj_a", 4, 64);
  ASSERT_FALSE(a.quantized());
  EXPECT_EQ(a.weight->name, layer + "linear_attn.in_proj_a.weight");
  EXPECT_EQ(a.scales, nullptr);
}

TEST(FindLinear, RejectsWithTheModuleNamed) {
  json config = quantized_config(32);
  const std::string m = "model.language_model.layers.0.mlp.up_proj";
  const std::string a = "model.language_model.layers.0.linear_attn.in_proj_a";
  std::vector<TensorData> good = tensors_for(config);

  std::vector<TensorData> tensors = good;
  *find_tensor(tensors, m + ".weight_packed") = zero_tensor(m + ".weight_packed", DType::I32, {128, 16});
  Checkpoint packed(config, tensors);
  EXPECT_EQ(error_of([&] { find_linear(packed.config, packed.store, m, 128, 64); }),
            packed.dir.str() + ": module " + m + ": tensor " + m +
                ".weight_packed is I32 [128, 16], expected I32 [128, 8]");

  tensors = good;
  std::erase_if(tensors, [&](const TensorData& t) { return t.name == m + ".weight_scale"; });
  Checkpoint scale(config, tensors);
  EXPECT_EQ(error_of([&] { find_linear(scale.config, scale.store, m, 128, 64); }),
            scale.dir.str() + ": module " + m + " (W4A16 g32): missing tensor " + m +
                ".weight_scale, expected BF16|F16 [128, 2]");

  tensors = good;
  tensors.push_back(zero_tensor(m + ".weight_zero_point", DType::I32, {16, 2}));
  Checkpoint zero_point(config, tensors);
  EXPECT_EQ(error_of([&] { find_linear(zero_point.config, zero_point.store, m, 128, 64); }),
            zero_point.dir.str() + ": module " + m + " has " + m +
                ".weight_zero_point: asymmetric (zero points) not supported");

  tensors = good;
  tensors.push_back(zero_tensor(m + ".weight_g_idx", DType::I32, {64}));
  Checkpoint g_idx(config, tensors);
  EXPECT_EQ(error_of([&] { find_linear(g_idx.config, g_idx.store, m, 128, 64); }),
            g_idx.dir.str() + ": module " + m + " has " + m + ".weight_g_idx: act-order g_idx not supported");

  tensors = good;
  const int64_t swapped[2] = {64, 128};
  std::memcpy(find_tensor(tensors, m + ".weight_shape")->bytes.data(), swapped, sizeof(swapped));
  Checkpoint shape(config, tensors);
  EXPECT_EQ(
      error_of([&] { find_linear(shape.config, shape.store, m, 128, 64); }),
      shape.dir.str() + ": module " + m + ": " + m + ".weight_shape holds [64, 128], expected [128, 64]");

  tensors = good;
  find_tensor(tensors, a + ".weight")->dtype = DType::I16;
  Checkpoint dense(config, tensors);
  EXPECT_EQ(error_of([&] { find_linear(dense.config, dense.store, a, 4, 64); }),
            dense.dir.str() + ": module " + a + ": tensor " + a +
                ".weight is I16 [4, 64], expected BF16|F16|F32 [4, 64]");
  // Asked for the wrong shape, e.g. by a loader bug.
  Checkpoint fine(config, good);
  EXPECT_EQ(error_of([&] { find_linear(fine.config, fine.store, a, 8, 64); }),
            fine.dir.str() + ": module " + a + ": tensor " + a +
                ".weight is BF16 [4, 64], expected BF16|F16|F32 [8, 64]");
}

TEST(FindLinear, AcceptsI32WeightShape) {
  json config = quantized_config(32);
  const std::string m = "model.language_model.layers.0.mlp.up_proj";
  std::vector<TensorData> tensors = tensors_for(config);
  TensorData& shape = *find_tensor(tensors, m + ".weight_shape");
  shape = zero_tensor(shape.name, DType::I32, {2});
  const int32_t values[2] = {128, 64};
  std::memcpy(shape.bytes.data(), values, sizeof(values));
  Checkpoint ck(config, tensors);
  EXPECT_TRUE(find_linear(ck.config, ck.store, m, 128, 64).quantized());
}

// The W4A16 fixtures were written by compressed-tensors itself (tools/oracle): find_linear accepts every
// quantized module, including the weight_shape values it reads.
TEST(FindLinear, AcceptsEveryQuantizedModuleOfTheFixtures) {
  int checked = 0;
  const std::filesystem::path fixtures = QSPEC_FIXTURES_DIR "/qwen35";
  if (std::filesystem::is_directory(fixtures))
    for (const auto& entry : std::filesystem::directory_iterator(fixtures)) {
      const Qwen35Config config = Qwen35Config::load(entry.path().string());
      if (!config.quantization) continue;
      const TensorStore store = TensorStore::open_dir(entry.path().string());
      for (const TensorSpec& spec : text_model_schema(config)) {
        if (!spec.name.ends_with(".weight_packed")) continue;
        const std::string module =
            spec.name.substr(0, spec.name.size() - std::string_view(".weight_packed").size());
        LinearTensors found = find_linear(config, store, module, spec.shape[0], spec.shape[1] * 8);
        EXPECT_TRUE(found.quantized()) << module;
        ++checked;
      }
    }
  if (checked == 0) GTEST_SKIP() << "no W4A16 fixture under " << fixtures;
}

}  // namespace
}  // namespace qspec
