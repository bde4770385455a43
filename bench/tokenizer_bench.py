"""Tokenizer speed, qspec next to HF tokenizers in the same run (single thread, same machine, same texts).

Texts: the ~1 MB oracle text (tests/fixtures/tokenizer: corpus texts cycled, as OneMegabyteTextEqualsHf builds it)
and a prompt of at least 8,192 tokens (the first HF tokens of it, decoded). For each: the first encode after loading
(cold BPE cache) and the best of N (warm cache); qspec's ids are checked to equal HF's.
Writes bench/results/tokenizer_<UTC time>.json with machine info and the commit.

Run: /work/tok-venv/bin/python bench/tokenizer_bench.py --qspec build/qspec [--repeats 20]
     (where the tree has no .git, set QSPEC_COMMIT to the commit the binary was built at)
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "qwen3.5-tokenizer"
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"


def large_text():
    texts = []
    for line in (FIXTURES / "corpus.jsonl").read_text(encoding="utf-8").split("\n")[:-1]:  # not splitlines: U+2028 is text
        case = json.loads(line)
        if "special_tokens_as_text" not in case and "ignore_merges" not in case:
            texts.append(case["text"])
    pieces, size = [], 0
    while size < 1_000_000:
        for text in texts:
            pieces.append(text + "\n")
            size += len(text.encode()) + 1
            if size >= 1_000_000:
                break
    return "".join(pieces)


def time_hf(text, repeats):
    start = time.perf_counter()
    hf = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    load = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ids = hf.encode(text, add_special_tokens=False).ids
        times.append(time.perf_counter() - start)
    mb = len(text.encode()) / 1e6
    return ids, {"load_s": load, "bytes": len(text.encode()), "tokens": len(ids), "repeats": repeats,
                 "first_s": times[0], "best_s": min(times), "mb_per_s_first": mb / times[0],
                 "mb_per_s_best": mb / min(times)}


def time_qspec(qspec, text, repeats):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        run = lambda *extra: subprocess.run([qspec, "tokenize", "--model", str(MODEL), "--file", f.name, *extra],
                                            check=True, capture_output=True, text=True).stdout
        ids = [int(i) for i in run().strip().split(",")] if text else []
        return ids, json.loads(run("--bench", str(repeats)))
    finally:
        os.unlink(f.name)


def machine():
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
            "os": platform.platform(), "python": platform.python_version()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--qspec", required=True, help="path of the qspec binary (a Release build)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"  # HF encodes one text on one thread anyway; keep it certain

    big = large_text()
    hf = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    big_ids = hf.encode(big, add_special_tokens=False).ids
    # Decoding then encoding is not exact (NFD text comes back NFC), so grow the cut until it is 8,192 tokens.
    cut = 8192
    while len(hf.encode(prompt := hf.decode(big_ids[:cut]), add_special_tokens=False).ids) < 8192:
        cut += 8

    results = {}
    for name, text in (("1mb_corpus_text", big), ("prompt_8192_tokens", prompt)):
        hf_ids, hf_timing = time_hf(text, args.repeats)
        qspec_ids, qspec_timing = time_qspec(args.qspec, text, args.repeats)
        results[name] = {"hf_tokenizers": hf_timing, "qspec": qspec_timing, "ids_equal": hf_ids == qspec_ids,
                         "speedup_best": hf_timing["best_s"] / qspec_timing["best_s"],
                         "speedup_first": hf_timing["first_s"] / qspec_timing["first_s"]}

    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    # The GPU machine gets a copy of the tree without .git: the caller names the commit there.
    commit = git.stdout.strip() if git.returncode == 0 else os.environ.get("QSPEC_COMMIT", "unknown")
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {"benchmark": "tokenizer encode, single thread", "time_utc": now.isoformat(timespec="seconds"),
              "commit": commit, "machine": machine(), "hf_tokenizers_version": tokenizers.__version__,
              "results": results}
    out = ROOT / "bench" / "results" / f"tokenizer_{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    for name, r in results.items():
        print(f"{name}: qspec best {r['qspec']['best_s'] * 1e3:.2f} ms ({r['qspec']['mb_per_s_best']:.1f} MB/s), "
              f"first {r['qspec']['first_s'] * 1e3:.2f} ms | HF best {r['hf_tokenizers']['best_s'] * 1e3:.2f} ms "
              f"({r['hf_tokenizers']['mb_per_s_best']:.1f} MB/s), first {r['hf_tokenizers']['first_s'] * 1e3:.2f} ms"
              f" | ids equal: {r['ids_equal']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
