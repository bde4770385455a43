#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "temp_dir.h"

namespace qspec {
namespace {

namespace fs = std::filesystem;
using testing_support::TempDir;

// Passes when `action` throws qspec::Error and its message holds every one of `parts`.
template <typename Action>
::testing::AssertionResult ThrowsErrorMentioning(Action action,
                                                 std::initializer_list<std::string_view> parts) {
  try {
    action();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (std::string_view part : parts)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << part << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw something other than qspec::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "threw nothing";
}

std::vector<uint8_t> u64_le(uint64_t value) {
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(value >> (8 * i)));
  return bytes;
}

// A file assembled by hand (not by the writer), so the reader's checks meet exactly the bytes under test.
std::vector<uint8_t> raw_safetensors(std::string_view header, size_t payload_bytes = 0) {
  std::vector<uint8_t> bytes = u64_le(header.size());
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (size_t i = 0; i < payload_bytes; ++i) bytes.push_back(static_cast<uint8_t>(i));
  return bytes;
}

void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_text(const fs::path& path, std::string_view text) {
  write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
}

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<uint8_t> counting_bytes(size_t count, uint8_t first) {
  std::vector<uint8_t> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<uint8_t>(first + i);
  return bytes;
}

std::vector<uint8_t> bytes_of(const TensorView& view) {
  return {view.data, view.data + view.nbytes};
}

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes a hand-made file and checks that opening it fails with a message naming the file and `parts`.
  ::testing::AssertionResult RejectsHeader(std::string_view header, size_t payload_bytes,
                                           std::initializer_list<std::string_view> parts) {
    const fs::path path = dir_.path() / "bad.safetensors";
    write_file(path, raw_safetensors(header, payload_bytes));
    ::testing::AssertionResult names_file =
        ThrowsErrorMentioning([&] { SafetensorsFile file(path.string()); }, {path.string()});
    if (!names_file) return names_file;
    return ThrowsErrorMentioning([&] { SafetensorsFile file(path.string()); }, parts);
  }

  TempDir dir_;
};

TEST_F(SafetensorsTest, RoundTripsDtypesShapesScalarsAndEmptyTensors) {
  const std::vector<TensorData> tensors = {
      {"w.f32", DType::F32, {2, 3}, counting_bytes(24, 0)},
      {"w.bf16", DType::BF16, {4}, counting_bytes(8, 100)},
      {"scalar.i64", DType::I64, {}, counting_bytes(8, 7)},
      {"empty.u8", DType::U8, {0, 5}, {}},
      {"fp8", DType::F8_E4M3, {3, 1, 2}, counting_bytes(6, 200)},
  };
  const fs::path path = dir_.path() / "model.safetensors";
  write_safetensors(path.string(), tensors);

  SafetensorsFile file(path.string());
  ASSERT_EQ(file.tensors().size(), tensors.size());
  EXPECT_TRUE(file.metadata().empty());
  for (const TensorData& expected : tensors) {
    SCOPED_TRACE(expected.name);
    auto it = std::find_if(file.tensors().begin(), file.tensors().end(),
                           [&](const TensorView& view) { return view.name == expected.name; });
    ASSERT_NE(it, file.tensors().end());
    EXPECT_EQ(it->dtype, expected.dtype);
    EXPECT_EQ(it->shape, expected.shape);
    EXPECT_EQ(it->nbytes, expected.bytes.size());
    EXPECT_EQ(bytes_of(*it), expected.bytes);
    EXPECT_EQ(*it->file, path.string());
  }

  TensorStore store = TensorStore::open_file(path.string());
  EXPECT_EQ(store.source(), path.string());
  const TensorView& scalar = store.get("scalar.i64");
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.shape_string(), "[]");
  EXPECT_EQ(store.get("w.f32").shape_string(), "[2, 3]");
  EXPECT_EQ(store.get("w.f32").numel(), 6);
  EXPECT_EQ(store.get("empty.u8").numel(), 0);
  EXPECT_EQ(store.get("empty.u8").nbytes, 0u);
}

TEST_F(SafetensorsTest, WriterPadsHeaderAndStoresTensorsContiguouslyInOrder) {
  const std::vector<TensorData> tensors = {
      {"b", DType::U8, {3}, counting_bytes(3, 1)},
      {"a", DType::U16, {2}, counting_bytes(4, 50)},
  };
  const fs::path path = dir_.path() / "x.safetensors";
  write_safetensors(path.string(), tensors);
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));

  const std::vector<uint8_t> bytes = read_file(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);  // the test machine is little-endian
  EXPECT_EQ(header_size % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + header_size + 7);
  const std::vector<uint8_t> payload(bytes.begin() + static_cast<std::ptrdiff_t>(8 + header_size),
                                     bytes.end());
  EXPECT_EQ(payload, (std::vector<uint8_t>{1, 2, 3, 50, 51, 52, 53}));

  TensorStore store = TensorStore::open_file(path.string());
  EXPECT_EQ(store.get("a").data, store.get("b").data + 3) << "views point into one mapping, in write order";
}

TEST_F(SafetensorsTest, MetadataRoundTrips) {
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo \"quoted\""}};
  const std::vector<TensorData> tensors = {{"t", DType::F16, {1}, {0, 60}}};
  const fs::path path = dir_.path() / "m.safetensors";
  write_safetensors(path.string(), tensors, metadata);
  SafetensorsFile file(path.string());
  EXPECT_EQ(file.metadata(), metadata);
  ASSERT_EQ(file.tensors().size(), 1u);
}

TEST_F(SafetensorsTest, ReadsHandMadeFileWithSpacePaddingGapsAndEmptyTensorInsideAnother) {
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
      R"("gap":{"dtype":"I16","shape":[2],"data_offsets":[4,8]},)"
      R"("empty":{"dtype":"F32","shape":[0],"data_offsets":[5,5]}}     )";
  const fs::path path = dir_.path() / "hand.safetensors";
  write_file(path, raw_safetensors(header, 8));
  TensorStore store = TensorStore::open_file(path.string());
  ASSERT_EQ(store.all().size(), 3u);
  EXPECT_EQ(store.all()[0]->name, "a");
  EXPECT_EQ(store.all()[1]->name, "empty");
  EXPECT_EQ(store.all()[2]->name, "gap");
  EXPECT_EQ(bytes_of(store.get("gap")), (std::vector<uint8_t>{4, 5, 6, 7}));
}

TEST_F(SafetensorsTest, RejectsFileShorterThanLengthField) {
  for (size_t size : {size_t{0}, size_t{5}}) {
    const fs::path path = dir_.path() / "x.safetensors";
    write_file(path, std::vector<uint8_t>(size, 0));
    EXPECT_TRUE(
        ThrowsErrorMentioning([&] { SafetensorsFile file(path.string()); }, {path.string(), "too short"}))
        << size << " bytes";
  }
}

TEST_F(SafetensorsTest, RejectsAbsurdHeaderLength) {
  const fs::path path = dir_.path() / "x.safetensors";
  write_file(path, u64_le(uint64_t{1} << 62));
  EXPECT_TRUE(ThrowsErrorMentioning([&] { SafetensorsFile file(path.string()); },
                                    {path.string(), "header length 4611686018427387904 is absurd"}));
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  const fs::path path = dir_.path() / "long.safetensors";
  std::vector<uint8_t> bytes = u64_le(100);
  bytes.insert(bytes.end(), {'{', '}'});
  write_file(path, bytes);
  EXPECT_TRUE(
      ThrowsErrorMentioning([&] { SafetensorsFile file(path.string()); },
                            {path.string(), "header length 100", "past the end of the 10-byte file"}));
}

TEST_F(SafetensorsTest, RejectsMalformedJson) {
  EXPECT_TRUE(RejectsHeader(R"({"a": {"dtype": )", 0, {"not well-formed JSON"}));
  EXPECT_TRUE(RejectsHeader("", 0, {"not well-formed JSON"}));
  EXPECT_TRUE(RejectsHeader("{\"\xff\": 1}", 0, {"not well-formed JSON"}));
  EXPECT_TRUE(RejectsHeader("{} x", 0, {"not well-formed JSON"}));
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAnObject) {
  EXPECT_TRUE(RejectsHeader("[1, 2]", 0, {"expected a JSON object", "array"}));
}

TEST_F(SafetensorsTest, RejectsEntryThatIsNotAnObject) {
  EXPECT_TRUE(RejectsHeader(R"({"w": 3})", 0, {"tensor \"w\"", "expected an object"}));
}

TEST_F(SafetensorsTest, RejectsEntryMissingAField) {
  EXPECT_TRUE(
      RejectsHeader(R"({"w": {"shape": [1], "data_offsets": [0, 1]}})", 1, {"tensor \"w\"", "\"dtype\""}));
  EXPECT_TRUE(
      RejectsHeader(R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})", 1, {"tensor \"w\"", "\"shape\""}));
  EXPECT_TRUE(
      RejectsHeader(R"({"w": {"dtype": "U8", "shape": [1]}})", 1, {"tensor \"w\"", "\"data_offsets\""}));
}

TEST_F(SafetensorsTest, RejectsFieldsOfWrongJsonType) {
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 1]}})", 1,
                            {"tensor \"w\"", "\"dtype\" must be a string"}));
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": "1", "data_offsets": [0, 1]}})", 1,
                            {"tensor \"w\"", "\"shape\" must be an array of integers"}));
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]}})", 1,
                            {"tensor \"w\"", "\"shape\" must be an array of integers"}));
  EXPECT_TRUE(
      RejectsHeader(R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 1]}})", 1,
                    {"tensor \"w\"", "\"shape\" must be an array of integers"}));
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": "0-1"}})", 1,
                            {"tensor \"w\"", "\"data_offsets\" must be [begin, end]"}));
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}})", 2,
                            {"tensor \"w\"", "\"data_offsets\" must be [begin, end]"}));
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1]}})", 1,
                            {"tensor \"w\"", "\"data_offsets\" must be [begin, end]"}));
}

TEST_F(SafetensorsTest, RejectsUnknownDtypeListingKnownOnes) {
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}})", 1,
                            {"tensor \"w\"", "unknown dtype \"Q4\"", "BF16", "F8_E4M3", "I64"}));
}

TEST_F(SafetensorsTest, RejectsNegativeDimension) {
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [-1, 2], "data_offsets": [0, 0]}})", 0,
                            {"tensor \"w\"", "negative dimension in shape [-1, 2]"}));
}

TEST_F(SafetensorsTest, RejectsShapeWhoseSizeOverflows) {
  EXPECT_TRUE(
      RejectsHeader(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904, 0],)"
                    R"( "data_offsets": [0, 0]}})",
                    0, {"tensor \"w\"", "shape [4611686018427387904, 4611686018427387904, 0]", "64 bits"}));
  EXPECT_TRUE(
      RejectsHeader(R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0,
                    {"tensor \"w\"", "64 bits"}));
}

TEST_F(SafetensorsTest, RejectsNegativeOrReversedOffsets) {
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", 1,
                            {"tensor \"w\"", "\"data_offsets\"", "[-1,0]"}));
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}})", 2,
                            {"tensor \"w\"", "\"data_offsets\"", "[2,1]"}));
}

TEST_F(SafetensorsTest, RejectsOffsetsPastThePayload) {
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})", 5,
                            {"tensor \"w\"", "data_offsets [2, 6]", "payload of 5 bytes"}));
}

TEST_F(SafetensorsTest, RejectsOffsetsThatDisagreeWithShapeAndDtype) {
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 6]}})", 6,
                            {"tensor \"w\"", "hold 6 bytes", "shape [2, 3] of BF16 needs 12"}));
}

TEST_F(SafetensorsTest, RejectsOverlappingTensorsNamingBoth) {
  EXPECT_TRUE(RejectsHeader(R"({"first": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},)"
                            R"( "second": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]},)"
                            R"( "third": {"dtype": "U8", "shape": [2], "data_offsets": [8, 10]}})",
                            10, {"\"first\" [0, 8)", "\"second\" [6, 8)", "overlap"}));
}

TEST_F(SafetensorsTest, RejectsRepeatedKeys) {
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
                            R"( "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                            2, {"key \"w\" appears twice"}));
  EXPECT_TRUE(RejectsHeader(R"({"w": {"dtype": "U8", "dtype": "F32", "shape": [1], "data_offsets": [0, 1]}})",
                            1, {"key \"dtype\" appears twice"}));
}

TEST_F(SafetensorsTest, RejectsMalformedMetadata) {
  EXPECT_TRUE(
      RejectsHeader(R"({"__metadata__": ["a"]})", 0, {"\"__metadata__\" must be an object of strings"}));
  EXPECT_TRUE(RejectsHeader(R"({"__metadata__": {"format": "pt", "layers": 32}})", 0,
                            {"\"__metadata__\" entry \"layers\" must be a string"}));
}

TEST_F(SafetensorsTest, OpenReportsAMissingFile) {
  const std::string path = (dir_.path() / "absent.safetensors").string();
  EXPECT_TRUE(ThrowsErrorMentioning([&] { SafetensorsFile file(path); }, {path, "cannot open"}));
}

TEST_F(SafetensorsTest, WriterRejectsBytesThatDisagreeWithShape) {
  const std::string path = (dir_.path() / "w.safetensors").string();
  const std::vector<TensorData> tensors = {{"t", DType::F32, {2, 2}, counting_bytes(12, 0)}};
  EXPECT_TRUE(ThrowsErrorMentioning([&] { write_safetensors(path, tensors); },
                                    {path, "tensor \"t\"", "has 12 bytes", "shape [2, 2] of F32 needs 16"}));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST_F(SafetensorsTest, WriterRejectsNegativeAndOverflowingShapes) {
  const std::string path = (dir_.path() / "w.safetensors").string();
  const std::vector<TensorData> negative = {{"t", DType::U8, {-2}, {}}};
  EXPECT_TRUE(ThrowsErrorMentioning([&] { write_safetensors(path, negative); },
                                    {path, "tensor \"t\"", "negative dimension in shape [-2]"}));
  const std::vector<TensorData> huge = {{"t", DType::U8, {int64_t{1} << 40, int64_t{1} << 40}, {}}};
  EXPECT_TRUE(
      ThrowsErrorMentioning([&] { write_safetensors(path, huge); }, {path, "tensor \"t\"", "too large"}));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, WriterRejectsRepeatedAndReservedNames) {
  const std::string path = (dir_.path() / "w.safetensors").string();
  const std::vector<TensorData> repeated = {{"t", DType::U8, {1}, {1}}, {"t", DType::U8, {1}, {2}}};
  EXPECT_TRUE(
      ThrowsErrorMentioning([&] { write_safetensors(path, repeated); }, {path, "tensor \"t\"", "twice"}));
  const std::vector<TensorData> reserved = {{"__metadata__", DType::U8, {1}, {1}}};
  EXPECT_TRUE(
      ThrowsErrorMentioning([&] { write_safetensors(path, reserved); }, {path, "__metadata__", "reserved"}));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, WriterReportsAnUncreatablePath) {
  const std::string path = (dir_.path() / "no-such-dir" / "w.safetensors").string();
  const std::vector<TensorData> tensors = {{"t", DType::U8, {1}, {1}}};
  EXPECT_TRUE(ThrowsErrorMentioning([&] { write_safetensors(path, tensors); }, {path, "cannot create"}));
}

TEST_F(SafetensorsTest, WriterLeavesNoTemporaryFileWhenTheRenameFails) {
  const fs::path occupied = dir_.path() / "occupied";  // a non-empty directory cannot be replaced by a file
  fs::create_directories(occupied / "inside");
  const std::vector<TensorData> tensors = {{"t", DType::U8, {1}, {1}}};
  EXPECT_TRUE(ThrowsErrorMentioning([&] { write_safetensors(occupied.string(), tensors); },
                                    {occupied.string(), "rename"}));
  EXPECT_FALSE(fs::exists(occupied.string() + ".tmp"));
  EXPECT_TRUE(fs::is_directory(occupied / "inside"));
}

// --- checkpoint directories ---

class CheckpointDirTest : public SafetensorsTest {
 protected:
  void WriteShard(const std::string& name, const std::vector<std::string>& tensor_names) {
    std::vector<TensorData> tensors;
    for (size_t i = 0; i < tensor_names.size(); ++i)
      tensors.push_back({tensor_names[i], DType::U8, {2}, counting_bytes(2, static_cast<uint8_t>(10 * i))});
    write_safetensors((dir_.path() / name).string(), tensors);
  }

  void WriteIndex(std::string_view weight_map_json) {
    write_text(dir_.path() / "model.safetensors.index.json",
               std::string(R"({"metadata": {"total_size": 8}, "weight_map": )") +
                   std::string(weight_map_json) + "}");
  }

  std::string index_path() const { return (dir_.path() / "model.safetensors.index.json").string(); }

  ::testing::AssertionResult OpenFails(std::initializer_list<std::string_view> parts) {
    return ThrowsErrorMentioning([&] { TensorStore::open_dir(dir_.str()); }, parts);
  }
};

TEST_F(CheckpointDirTest, ShardedRoundTrip) {
  WriteShard("model-00001-of-00002.safetensors", {"z.weight", "a.weight"});
  WriteShard("model-00002-of-00002.safetensors", {"m.weight"});
  WriteIndex(
      R"({"a.weight": "model-00001-of-00002.safetensors", "z.weight": "model-00001-of-00002.safetensors",
                 "m.weight": "model-00002-of-00002.safetensors"})");
  TensorStore store = TensorStore::open_dir(dir_.str());
  EXPECT_EQ(store.source(), dir_.str());
  ASSERT_EQ(store.all().size(), 3u);
  EXPECT_EQ(store.all()[0]->name, "a.weight");
  EXPECT_EQ(store.all()[1]->name, "m.weight");
  EXPECT_EQ(store.all()[2]->name, "z.weight");
  EXPECT_EQ(*store.get("m.weight").file, (dir_.path() / "model-00002-of-00002.safetensors").string());
  EXPECT_EQ(*store.get("a.weight").file, (dir_.path() / "model-00001-of-00002.safetensors").string());
  EXPECT_EQ(bytes_of(store.get("a.weight")), (std::vector<uint8_t>{10, 11}));
  EXPECT_EQ(store.find("absent"), nullptr);
  EXPECT_TRUE(ThrowsErrorMentioning([&] { store.get("absent"); }, {"missing tensor absent in", dir_.str()}));
}

TEST_F(CheckpointDirTest, OpensSingleFileWhenThereIsNoIndex) {
  WriteShard("model.safetensors", {"b", "a"});
  TensorStore store = TensorStore::open_dir(dir_.str());
  EXPECT_EQ(store.source(), dir_.str());
  ASSERT_EQ(store.all().size(), 2u);
  EXPECT_EQ(store.all()[0]->name, "a");
  EXPECT_EQ(bytes_of(store.get("b")), (std::vector<uint8_t>{0, 1}));
}

TEST_F(CheckpointDirTest, RejectsDirectoryWithoutCheckpoint) {
  EXPECT_TRUE(OpenFails({"no model.safetensors or model.safetensors.index.json in", dir_.str()}));
  const std::string absent = (dir_.path() / "absent").string();
  EXPECT_TRUE(
      ThrowsErrorMentioning([&] { TensorStore::open_dir(absent); }, {"no model.safetensors", absent}));
}

TEST_F(CheckpointDirTest, RejectsMalformedIndex) {
  write_text(dir_.path() / "model.safetensors.index.json", "{\"weight_map\": ");
  EXPECT_TRUE(OpenFails({index_path(), "not well-formed JSON"}));
  write_text(dir_.path() / "model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_TRUE(OpenFails({index_path(), "\"weight_map\""}));
  write_text(dir_.path() / "model.safetensors.index.json", R"({"weight_map": ["a", "s.safetensors"]})");
  EXPECT_TRUE(OpenFails({index_path(), "\"weight_map\": an object"}));
  WriteIndex(R"({"a": 3})");
  EXPECT_TRUE(OpenFails({index_path(), "weight_map entry \"a\" must be a shard file name"}));
  WriteIndex(R"({"a": "../model.safetensors"})");
  EXPECT_TRUE(OpenFails({index_path(), "\"a\"", "\"../model.safetensors\"", "expected a file name"}));
  WriteIndex(R"({"a": "s.safetensors", "a": "t.safetensors"})");
  EXPECT_TRUE(OpenFails({index_path(), "key \"a\" appears twice"}));
}

TEST_F(CheckpointDirTest, RejectsIndexedTensorAbsentFromItsShard) {
  WriteShard("s1.safetensors", {"a"});
  WriteShard("s2.safetensors", {"b"});
  WriteIndex(R"({"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"})");
  EXPECT_TRUE(OpenFails({index_path(), "tensor \"b\"", "s1.safetensors"}));
}

TEST_F(CheckpointDirTest, RejectsTensorInTwoShards) {
  WriteShard("s1.safetensors", {"a", "b"});
  WriteShard("s2.safetensors", {"b"});
  WriteIndex(R"({"a": "s1.safetensors", "b": "s2.safetensors"})");
  EXPECT_TRUE(OpenFails({"tensor \"b\" is in both", "s1.safetensors", "s2.safetensors"}));
}

TEST_F(CheckpointDirTest, RejectsMissingShard) {
  WriteShard("s1.safetensors", {"a"});
  WriteIndex(R"({"a": "s1.safetensors", "b": "gone.safetensors"})");
  EXPECT_TRUE(OpenFails({index_path(), "shard file", "gone.safetensors is missing"}));
}

TEST_F(CheckpointDirTest, RejectsShardTensorMissingFromIndex) {
  WriteShard("s1.safetensors", {"a", "stray"});
  WriteIndex(R"({"a": "s1.safetensors"})");
  EXPECT_TRUE(OpenFails({index_path(), "tensor \"stray\"", "s1.safetensors", "missing from the weight_map"}));
}

TEST_F(CheckpointDirTest, ReportsAMalformedShardByItsName) {
  write_file(dir_.path() / "s1.safetensors", raw_safetensors(R"({"a": {"dtype": "U8", "shape": [1]}})"));
  WriteIndex(R"({"a": "s1.safetensors"})");
  EXPECT_TRUE(OpenFails({(dir_.path() / "s1.safetensors").string(), "tensor \"a\"", "\"data_offsets\""}));
}

}  // namespace
}  // namespace qspec
