#include "io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "core/error.h"

namespace qspec {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kLengthFieldBytes = 8;
// The limit of the reference implementation: a longer header is a corrupt or hostile length field.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
constexpr std::string_view kSingleFileName = "model.safetensors";

std::string format_shape(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape.begin(), shape.end(), ", "));
}

bool has_negative_dim(std::span<const int64_t> shape) {
  return std::any_of(shape.begin(), shape.end(), [](int64_t dim) { return dim < 0; });
}

// numel x dtype size for non-negative dims; nullopt when that does not fit in 64 bits.
std::optional<uint64_t> tensor_bytes(std::span<const int64_t> shape, DType dtype) {
  uint64_t bytes = dtype_size(dtype);
  for (int64_t dim : shape)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) return std::nullopt;
  return bytes;
}

std::string known_dtype_names() {
  std::vector<std::string_view> names;
  // F64 is the last DType enumerator.
  for (int i = 0; i <= static_cast<int>(DType::F64); ++i) names.push_back(dtype_name(static_cast<DType>(i)));
  return fmt::format("{}", fmt::join(names, ", "));
}

// A JSON value for an error message, cut short: a hostile header can put megabytes into one field.
std::string brief(const json& value) {
  constexpr size_t kMaxChars = 60;
  std::string text = value.dump();
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars - 3) + "...";
  return text;
}

// nlohmann stores non-negative literals as unsigned and negative ones as signed; both are integers here.
std::optional<int64_t> json_int64(const json& value) {
  if (value.is_number_unsigned()) {
    const auto number = value.get<uint64_t>();
    if (number > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(number);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

// nlohmann silently keeps the last of repeated keys; the parser callback sees every key, so repeats are
// caught.
json parse_json_object(std::string_view text, const std::string& path) {
  std::vector<std::set<std::string>> keys_of_open_objects;
  auto reject_repeated_keys = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys_of_open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys_of_open_objects.pop_back();
    } else if (event == json::parse_event_t::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys_of_open_objects.back().insert(key).second)
        fail("{}: key \"{}\" appears twice in the JSON", path, key);
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text.begin(), text.end(), reject_repeated_keys);
  } catch (const json::parse_error& e) {
    fail("{}: not well-formed JSON: {}", path, e.what());
  }
  if (!parsed.is_object()) fail("{}: expected a JSON object, got {}", path, parsed.type_name());
  return parsed;
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& path) {
  if (!value.is_object())
    fail("{}: \"{}\" must be an object of strings, got {}", path, kMetadataKey, brief(value));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, entry] : value.items()) {
    if (!entry.is_string())
      fail("{}: \"{}\" entry \"{}\" must be a string, got {}", path, kMetadataKey, key, brief(entry));
    metadata.emplace(key, entry.get<std::string>());
  }
  return metadata;
}

const json& required_field(const json& entry, const char* field, const std::string& where) {
  auto it = entry.find(field);
  if (it == entry.end()) fail("{}: missing field \"{}\"", where, field);
  return *it;
}

DType parse_dtype(const json& entry, const std::string& where) {
  const json& field = required_field(entry, "dtype", where);
  if (!field.is_string()) fail("{}: \"dtype\" must be a string, got {}", where, brief(field));
  const auto& name = field.get_ref<const std::string&>();
  std::optional<DType> dtype = dtype_from_name(name);
  if (!dtype) fail("{}: unknown dtype \"{}\" (known: {})", where, name, known_dtype_names());
  return *dtype;
}

std::vector<int64_t> parse_shape(const json& entry, const std::string& where) {
  const json& field = required_field(entry, "shape", where);
  if (!field.is_array()) fail("{}: \"shape\" must be an array of integers, got {}", where, brief(field));
  std::vector<int64_t> shape;
  for (const json& dim : field) {
    std::optional<int64_t> value = json_int64(dim);
    if (!value) fail("{}: \"shape\" must be an array of integers, got {}", where, brief(field));
    shape.push_back(*value);
  }
  if (has_negative_dim(shape)) fail("{}: negative dimension in shape {}", where, format_shape(shape));
  return shape;
}

std::pair<uint64_t, uint64_t> parse_data_offsets(const json& entry, const std::string& where) {
  const json& field = required_field(entry, "data_offsets", where);
  std::optional<int64_t> begin;
  std::optional<int64_t> end;
  if (field.is_array() && field.size() == 2) {
    begin = json_int64(field[0]);
    end = json_int64(field[1]);
  }
  if (!begin || !end || *begin < 0 || *begin > *end)
    fail("{}: \"data_offsets\" must be [begin, end] with integers 0 <= begin <= end, got {}", where,
         brief(field));
  return {static_cast<uint64_t>(*begin), static_cast<uint64_t>(*end)};
}

// Validates one header entry against the payload [payload, payload + payload_size).
TensorView parse_tensor_entry(const std::string& name, const json& entry, const std::string& path,
                              const uint8_t* payload, uint64_t payload_size) {
  const std::string where = fmt::format("{}: tensor \"{}\"", path, name);
  if (!entry.is_object())
    fail("{}: expected an object with dtype, shape and data_offsets, got {}", where, brief(entry));
  TensorView view{.name = name, .dtype = parse_dtype(entry, where), .shape = parse_shape(entry, where)};
  std::optional<uint64_t> nbytes = tensor_bytes(view.shape, view.dtype);
  if (!nbytes)
    fail("{}: shape {} of {} has a byte size that overflows 64 bits", where, view.shape_string(),
         dtype_name(view.dtype));
  auto [begin, end] = parse_data_offsets(entry, where);
  if (end > payload_size)
    fail("{}: data_offsets [{}, {}] ends past the payload of {} bytes", where, begin, end, payload_size);
  if (end - begin != *nbytes)
    fail("{}: data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", where, begin, end,
         end - begin, view.shape_string(), dtype_name(view.dtype), *nbytes);
  view.data = payload + begin;
  view.nbytes = static_cast<size_t>(*nbytes);
  return view;
}

// Tensors may leave gaps but must not share bytes; empty tensors hold no bytes and so overlap nothing.
void check_disjoint(const std::vector<TensorView>& tensors, const std::string& path, const uint8_t* payload) {
  std::vector<const TensorView*> by_start;
  for (const TensorView& view : tensors)
    if (view.nbytes > 0) by_start.push_back(&view);
  std::sort(by_start.begin(), by_start.end(),
            [](const TensorView* a, const TensorView* b) { return a->data < b->data; });
  // Sorted by start, the tensors are disjoint exactly when each neighbouring pair is.
  for (size_t i = 1; i < by_start.size(); ++i) {
    const TensorView& prev = *by_start[i - 1];
    const TensorView& next = *by_start[i];
    if (next.data < prev.data + prev.nbytes)
      fail("{}: tensors \"{}\" [{}, {}) and \"{}\" [{}, {}) overlap", path, prev.name, prev.data - payload,
           prev.data + prev.nbytes - payload, next.name, next.data - payload,
           next.data + next.nbytes - payload);
  }
}

uint64_t read_u64_le(const uint8_t* bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < kLengthFieldBytes; ++i) value |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return value;
}

std::array<char, kLengthFieldBytes> u64_le(uint64_t value) {
  std::array<char, kLengthFieldBytes> bytes{};
  for (size_t i = 0; i < kLengthFieldBytes; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// The weight_map of a sharded checkpoint's index: tensor name -> shard file name (a file beside the index).
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  MappedFile index_file(index_path);
  const json index = parse_json_object(
      std::string_view(reinterpret_cast<const char*>(index_file.data()), index_file.size()), index_path);
  auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object())
    fail("{}: expected \"weight_map\": an object of tensor name -> shard file name", index_path);
  std::map<std::string, std::string> shard_of;
  for (const auto& [name, shard] : weight_map->items()) {
    if (!shard.is_string())
      fail("{}: weight_map entry \"{}\" must be a shard file name, got {}", index_path, name, brief(shard));
    const auto& shard_name = shard.get_ref<const std::string&>();
    if (shard_name.empty() || shard_name == "." || shard_name == ".." ||
        fs::path(shard_name).filename() != shard_name)
      fail("{}: weight_map entry \"{}\" names shard \"{}\", expected a file name in the index's directory",
           index_path, name, shard_name);
    shard_of.emplace(name, shard_name);
  }
  return shard_of;
}

// Removes a partly written file when the write fails, so a failure never leaves one behind.
class RemoveUnlessKept {
 public:
  explicit RemoveUnlessKept(std::string path) : path_(std::move(path)) {}
  ~RemoveUnlessKept() {
    std::error_code ignored;
    if (!kept_) fs::remove(path_, ignored);
  }
  RemoveUnlessKept(const RemoveUnlessKept&) = delete;
  RemoveUnlessKept& operator=(const RemoveUnlessKept&) = delete;

  void keep() { kept_ = true; }

 private:
  std::string path_;
  bool kept_ = false;
};

}  // namespace

int64_t TensorView::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::string TensorView::shape_string() const {
  return format_shape(shape);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  if (file_.size() < kLengthFieldBytes)
    fail("{}: {} bytes is too short for a safetensors file (the header length alone is {} bytes)", path,
         file_.size(), kLengthFieldBytes);
  const uint64_t header_size = read_u64_le(file_.data());
  if (header_size > kMaxHeaderBytes)
    fail("{}: header length {} is absurd (the limit is {} bytes)", path, header_size, kMaxHeaderBytes);
  if (header_size > file_.size() - kLengthFieldBytes)
    fail("{}: header length {} runs past the end of the {}-byte file", path, header_size, file_.size());

  const uint8_t* header_begin = file_.data() + kLengthFieldBytes;
  const json header = parse_json_object(
      std::string_view(reinterpret_cast<const char*>(header_begin), static_cast<size_t>(header_size)), path);
  const uint8_t* payload = header_begin + header_size;
  const uint64_t payload_size = file_.size() - kLengthFieldBytes - header_size;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      metadata_ = parse_metadata(value, path);
    } else {
      tensors_.push_back(parse_tensor_entry(key, value, path, payload, payload_size));
      tensors_.back().file = &file_.path();
    }
  }
  check_disjoint(tensors_, path, payload);
}

TensorStore TensorStore::open_file(const std::string& path) {
  TensorStore store;
  store.source_ = path;
  store.add_file(std::make_unique<SafetensorsFile>(path));
  return store;
}

TensorStore TensorStore::open_dir(const std::string& dir) {
  // The error_code overloads answer false instead of throwing for an unreadable or non-directory `dir`.
  std::error_code ignored;
  const fs::path index_path = fs::path(dir) / kIndexFileName;
  if (!fs::exists(index_path, ignored)) {
    const fs::path single_path = fs::path(dir) / kSingleFileName;
    if (!fs::exists(single_path, ignored)) fail("no {} or {} in {}", kSingleFileName, kIndexFileName, dir);
    TensorStore store = open_file(single_path.string());
    store.source_ = dir;
    return store;
  }

  const std::string index = index_path.string();
  const std::map<std::string, std::string> shard_of = read_weight_map(index);
  TensorStore store;
  store.source_ = dir;
  auto shard_path = [&](const std::string& shard) { return (fs::path(dir) / shard).string(); };
  std::set<std::string> distinct_shards;
  for (const auto& [name, shard] : shard_of) distinct_shards.insert(shard);
  for (const std::string& shard : distinct_shards) {
    if (!fs::is_regular_file(shard_path(shard), ignored))
      fail("{}: shard file {} is missing", index, shard_path(shard));
    store.add_file(std::make_unique<SafetensorsFile>(shard_path(shard)));
  }
  for (const auto& [name, shard] : shard_of) {
    const TensorView* view = store.find(name);
    if (!view || *view->file != shard_path(shard))
      fail("{}: tensor \"{}\" is not in its shard {}", index, name, shard_path(shard));
  }
  for (const TensorView* view : store.all())
    if (!shard_of.contains(view->name))
      fail("{}: tensor \"{}\" of shard {} is missing from the weight_map", index, view->name, *view->file);
  return store;
}

void TensorStore::add_file(std::unique_ptr<SafetensorsFile> file) {
  for (const TensorView& view : file->tensors()) {
    auto [it, inserted] = by_name_.emplace(view.name, &view);
    if (!inserted) fail("tensor \"{}\" is in both {} and {}", view.name, *it->second->file, file->path());
  }
  files_.push_back(std::move(file));
  all_.clear();
  for (const auto& [name, view] : by_name_) all_.push_back(view);
}

const TensorView* TensorStore::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorView& TensorStore::get(std::string_view name) const {
  const TensorView* view = find(name);
  if (!view) fail("missing tensor {} in {}", name, source_);
  return *view;
}

void write_safetensors(const std::string& path, std::span<const TensorData> tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  uint64_t offset = 0;
  for (const TensorData& tensor : tensors) {
    const std::string where = fmt::format("{}: tensor \"{}\"", path, tensor.name);
    if (tensor.name == kMetadataKey) fail("{}: the name is reserved for the metadata", where);
    if (header.contains(tensor.name)) fail("{}: given twice", where);
    if (has_negative_dim(tensor.shape))
      fail("{}: negative dimension in shape {}", where, format_shape(tensor.shape));
    std::optional<uint64_t> nbytes = tensor_bytes(tensor.shape, tensor.dtype);
    if (!nbytes) fail("{}: shape {} is too large", where, format_shape(tensor.shape));
    if (*nbytes != tensor.bytes.size())
      fail("{}: has {} bytes but shape {} of {} needs {}", where, tensor.bytes.size(),
           format_shape(tensor.shape), dtype_name(tensor.dtype), *nbytes);
    header[tensor.name] = {{"dtype", std::string(dtype_name(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + *nbytes}}};
    offset += *nbytes;
  }
  std::string header_text = header.dump();
  // A header of a multiple of 8 bytes keeps the payload 8-byte aligned in the mapping.
  header_text.append((kLengthFieldBytes - header_text.size() % kLengthFieldBytes) % kLengthFieldBytes, ' ');

  const std::string temp_path = path + ".tmp";
  std::ofstream out(temp_path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create {}: {}", path, temp_path, std::strerror(errno));
  RemoveUnlessKept temp_file(temp_path);
  const auto length_field = u64_le(header_text.size());
  out.write(length_field.data(), static_cast<std::streamsize>(length_field.size()));
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  for (const TensorData& tensor : tensors)
    out.write(reinterpret_cast<const char*>(tensor.bytes.data()),
              static_cast<std::streamsize>(tensor.bytes.size()));
  out.close();
  if (!out) fail("{}: writing {} failed", path, temp_path);
  std::error_code error;
  fs::rename(temp_path, path, error);
  if (error) fail("{}: cannot rename {} into place: {}", path, temp_path, error.message());
  temp_file.keep();
}

}  // namespace qspec
