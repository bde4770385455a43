// safetensors checkpoints: single files and sharded directories, memory-mapped and validated before use.
//
// Format: u64 little-endian header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [b,
// e]},
// "__metadata__": {...}}, then the payload; offsets are relative to byte 8 + N.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace qspec {

struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapped file; pages are read only when touched
  size_t nbytes = 0;
  const std::string* file = nullptr;  // the path of the file that holds it

  int64_t numel() const;
  std::string shape_string() const;  // "[8192, 2560]"
};

// One .safetensors file. The constructor validates the whole header (length within the file, well-formed JSON
// without repeated keys, known dtypes, offsets in bounds, non-overlapping, consistent with shape x dtype
// size) and throws Error naming the file and the tensor on the first problem. Tensor bytes are not read.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  // Views point into the mapping and at path(): the object stays where it was built.
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: `model.safetensors`, or `model.safetensors.index.json` + its shards
// (every tensor the index names must be in the shard it names, every tensor of a shard must be in the index,
// and no tensor may appear twice). source() is the directory or the single file.
class TensorStore {
 public:
  static TensorStore open_dir(const std::string& dir);
  static TensorStore open_file(const std::string& path);

  const TensorView* find(std::string_view name) const;
  const TensorView& get(std::string_view name) const;  // throws Error "missing tensor NAME in SOURCE"
  const std::vector<const TensorView*>& all() const { return all_; }
  const std::string& source() const { return source_; }

 private:
  void add_file(std::unique_ptr<SafetensorsFile> file);  // throws if one of its tensors is already present

  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> by_name_;
  std::vector<const TensorView*> all_;  // in name order
};

// For writers (synthetic checkpoints, test fixtures): one tensor with its raw little-endian bytes.
struct TensorData {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes the tensors contiguously in the given order after a header space-padded to a multiple of 8 bytes.
// The file appears at `path` only once complete (written to `path + ".tmp"`, then renamed).
void write_safetensors(const std::string& path, std::span<const TensorData> tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace qspec
