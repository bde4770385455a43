// Developer settings read from the environment (QSPEC_THREADS, QSPEC_PDL_MAX_BLOCKS, ...): unset or empty
// means "not set"; anything else must be a number within the stated range (or one of the stated words), or
// the read fails naming the variable and what it expected (a typo must not silently read as 0 or as the
// default).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace qspec {

std::optional<int64_t> env_integer(const char* name, int64_t lowest, int64_t highest);
std::optional<double> env_number(const char* name, double lowest, double highest);
// One of `choices`, spelled exactly.
std::optional<std::string> env_choice(const char* name, std::initializer_list<std::string_view> choices);

}  // namespace qspec
