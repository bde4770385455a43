// Element types that appear in checkpoints (safetensors names) and in backend tensors.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace qspec {

enum class DType { BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F8_E4M3, F8_E5M2, F16, BF16, F32, F64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace qspec
