// An inclusive range of Unicode code points: the entries of the tokenizer's tables of code points (made by
// tools/oracle/tokenizer_nfc_table.py and tokenizer_regex_table.py through code_point_ranges.py).
#pragma once

#include <cstdint>

namespace qspec {

struct CodePointRange {
  uint32_t first, last;
};

}  // namespace qspec
