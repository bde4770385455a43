// Developer settings read from the environment (QSPEC_THREADS, QSPEC_PDL_MAX_BLOCKS, ...): unset or empty
// means "not set"; anything else must be a number within the stated range, or the read fails naming the
// variable and what it expected (a typo must not silently read as 0).
#pragma once

#include <cstdint>
#include <optional>

namespace qspec {

std::optional<int64_t> env_integer(const char* name, int64_t lowest, int64_t highest);
std::optional<double> env_number(const char* name, double lowest, double highest);

}  // namespace qspec
