#!/usr/bin/env python3
"""Server overhead of `qspec serve`: request latency through HTTP minus the in-process `qspec generate` latency
(prefill + decode) for the same tokens, and the time to the first streamed token's bytes minus generate's
prefill time. Medians over --runs; greedy with ignore_eos so that every run makes the same tokens.

  python3 bench/server_bench.py --qspec build/qspec --model DIR [--prompt TEXT] [--max-tokens N] [--runs N]

Writes bench/results/<date>-server-<host>.json (machine, commit, numbers) and prints it."""
import argparse
import datetime
import json
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]


def start_server(qspec, model):
    process = subprocess.Popen([qspec, "serve", "--model", model, "--port", "0", "--quiet"],
                               stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        match = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if match:
            url = match.group(1)
            break
    for line in process.stderr:
        if "ready" in line:
            return process, url
    raise RuntimeError("qspec serve did not start")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--qspec", default=str(ROOT / "build" / "qspec"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    engine = []
    for _ in range(args.runs):
        run = subprocess.run([args.qspec, "generate", "--model", args.model, "--prompt", args.prompt, "--json",
                              "-n", str(args.max_tokens), "--temperature", "0", "--ignore-eos"],
                             check=True, capture_output=True, text=True)
        engine.append(json.loads(run.stdout))
    prefill = statistics.median(r["timings"]["prefill_seconds"] for r in engine)
    generate_total = statistics.median(r["timings"]["prefill_seconds"] + r["timings"]["decode_seconds"] for r in engine)

    process, url = start_server(args.qspec, args.model)
    body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            client.post("/v1/completions", json=body)  # warm-up: connection, first allocation
            latencies, first_token = [], []
            for _ in range(args.runs):
                start = time.perf_counter()
                response = client.post("/v1/completions", json=body).json()
                latencies.append(time.perf_counter() - start)
                assert response["choices"][0]["token_ids"] == engine[0]["tokens"], "server and generate differ"
            for _ in range(args.runs):
                start = time.perf_counter()
                with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
                    for line in stream.iter_lines():
                        if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["token_ids"]:
                            first_token.append(time.perf_counter() - start)
                            break
    finally:
        process.terminate()
        process.wait(30)

    server_total = statistics.median(latencies)
    ttfb = statistics.median(first_token)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    result = {
        "benchmark": "server_overhead",
        "machine": platform.node(), "cpu": cpu, "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "backend": "cpu", "model": args.model, "prompt_tokens": engine[0]["prompt_tokens"],
        "completion_tokens": args.max_tokens, "runs": args.runs,
        "generate_latency_ms": generate_total * 1e3, "server_latency_ms": server_total * 1e3,
        "server_overhead_ms": (server_total - generate_total) * 1e3,
        "generate_prefill_ms": prefill * 1e3, "server_first_token_bytes_ms": ttfb * 1e3,
        "first_token_bytes_minus_prefill_ms": (ttfb - prefill) * 1e3,
        "targets": {"server_overhead_ms": 1.0, "first_token_bytes_minus_prefill_ms": 1.0},
    }
    out = ROOT / "bench" / "results" / f"{datetime.datetime.now():%Y%m%d-%H%M%S}-server-cpu-{platform.node()}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
