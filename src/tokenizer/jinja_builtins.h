// jinja2's built-in filters and tests (plus HF's tojson), Python's str/dict/list methods, and the globals
// HF provides (range, dict, namespace, raise_exception, strftime_now).
#pragma once

#include <string_view>

#include "tokenizer/jinja_value.h"

namespace qspec::jinja {

bool has_filter(std::string_view name);
bool has_test(std::string_view name);

// `input|name(args)`; throws ValueError for bad arguments or unknown names.
Value apply_filter(std::string_view name, const Value& input, CallArguments& args);
// `input is name(args)`.
bool apply_test(std::string_view name, const Value& input, CallArguments& args);

// `object.name` as jinja2's sandboxed getattr does it: methods of str/dict/list, dict keys, namespace
// attributes; Undefined (carrying jinja2's message) where nothing matches.
Value get_attribute(const Value& object, std::string_view name);
// `object[key]` (item first, then attribute as jinja2 does).
Value get_item(const Value& object, const Value& key);
// `object[start:stop:step]`; absent bounds are None.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The globals every template sees: range, dict, namespace, raise_exception, strftime_now (local time).
const Value* find_global(std::string_view name);

}  // namespace qspec::jinja
