// Translates a tokenizer.json regex, written for HF tokenizers' Oniguruma, into the PCRE2 pattern that
// matches the same text.
#pragma once

#include <string>

namespace qspec {

// The pattern for pcre2_compile with PCRE2_UTF | PCRE2_UCP. Two things differ between the engines:
// - \s is Unicode White_Space in Oniguruma; PCRE2's \s also matches U+180E. It becomes \p{White_Space}.
// - Oniguruma's Unicode tables (16.0) are newer than PCRE2 10.42's (14.0): \p{L}, \p{M} and \p{N} get the
// code
//   points assigned since, as found by tools/oracle/tokenizer_regex_table.py.
std::string onig_to_pcre2(const std::string& pattern);

}  // namespace qspec
