// The values a Jinja template computes with, modelled on the Python objects jinja2 uses: Undefined, None,
// bool, int, float, str, list/tuple, dict (insertion-ordered), namespace and callables; plus Python's
// truthiness, str(), repr(), ==, ordering and len()/iteration rules for them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace qspec::jinja {

// An error of a value operation (Python's TypeError, UndefinedError, ...). The interpreter turns it into a
// qspec::Error naming the template location and construct.
class ValueError : public std::runtime_error {
 public:
  explicit ValueError(const std::string& message) : std::runtime_error(message) {}
};

class Value;
struct List;
struct Dict;
struct Namespace;
struct Function;

// Containers deeper than this are refused so that recursive printing/comparison cannot exhaust the stack.
inline constexpr int kMaxValueDepth = 256;

struct Undefined {
  // What went missing, as jinja2 says it ("'x' is undefined", "'dict object' has no attribute 'y'").
  std::string reason;
};

struct None {};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };

  Value() : data_(Undefined{}) {}
  Value(Undefined undefined) : data_(std::move(undefined)) {}
  Value(None) : data_(None{}) {}
  Value(bool b) : data_(b) {}
  Value(int64_t i) : data_(i) {}
  Value(int i) : data_(int64_t{i}) {}
  Value(double d) : data_(d) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(std::string_view s) : data_(std::string(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(std::shared_ptr<const List> list) : data_(std::move(list)) {}
  Value(std::shared_ptr<const Dict> dict) : data_(std::move(dict)) {}
  Value(std::shared_ptr<Namespace> ns) : data_(std::move(ns)) {}
  Value(std::shared_ptr<const Function> function) : data_(std::move(function)) {}

  static Value undefined(std::string reason) { return Value(Undefined{std::move(reason)}); }
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  static Value dict(std::vector<std::pair<Value, Value>> entries);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // Python's numbers.Number: bool, int and float.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_function() const { return kind() == Kind::kFunction; }

  const std::string& undefined_reason() const { return std::get<Undefined>(data_).reason; }
  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(data_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<const Function>>(data_); }
  // bool and int as a Python int; throws when not integral.
  int64_t to_integer() const;
  // Any Python number as a float; throws when not a number.
  double to_double() const;

  // Python truthiness.
  bool truthy() const;
  // Python str(); Undefined prints as "".
  std::string str() const;
  // Python repr().
  std::string repr() const;
  // Python type name, for error messages ("int", "str", "dict", "NoneType", ...).
  std::string type_name() const;
  // Nesting depth of containers (0 for scalars).
  int depth() const;
  // Whether this is or contains a namespace or a function (which may capture one). Namespace attributes may
  // not hold such values, which keeps every value acyclic.
  bool holds_reference() const;

  // Throws the Undefined's reason when this is undefined (the operations jinja2's Undefined refuses).
  const Value& require_defined() const;

 private:
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<const List>,
               std::shared_ptr<const Dict>, std::shared_ptr<Namespace>, std::shared_ptr<const Function>>
      data_;
};

struct List {
  std::vector<Value> items;
  bool is_tuple = false;
  int depth = 1;
  bool holds_reference = false;
};

struct Dict {
  std::vector<std::pair<Value, Value>> entries;
  int depth = 1;
  bool holds_reference = false;
  // Where each string key is in `entries`, so that large JSON objects are built and read in linear time.
  std::unordered_map<std::string, size_t> string_keys;
  const Value* find(const Value& key) const;
};

struct Namespace {
  std::vector<std::pair<std::string, Value>> attributes;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value value);
};

struct CallArguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(CallArguments&)> call;
};

Value make_function(std::string name, std::function<Value(CallArguments&)> call);

// Whether Python could hash the value (lists and dicts cannot be dict keys); throws the TypeError when not.
void require_hashable(const Value& value);
// Python ==.
bool equals(const Value& a, const Value& b);
// Python ordering (<0, 0, >0); throws for types Python cannot order.
int compare(const Value& a, const Value& b, std::string_view op);
// len(); throws for values without a length.
size_t length(const Value& value);
// The items a for-loop visits: list items, dict keys, string characters; Undefined gives none.
std::vector<Value> iterate(const Value& value);
// Python `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);
// Python repr() of a string.
std::string repr_string(std::string_view text);
// Python repr() of a float ("1.0", "1e+16", "0.30000000000000004").
std::string repr_float(double value);

// Binds call arguments to parameter names like a Python signature with defaults: result[i] is nullopt where
// parameter i was not given. Throws on unknown keywords or too many positional arguments.
std::vector<std::optional<Value>> bind_arguments(const CallArguments& args, std::string_view callee,
                                                 const std::vector<std::string_view>& parameters);

}  // namespace qspec::jinja
