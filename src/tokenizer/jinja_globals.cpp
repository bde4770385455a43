// The global functions HF's template environment provides: range (with the sandbox's size limit), dict,
// namespace, raise_exception and strftime_now.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "tokenizer/jinja_builtins.h"

namespace qspec::jinja {

namespace {

// jinja2's sandbox refuses larger ranges (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

Value range(CallArguments& args) {
  if (!args.keyword.empty()) throw ValueError("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3)
    throw ValueError(fmt::format("range expected 1 to 3 arguments, got {}", p.size()));
  int64_t start = p.size() == 1 ? 0 : p[0].to_integer();
  int64_t stop = p.size() == 1 ? p[0].to_integer() : p[1].to_integer();
  int64_t step = p.size() == 3 ? p[2].to_integer() : 1;
  if (step == 0) throw ValueError("range() arg 3 must not be zero");
  // Count in double so that extreme bounds cannot overflow.
  double count = std::max(
      0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step)));
  if (count > static_cast<double>(kMaxRange)) {
    throw ValueError(
        fmt::format("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange));
  }
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.emplace_back(i);
  return Value::list(std::move(items));
}

// The key/value pairs of dict(*args, **kwargs).
std::vector<std::pair<Value, Value>> mapping_arguments(const CallArguments& args, std::string_view callee) {
  if (args.positional.size() > 1) {
    throw ValueError(
        fmt::format("{} expected at most 1 positional argument, got {}", callee, args.positional.size()));
  }
  std::vector<std::pair<Value, Value>> entries;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      entries = source.as_dict().entries;
    } else {
      for (const Value& pair : iterate(source)) {
        std::vector<Value> parts = iterate(pair);
        if (parts.size() != 2)
          throw ValueError(
              fmt::format("{} sequence element has length {}; 2 is required", callee, parts.size()));
        entries.emplace_back(parts[0], parts[1]);
      }
    }
  }
  for (const auto& [name, value] : args.keyword) entries.emplace_back(Value(name), value);
  return entries;
}

Value make_namespace(CallArguments& args) {
  auto ns = std::make_shared<Namespace>();
  for (auto& [key, value] : mapping_arguments(args, "namespace()")) {
    if (!key.is_string())
      throw ValueError(fmt::format("namespace() keys must be strings, not {}", key.type_name()));
    if (value.holds_reference())
      throw ValueError("a namespace attribute cannot hold a namespace or a function");
    ns->set(key.as_string(), std::move(value));
  }
  return Value(std::move(ns));
}

Value strftime_now(CallArguments& args) {
  auto bound = bind_arguments(args, "strftime_now", {"format"});
  if (!bound[0] || !bound[0]->is_string()) throw ValueError("strftime_now() needs a format string");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buffer[512];
  size_t written = std::strftime(buffer, sizeof(buffer), bound[0]->as_string().c_str(), &local);
  return Value(std::string(buffer, written));
}

}  // namespace

const Value* find_global(std::string_view name) {
  static const std::map<std::string_view, Value> globals = {
      {"range", make_function("range", range)},
      {"dict",
       make_function("dict",
                     [](CallArguments& args) { return Value::dict(mapping_arguments(args, "dict()")); })},
      {"namespace", make_function("namespace", make_namespace)},
      {"raise_exception", make_function("raise_exception",
                                        [](CallArguments& args) -> Value {
                                          auto bound = bind_arguments(args, "raise_exception", {"message"});
                                          throw ValueError(bound[0] ? bound[0]->str() : "");
                                        })},
      {"strftime_now", make_function("strftime_now", strftime_now)},
  };
  auto found = globals.find(name);
  return found == globals.end() ? nullptr : &found->second;
}

}  // namespace qspec::jinja
