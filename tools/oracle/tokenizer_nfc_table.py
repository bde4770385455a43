"""Prints the combining marks that HF tokenizers' NFC treats as starters (canonical combining class 0), as the
code-point ranges of src/tokenizer/nfc.cpp.

HF normalizes with older Unicode tables than utf8proc (2.8: Unicode 15.0), so it does not know the combining class
of marks assigned since: it never reorders marks across them. A mark M counts when utf8proc gives it a class
0 < c < 240 and HF leaves U+0345 (class 240) + M unchanged, where a correct NFC puts M first. It also checks that
every code point utf8proc's NFC changes on its own is changed the same way by HF (no decomposition differs).

Run: /work/tok-venv/bin/python tools/oracle/tokenizer_nfc_table.py   (needs tokenizers; libutf8proc.so.2)
"""

import ctypes
import ctypes.util

from tokenizers import normalizers

from code_point_ranges import cpp_ranges

utf8proc = ctypes.CDLL(ctypes.util.find_library("utf8proc") or "libutf8proc.so.2")
utf8proc.utf8proc_get_property.restype = ctypes.POINTER(ctypes.c_int16)  # {category, combining_class, ...}
utf8proc.utf8proc_NFC.restype = ctypes.c_void_p
utf8proc.utf8proc_NFC.argtypes = [ctypes.c_char_p]
utf8proc.utf8proc_unicode_version.restype = ctypes.c_char_p
libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]


def utf8proc_nfc(text):
    pointer = utf8proc.utf8proc_NFC(text.encode())
    result = ctypes.string_at(pointer).decode()
    libc.free(pointer)
    return result


def main():
    hf = normalizers.NFC()
    starters_in_hf = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ccc = utf8proc.utf8proc_get_property(cp)[1]
        if 0 < ccc < 240 and hf.normalize_str("\u0345" + chr(cp)) == "\u0345" + chr(cp):
            starters_in_hf.append(cp)
        if cp and utf8proc_nfc(chr(cp)) != chr(cp) and hf.normalize_str(chr(cp)) != utf8proc_nfc(chr(cp)):
            raise SystemExit(f"HF and utf8proc differ on U+{cp:04X} alone: the table does not cover this")
    print(f"// utf8proc {utf8proc.utf8proc_unicode_version().decode()}: {len(starters_in_hf)} marks")
    print(cpp_ranges(starters_in_hf))


if __name__ == "__main__":
    main()
