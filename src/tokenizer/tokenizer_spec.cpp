#include "tokenizer/tokenizer_spec.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace qspec {
namespace {

using nlohmann::json;

// Added token ids beyond the vocabulary are bounded so that a lying file cannot make the id tables huge.
constexpr int64_t kMaxTokenId = (1 << 24) - 1;

json read_json(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("{}: cannot open ({})", path.string(), std::strerror(errno));
  std::stringstream text;
  text << file.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

// Field access that names the file and the field path in every error.
class Fields {
 public:
  explicit Fields(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void bad(std::string_view field, std::string_view expected) const {
    fail("{}: {}: expected {}", file_, field, expected);
  }
  const json& object(const json& value, std::string_view field) const {
    if (!value.is_object()) bad(field, "an object");
    return value;
  }
  const json& member(const json& object_value, std::string_view key, std::string_view field) const {
    const auto found = object_value.find(key);
    if (found == object_value.end()) fail("{}: {}: missing", file_, field);
    return *found;
  }
  // The member, or null when it is absent.
  const json& optional_member(const json& object_value, std::string_view key) const {
    static const json null_value;
    const auto found = object_value.find(key);
    return found == object_value.end() ? null_value : *found;
  }
  std::string string(const json& value, std::string_view field) const {
    if (!value.is_string()) bad(field, "a string");
    return value.get<std::string>();
  }
  bool boolean(const json& value, std::string_view field) const {
    if (!value.is_boolean()) bad(field, "true or false");
    return value.get<bool>();
  }
  int64_t integer(const json& value, std::string_view field, int64_t low, int64_t high) const {
    if (!value.is_number_integer() || value.get<int64_t>() < low || value.get<int64_t>() > high) {
      bad(field, fmt::format("an integer in [{}, {}]", low, high));
    }
    return value.get<int64_t>();
  }
  void require_string_equal(const json& object_value, std::string_view key, std::string_view expected,
                            std::string_view field) const {
    const json& value = member(object_value, key, field);
    if (!value.is_string() || value.get<std::string>() != expected) {
      fail("{}: {}: expected \"{}\", got {}", file_, field, expected, value.dump());
    }
  }
  // An optional flag that this tokenizer supports only with one value.
  void require_flag(const json& object_value, std::string_view key, bool supported,
                    std::string_view field) const {
    const json& value = optional_member(object_value, key);
    if (value.is_null()) return;
    if (boolean(value, field) != supported)
      bad(field, fmt::format("{} (the only supported value)", supported));
  }

 private:
  std::string file_;
};

struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using TextToId = std::unordered_map<std::string, TokenId, TextHash, std::equal_to<>>;

void read_model(const Fields& f, const json& model, TokenizerSpec& spec, TextToId& vocab_ids) {
  f.object(model, "model");
  f.require_string_equal(model, "type", "BPE", "model.type");
  if (!f.optional_member(model, "dropout").is_null())
    f.bad("model.dropout", "null (no BPE dropout at inference)");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& value = f.optional_member(model, affix);
    if (!value.is_null() && value != "")
      f.bad(fmt::format("model.{}", affix), "null (byte-level BPE has none)");
  }
  f.require_flag(model, "byte_fallback", false, "model.byte_fallback");
  const json& ignore_merges = f.optional_member(model, "ignore_merges");
  spec.ignore_merges = !ignore_merges.is_null() && f.boolean(ignore_merges, "model.ignore_merges");

  // These loops run over ~250k entries each: field names are only formatted for an error.
  const json& vocab = f.object(f.member(model, "vocab", "model.vocab"), "model.vocab");
  spec.vocab.assign(vocab.size(), std::string());
  vocab_ids.reserve(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [text, id_value] : vocab.items()) {
    const auto field = [&] { return fmt::format("model.vocab[{}]", json(text).dump()); };
    if (!id_value.is_number_integer() || id_value.get<int64_t>() < 0 ||
        id_value.get<int64_t>() >= static_cast<int64_t>(vocab.size())) {
      f.bad(field(), fmt::format("an integer in [0, {}]", vocab.size() - 1));
    }
    const auto id = id_value.get<size_t>();
    if (seen[id]) {
      f.bad(field(),
            fmt::format("a unique id (id {} appears twice; ids must be 0..{})", id, vocab.size() - 1));
    }
    seen[id] = true;
    // A token outside the byte alphabet stands for its own UTF-8 bytes (HF's ByteLevel decoder does the
    // same).
    spec.vocab[id] = byte_level::decode(text).value_or(text);
    vocab_ids.emplace(text, static_cast<TokenId>(id));
  }

  const json& merges = f.member(model, "merges", "model.merges");
  if (!merges.is_array()) f.bad("model.merges", "an array of merges");
  spec.merges.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto field = [&] { return fmt::format("model.merges[{}]", rank); };
    const json& merge = merges[rank];
    std::string_view left, right;
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        f.bad(field(), "\"LEFT RIGHT\" (two tokens separated by one space)");
      }
      left = std::string_view(line).substr(0, space);
      right = std::string_view(line).substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get_ref<const std::string&>();
      right = merge[1].get_ref<const std::string&>();
    } else {
      f.bad(field(), "a pair of tokens: [\"LEFT\", \"RIGHT\"] or \"LEFT RIGHT\"");
    }
    joined.assign(left).append(right);
    const auto resolve = [&](std::string_view text) {
      const auto found = vocab_ids.find(text);
      if (found == vocab_ids.end()) {
        f.bad(field(), fmt::format("tokens of model.vocab, and {} is not one", json(text).dump()));
      }
      return found->second;
    };
    spec.merges.push_back({resolve(left), resolve(right), resolve(joined)});
  }
}

void read_added_tokens(const Fields& f, const json& root, const TextToId& vocab_ids, TokenizerSpec& spec) {
  const json& added = f.optional_member(root, "added_tokens");
  if (added.is_null()) return;
  if (!added.is_array()) f.bad("added_tokens", "an array");
  std::unordered_map<TokenId, size_t> index_of_id;
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string field = fmt::format("added_tokens[{}]", i);
    const json& token = f.object(added[i], field);
    AddedToken entry;
    entry.id =
        static_cast<TokenId>(f.integer(f.member(token, "id", field + ".id"), field + ".id", 0, kMaxTokenId));
    entry.content = f.string(f.member(token, "content", field + ".content"), field + ".content");
    if (entry.content.empty()) f.bad(field + ".content", "a non-empty string");
    const json& special = f.optional_member(token, "special");
    entry.special = !special.is_null() && f.boolean(special, field + ".special");
    for (const char* flag : {"lstrip", "rstrip", "single_word", "normalized"}) {
      f.require_flag(token, flag, false, fmt::format("{}.{}", field, flag));
    }
    if (static_cast<size_t>(entry.id) < spec.vocab.size()) {
      const auto in_vocab = vocab_ids.find(entry.content);
      if (in_vocab == vocab_ids.end() || in_vocab->second != entry.id) {
        f.bad(field + ".id",
              fmt::format("an id above the BPE vocabulary, or the id of the same text in it (id {})",
                          entry.id));
      }
    }
    if (!index_of_id.emplace(entry.id, i).second) {
      f.bad(field + ".id",
            fmt::format("a unique id (added_tokens[{}] also has id {})", index_of_id[entry.id], entry.id));
    }
    spec.added_tokens.push_back(std::move(entry));
  }
}

void read_pipeline(const Fields& f, const json& root, TokenizerSpec& spec) {
  const json& normalizer = f.optional_member(root, "normalizer");
  if (!normalizer.is_null()) {
    f.object(normalizer, "normalizer");
    f.require_string_equal(normalizer, "type", "NFC", "normalizer.type");
    spec.nfc = true;
  }

  const json& pre = f.object(f.member(root, "pre_tokenizer", "pre_tokenizer"), "pre_tokenizer");
  f.require_string_equal(pre, "type", "Sequence", "pre_tokenizer.type");
  const json& steps = f.member(pre, "pretokenizers", "pre_tokenizer.pretokenizers");
  if (!steps.is_array() || steps.size() != 2) {
    f.bad("pre_tokenizer.pretokenizers", "[Split(regex, Isolated), ByteLevel(use_regex=false)]");
  }
  const json& split = f.object(steps[0], "pre_tokenizer.pretokenizers[0]");
  f.require_string_equal(split, "type", "Split", "pre_tokenizer.pretokenizers[0].type");
  f.require_string_equal(split, "behavior", "Isolated", "pre_tokenizer.pretokenizers[0].behavior");
  f.require_flag(split, "invert", false, "pre_tokenizer.pretokenizers[0].invert");
  const json& pattern = f.object(f.member(split, "pattern", "pre_tokenizer.pretokenizers[0].pattern"),
                                 "pre_tokenizer.pretokenizers[0].pattern");
  spec.split_pattern = f.string(f.member(pattern, "Regex", "pre_tokenizer.pretokenizers[0].pattern.Regex"),
                                "pre_tokenizer.pretokenizers[0].pattern.Regex");
  const json& byte_level = f.object(steps[1], "pre_tokenizer.pretokenizers[1]");
  f.require_string_equal(byte_level, "type", "ByteLevel", "pre_tokenizer.pretokenizers[1].type");
  f.require_flag(byte_level, "add_prefix_space", false, "pre_tokenizer.pretokenizers[1].add_prefix_space");
  f.require_flag(byte_level, "use_regex", false, "pre_tokenizer.pretokenizers[1].use_regex");

  const json& decoder = f.object(f.member(root, "decoder", "decoder"), "decoder");
  f.require_string_equal(decoder, "type", "ByteLevel", "decoder.type");
  const json& post = f.optional_member(root, "post_processor");
  if (!post.is_null()) {
    // Anything else (TemplateProcessing...) would add tokens that encode() does not.
    f.require_string_equal(f.object(post, "post_processor"), "type", "ByteLevel", "post_processor.type");
  }
}

std::optional<TokenId> find_token(const TokenizerSpec& spec, const TextToId& vocab_ids,
                                  const std::string& text) {
  for (const AddedToken& token : spec.added_tokens) {
    if (token.content == text) return token.id;
  }
  const auto found = vocab_ids.find(text);
  if (found != vocab_ids.end()) return found->second;
  return std::nullopt;
}

void read_config(const std::filesystem::path& path, const TextToId& vocab_ids, TokenizerSpec& spec) {
  const Fields f(path.string());
  const json root = read_json(path);
  f.object(root, "the top level");
  const auto special_id = [&](const char* key) -> std::optional<TokenId> {
    const json& value = f.optional_member(root, key);
    if (value.is_null()) return std::nullopt;
    const std::string text = value.is_object()
                                 ? f.string(f.member(value, "content", fmt::format("{}.content", key)),
                                            fmt::format("{}.content", key))
                                 : f.string(value, key);
    const auto id = find_token(spec, vocab_ids, text);
    if (!id) f.bad(key, fmt::format("a token of {} (\"{}\" is not one)", spec.tokenizer_json_path, text));
    return id;
  };
  spec.bos_id = special_id("bos_token");
  spec.eos_id = special_id("eos_token");
  spec.pad_id = special_id("pad_token");

  const json& decoder = f.optional_member(root, "added_tokens_decoder");
  if (decoder.is_null()) return;
  for (const auto& [id_text, entry] : f.object(decoder, "added_tokens_decoder").items()) {
    const std::string field = fmt::format("added_tokens_decoder[\"{}\"]", id_text);
    const std::string content =
        f.string(f.member(f.object(entry, field), "content", field + ".content"), field + ".content");
    const auto id = find_token(spec, vocab_ids, content);
    if (!id || std::to_string(*id) != id_text) {
      f.bad(field, fmt::format("the same id as in {} (\"{}\" has id {})", spec.tokenizer_json_path, content,
                               id ? std::to_string(*id) : "none"));
    }
  }
}

}  // namespace

TokenizerSpec read_tokenizer_spec(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  TokenizerSpec spec;
  spec.tokenizer_json_path = (dir / "tokenizer.json").string();
  const Fields f(spec.tokenizer_json_path);
  const json root = read_json(spec.tokenizer_json_path);
  f.object(root, "the top level");
  TextToId vocab_ids;
  read_model(f, f.member(root, "model", "model"), spec, vocab_ids);
  read_added_tokens(f, root, vocab_ids, spec);
  read_pipeline(f, root, spec);
  const std::filesystem::path config = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config)) read_config(config, vocab_ids, spec);
  return spec;
}

}  // namespace qspec
