"""Prints the code points that HF tokenizers' regex engine (Oniguruma) counts in \\p{L}, \\p{M} or \\p{N} but PCRE2
10.42 (Unicode 14.0) does not: letters, marks and digits of later Unicode versions. src/tokenizer/split_regex.cpp
adds them to those classes so that the split matches HF's.

HF's class of each code point is probed through its pre-tokenizer with the Qwen3.5 split regex: "a" + X is one
piece exactly when X is a letter or mark, and X + X is two pieces exactly when X is a number. Which of letter or
mark a letter-like X is comes from unicodedata2 (newer Unicode); PCRE2's view is Python 3.11's unicodedata (14.0).

Run: /work/tok-venv/bin/python tools/oracle/tokenizer_regex_table.py   (needs tokenizers, unicodedata2)
"""

import unicodedata
from pathlib import Path

import unicodedata2
from tokenizers import Tokenizer

from code_point_ranges import cpp_ranges

ROOT = Path(__file__).resolve().parents[2]
PLANES = list(range(0, 0x40000)) + list(range(0xE0000, 0xE1000))


def main():
    assert unicodedata.unidata_version == "14.0.0", "PCRE2 10.42's Unicode version is 14.0"
    pre = Tokenizer.from_file(str(ROOT / "models" / "qwen3.5-tokenizer" / "tokenizer.json")).pre_tokenizer
    extra = {"L": [], "M": [], "N": []}
    for cp in PLANES:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        x = chr(cp)
        old = unicodedata.category(x)[0]
        letter_like = len(pre.pre_tokenize_str("a" + x)) == 1
        number = not letter_like and len(pre.pre_tokenize_str(x + x)) == 2 and not x.isspace()
        if letter_like and old not in "LM":
            new = unicodedata2.category(x)[0]
            if new not in "LM":
                raise SystemExit(f"U+{cp:04X}: HF treats it as a letter or mark, unicodedata2 says {new}")
            extra[new].append(cp)
        elif number and old != "N":
            extra["N"].append(cp)
        elif (old in "LM" and not letter_like) or (old == "N" and not number):
            raise SystemExit(f"U+{cp:04X}: PCRE2 has it in \\p{{{old}}} and HF does not: not handled")
    for name, cps in extra.items():
        print(f"// \\p{{{name}}}: {len(cps)} code points")
        print(cpp_ranges(cps))


if __name__ == "__main__":
    main()
