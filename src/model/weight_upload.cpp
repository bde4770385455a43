#include "model/weight_upload.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "io/safetensors.h"

namespace qspec {

Tensor upload_vector(Backend& backend, const TensorStore& store, const std::string& name, int64_t length) {
  const TensorView& view = store.get(name);
  if (view.numel() != length)
    fail("{}: tensor {} has {} elements, expected {}", store.source(), name, view.numel(), length);
  return backend.upload_weight(view, 1, length);
}

namespace {

// For a W4A16 weight (the callers' branch; the backend declines others too).
void keep_dequantized(Backend& backend, LinearWeight& w, std::vector<std::unique_ptr<Buffer>>& storage) {
  if (std::unique_ptr<Buffer> copy = backend.dequantized_copy(w)) {
    w.dequantized = copy->tensor();
    storage.push_back(std::move(copy));
  }
}

}  // namespace

LinearWeight upload_linear(Backend& backend, const LinearTensors& found, int64_t out_features,
                           int64_t in_features, std::vector<std::unique_ptr<Buffer>>& storage) {
  LinearWeight w;
  w.out_features = out_features;
  w.in_features = in_features;
  if (found.weight) {
    w.weight = backend.upload_weight(*found.weight, out_features, in_features);
  } else {
    w.packed = backend.upload_packed_int4(*found.packed, out_features, in_features / 8);
    w.scales = backend.upload_weight(*found.scales, out_features, in_features / found.group_size);
    w.group_size = found.group_size;
    keep_dequantized(backend, w, storage);
  }
  return w;
}

namespace {

bool same_format(const LinearTensors& a, const LinearTensors& b) {
  if (a.quantized() != b.quantized()) return false;
  if (!a.quantized()) return a.weight->dtype == b.weight->dtype;
  return a.group_size == b.group_size && a.scales->dtype == b.scales->dtype;
}

// The modules' tensors (weight, or packed / scales) one under the other in one backend buffer.
Tensor stack_rows(Backend& backend, std::span<const TensorView* const> views, std::span<const int64_t> rows,
                  int64_t cols, std::vector<std::unique_ptr<Buffer>>& storage, bool packed_int4 = false) {
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  const Tensor& stacked = storage.emplace_back(backend.alloc(views.front()->dtype, total, cols))->tensor();
  int64_t first = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i]->numel() != rows[i] * cols)
      fail("{}: {} elements, expected [{}, {}]", views[i]->name, views[i]->numel(), rows[i], cols);
    if (packed_int4)
      backend.write_packed_int4(stacked.rows_view(first, rows[i]), views[i]->data);
    else
      backend.write(stacked.rows_view(first, rows[i]), views[i]->data);
    first += rows[i];
  }
  return stacked;
}

}  // namespace

StackedLinear upload_stacked_linear(Backend& backend, std::span<const LinearTensors> modules,
                                    std::span<const int64_t> out_features, int64_t in_features,
                                    std::vector<std::unique_ptr<Buffer>>& storage) {
  StackedLinear stacked;
  for (int64_t n : out_features) {
    stacked.offsets.push_back(stacked.out_features);
    stacked.out_features += n;
  }
  const bool one_format = std::all_of(modules.begin(), modules.end(), [&](const LinearTensors& m) {
    return same_format(m, modules.front());
  });
  if (!one_format || modules.size() == 1) {
    for (size_t i = 0; i < modules.size(); ++i)
      stacked.parts.push_back(upload_linear(backend, modules[i], out_features[i], in_features, storage));
    return stacked;
  }
  LinearWeight w;
  w.out_features = stacked.out_features;
  w.in_features = in_features;
  const LinearTensors& first = modules.front();
  if (!first.quantized()) {
    std::vector<const TensorView*> weights;
    for (const LinearTensors& m : modules) weights.push_back(m.weight);
    w.weight = stack_rows(backend, weights, out_features, in_features, storage);
  } else {
    std::vector<const TensorView*> packed, scales;
    for (const LinearTensors& m : modules) {
      packed.push_back(m.packed);
      scales.push_back(m.scales);
    }
    w.packed = stack_rows(backend, packed, out_features, in_features / 8, storage, true);
    w.scales = stack_rows(backend, scales, out_features,
                          (in_features + first.group_size - 1) / first.group_size, storage);
    w.group_size = first.group_size;
    keep_dequantized(backend, w, storage);
  }
  stacked.parts.push_back(w);
  return stacked;
}

std::vector<LinearProjection> projections(const Tensor& out, const StackedLinear& stacked) {
  std::vector<LinearProjection> result;
  for (size_t i = 0; i < stacked.parts.size(); ++i)
    result.push_back({out.cols_view(stacked.offsets[i], stacked.parts[i].out_features), stacked.parts[i]});
  return result;
}

void stacked_linear(Backend& backend, const Tensor& out, const Tensor& x, const StackedLinear& stacked) {
  for (const LinearProjection& p : projections(out, stacked)) backend.linear(p.out, x, p.w);
}

void gated_mlp(Backend& backend, const Tensor& out, const Tensor& gate_up, const Tensor& act, const Tensor& x,
               const StackedLinear& gate_up_weight, const LinearWeight& down) {
  stacked_linear(backend, gate_up, x, gate_up_weight);
  backend.silu_gated_linear(out, gate_up, act, down);
}

}  // namespace qspec
