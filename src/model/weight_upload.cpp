#include "model/weight_upload.h"

#include "core/error.h"
#include "io/safetensors.h"

namespace qspec {

Tensor upload_vector(Backend& backend, const TensorStore& store, const std::string& name, int64_t length) {
  const TensorView& view = store.get(name);
  if (view.numel() != length)
    fail("{}: tensor {} has {} elements, expected {}", store.source(), name, view.numel(), length);
  return backend.upload_weight(view, 1, length);
}

LinearWeight upload_linear(Backend& backend, const LinearTensors& found, int64_t out_features,
                           int64_t in_features) {
  LinearWeight w;
  w.out_features = out_features;
  w.in_features = in_features;
  if (found.weight) {
    w.weight = backend.upload_weight(*found.weight, out_features, in_features);
  } else {
    w.packed = backend.upload_weight(*found.packed, out_features, in_features / 8);
    w.scales = backend.upload_weight(*found.scales, out_features, in_features / found.group_size);
    w.group_size = found.group_size;
  }
  return w;
}

}  // namespace qspec
