#include "core/dtype.h"

#include <array>
#include <utility>

namespace qspec {

namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};

constexpr std::array kDTypes = {
    DTypeInfo{DType::BOOL, "BOOL", 1},       DTypeInfo{DType::U8, "U8", 1},
    DTypeInfo{DType::I8, "I8", 1},           DTypeInfo{DType::I16, "I16", 2},
    DTypeInfo{DType::U16, "U16", 2},         DTypeInfo{DType::I32, "I32", 4},
    DTypeInfo{DType::U32, "U32", 4},         DTypeInfo{DType::I64, "I64", 8},
    DTypeInfo{DType::U64, "U64", 8},         DTypeInfo{DType::F8_E4M3, "F8_E4M3", 1},
    DTypeInfo{DType::F8_E5M2, "F8_E5M2", 1}, DTypeInfo{DType::F16, "F16", 2},
    DTypeInfo{DType::BF16, "BF16", 2},       DTypeInfo{DType::F32, "F32", 4},
    DTypeInfo{DType::F64, "F64", 8},
};

const DTypeInfo& info(DType t) {
  return kDTypes[static_cast<size_t>(t)];
}

}  // namespace

size_t dtype_size(DType t) {
  return info(t).size;
}

std::string_view dtype_name(DType t) {
  return info(t).name;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

}  // namespace qspec
