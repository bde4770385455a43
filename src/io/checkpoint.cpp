#include "io/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_map>

#include "core/error.h"

namespace qspec {

namespace {

const std::vector<DType> kDenseDtypes = {DType::BF16, DType::F16, DType::F32};
const std::vector<DType> kScaleDtypes = {DType::BF16, DType::F16};
const std::vector<DType> kShapeDtypes = {DType::I64, DType::I32};
constexpr int kNibblesPerWord = 8;
constexpr std::string_view kDenseFormat = "dense";

// Tensors that compressed-tensors writes for schemes qspec does not run; naming them beats "unexpected".
struct UnsupportedTensor {
  std::string_view suffix;
  std::string_view why;
};
constexpr std::array kUnsupportedTensors = {
    UnsupportedTensor{".weight_zero_point", "asymmetric (zero points) not supported"},
    UnsupportedTensor{".weight_g_idx", "act-order g_idx not supported"},
};

TensorSpec dense_spec(std::string name, std::vector<int64_t> shape) {
  int64_t params = 1;
  for (int64_t d : shape) params *= d;
  return TensorSpec{std::move(name), std::move(shape), kDenseDtypes, params, std::string(kDenseFormat)};
}

std::string spec_string(const TensorSpec& spec) {
  std::vector<std::string_view> names;
  for (DType t : spec.dtypes) names.push_back(dtype_name(t));
  return fmt::format("{} [{}]", fmt::join(names, "|"), fmt::join(spec.shape, ", "));
}

std::string view_string(const TensorView& view) {
  return fmt::format("{} {}", dtype_name(view.dtype), view.shape_string());
}

bool matches(const TensorSpec& spec, const TensorView& view) {
  return view.shape == spec.shape &&
         std::find(spec.dtypes.begin(), spec.dtypes.end(), view.dtype) != spec.dtypes.end();
}

int64_t read_integer(const TensorView& view, size_t index) {
  if (view.dtype == DType::I64) {
    int64_t value;
    std::memcpy(&value, view.data + index * sizeof(value), sizeof(value));
    return value;
  }
  int32_t value;
  std::memcpy(&value, view.data + index * sizeof(value), sizeof(value));
  return value;
}

void add_layer_specs(const Qwen35Config& c, int layer, std::vector<TensorSpec>& specs) {
  const int64_t H = c.hidden_size, FF = c.intermediate_size;
  auto name = [&](std::string_view suffix) { return layer_module(c, layer, suffix); };
  auto add_linear = [&](std::string_view module, int64_t out_features, int64_t in_features) {
    for (TensorSpec& spec : linear_tensor_specs(c, name(module), out_features, in_features))
      specs.push_back(std::move(spec));
  };
  specs.push_back(dense_spec(name("input_layernorm.weight"), {H}));
  if (c.layer_types[size_t(layer)] == LayerType::LinearAttention) {
    const int64_t conv_dim = c.conv_dim(), value_dim = c.linear_value_dim(), nv = c.linear_num_value_heads;
    add_linear("linear_attn.in_proj_qkv", conv_dim, H);
    add_linear("linear_attn.in_proj_z", value_dim, H);
    add_linear("linear_attn.in_proj_b", nv, H);
    add_linear("linear_attn.in_proj_a", nv, H);
    specs.push_back(dense_spec(name("linear_attn.conv1d.weight"), {conv_dim, 1, c.conv_kernel}));
    specs.push_back(dense_spec(name("linear_attn.dt_bias"), {nv}));
    specs.push_back(dense_spec(name("linear_attn.A_log"), {nv}));
    specs.push_back(dense_spec(name("linear_attn.norm.weight"), {c.linear_value_head_dim}));
    add_linear("linear_attn.out_proj", H, value_dim);
  } else {
    const int64_t q_dim = int64_t(c.num_heads) * c.head_dim, kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
    add_linear("self_attn.q_proj", 2 * q_dim, H);  // query and output gate, interleaved per head
    add_linear("self_attn.k_proj", kv_dim, H);
    add_linear("self_attn.v_proj", kv_dim, H);
    add_linear("self_attn.o_proj", H, q_dim);
    specs.push_back(dense_spec(name("self_attn.q_norm.weight"), {c.head_dim}));
    specs.push_back(dense_spec(name("self_attn.k_norm.weight"), {c.head_dim}));
  }
  specs.push_back(dense_spec(name("post_attention_layernorm.weight"), {H}));
  add_linear("mlp.gate_proj", FF, H);
  add_linear("mlp.up_proj", FF, H);
  add_linear("mlp.down_proj", H, FF);
}

const UnsupportedTensor* unsupported_tensor(std::string_view name) {
  for (const UnsupportedTensor& t : kUnsupportedTensors)
    if (name.ends_with(t.suffix)) return &t;
  return nullptr;
}

}  // namespace

std::string model_tensor(const Qwen35Config& config, std::string_view suffix) {
  return config.tensor_prefix + std::string(suffix);
}

std::string layer_module(const Qwen35Config& config, int layer, std::string_view suffix) {
  return fmt::format("{}layers.{}.{}", config.tensor_prefix, layer, suffix);
}

std::vector<TensorSpec> linear_tensor_specs(const Qwen35Config& config, const std::string& module,
                                            int64_t out_features, int64_t in_features) {
  std::optional<WeightQuantScheme> scheme;
  if (config.quantization) scheme = config.quantization->scheme_for(module);
  if (!scheme) return {dense_spec(module + ".weight", {out_features, in_features})};

  const int64_t group = scheme->group_size;
  if (in_features % kNibblesPerWord != 0 || in_features % group != 0)
    fail(
        "{}: in_features {} must be a multiple of 8 and of the group size {} to be W4A16 "
        "(quantization_config "
        "targets this module)",
        module, in_features, group);
  const std::string format = fmt::format("W4A16 g{}", group);
  return {
      TensorSpec{module + ".weight_packed",
                 {out_features, in_features / kNibblesPerWord},
                 {DType::I32},
                 out_features * in_features,
                 format},
      TensorSpec{module + ".weight_scale", {out_features, in_features / group}, kScaleDtypes, 0, format},
      TensorSpec{module + ".weight_shape", {2}, kShapeDtypes, 0, format},
  };
}

std::vector<TensorSpec> text_model_schema(const Qwen35Config& config) {
  const int64_t V = config.vocab_size, H = config.hidden_size;
  std::vector<TensorSpec> specs;
  specs.push_back(dense_spec(model_tensor(config, "embed_tokens.weight"), {V, H}));
  for (int layer = 0; layer < config.num_layers; ++layer) add_layer_specs(config, layer, specs);
  specs.push_back(dense_spec(model_tensor(config, "norm.weight"), {H}));
  if (!config.tie_word_embeddings)
    for (TensorSpec& spec : linear_tensor_specs(config, std::string(kLmHeadModule), V, H))
      specs.push_back(std::move(spec));
  return specs;
}

LinearTensors find_linear(const Qwen35Config& config, const TensorStore& store, const std::string& module,
                          int64_t out_features, int64_t in_features) {
  std::vector<TensorSpec> specs = linear_tensor_specs(config, module, out_features, in_features);
  std::vector<const TensorView*> views;
  for (const TensorSpec& spec : specs) {
    const TensorView* view = store.find(spec.name);
    if (!view)
      fail("{}: module {} ({}): missing tensor {}, expected {}", store.source(), module, spec.format,
           spec.name, spec_string(spec));
    if (!matches(spec, *view))
      fail("{}: module {}: tensor {} is {}, expected {}", store.source(), module, spec.name,
           view_string(*view), spec_string(spec));
    views.push_back(view);
  }
  LinearTensors found;
  if (views.size() == 1) {
    found.weight = views[0];
    return found;
  }
  for (const UnsupportedTensor& t : kUnsupportedTensors)
    if (store.find(module + std::string(t.suffix)))
      fail("{}: module {} has {}{}: {}", store.source(), module, module, t.suffix, t.why);
  const TensorView& shape = *views[2];
  if (read_integer(shape, 0) != out_features || read_integer(shape, 1) != in_features)
    fail("{}: module {}: {} holds [{}, {}], expected [{}, {}]", store.source(), module, shape.name,
         read_integer(shape, 0), read_integer(shape, 1), out_features, in_features);
  found.packed = views[0];
  found.scales = views[1];
  found.group_size = config.quantization->scheme_for(module)->group_size;
  return found;
}

std::string CheckpointReport::problems() const {
  std::vector<std::string> lines;
  for (const std::string& name : missing) lines.push_back("missing " + name);
  for (const std::string& name : unexpected) lines.push_back("unexpected " + name);
  for (const TensorMismatch& m : mismatched)
    lines.push_back(fmt::format("{}: expected {}, got {}", m.name, m.expected, m.got));
  return fmt::format("{}", fmt::join(lines, "\n"));
}

CheckpointReport check_checkpoint(const Qwen35Config& config, const TensorStore& store) {
  CheckpointReport report;
  report.source = store.source();
  report.architecture = config.architecture;
  report.layer_pattern = config.layer_pattern();

  const std::vector<TensorSpec> schema = text_model_schema(config);
  report.expected_tensors = schema.size();
  std::unordered_map<std::string_view, const TensorSpec*> by_name;
  for (const TensorSpec& spec : schema) {
    by_name.emplace(spec.name, &spec);
    report.text_params += spec.params;
    const TensorView* view = store.find(spec.name);
    if (!view) {
      report.missing.push_back(spec.name);
    } else if (!matches(spec, *view)) {
      report.mismatched.push_back({spec.name, spec_string(spec), view_string(*view)});
    } else {
      report.bytes_by_dtype[std::string(dtype_name(view->dtype))] += view->nbytes;
      report.bytes_by_format[spec.format] += view->nbytes;
    }
  }

  for (const TensorView* view : store.all()) {
    if (by_name.contains(view->name)) continue;
    auto prefix = std::find_if(config.skipped_prefixes.begin(), config.skipped_prefixes.end(),
                               [&](const std::string& p) { return view->name.starts_with(p); });
    if (prefix != config.skipped_prefixes.end()) {
      SkippedTensors& skipped = report.skipped[*prefix];
      skipped.names.push_back(view->name);
      skipped.bytes += view->nbytes;
    } else if (const UnsupportedTensor* unsupported = unsupported_tensor(view->name)) {
      report.mismatched.push_back(
          {view->name, fmt::format("no such tensor: {}", unsupported->why), view_string(*view)});
    } else {
      report.unexpected.push_back(view->name);
    }
  }
  return report;
}

}  // namespace qspec
