#!/usr/bin/env python3
"""Server overhead of `qspec serve`: a request's latency at the client minus the engine's in-process generation
time for the same request (generate() from start to end, from the server's access log line, matched by
X-Request-Id), and the time to the first streamed token's bytes minus the engine's time to that token
(prefill + the first sample). Medians over --runs; greedy with ignore_eos so that every run makes the same
tokens, checked against `qspec generate` (whose cold-process timings are recorded for reference).

  python3 bench/server_bench.py --qspec build/qspec --model DIR [--prompt TEXT] [--max-tokens N] [--runs N]

Writes bench/results/<date>-server-<host>.json (machine, commit, numbers) and prints it."""
import argparse
import datetime
import http.client
import json
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import threading
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]


def start_server(qspec, model):
    """The server, its URL, and a dict request id -> access log record filled by a reader thread."""
    process = subprocess.Popen([qspec, "serve", "--model", model, "--port", "0"], stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        match = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if match:
            url = match.group(1)
            break
    for line in process.stderr:
        if "ready" in line:
            break
    else:
        raise RuntimeError("qspec serve did not start")
    log = {}

    def read_log():
        for text in process.stderr:
            if text.startswith("{"):
                record = json.loads(text)
                log[record["request_id"].split("-", 1)[1]] = record  # "cmpl-" + the X-Request-Id

    threading.Thread(target=read_log, daemon=True).start()
    return process, url, log


def engine_ms(log, request_id, field):
    for _ in range(1000):  # the log line is written when the engine finishes, just before or after the reply
        if request_id in log:
            return log[request_id][field]
        time.sleep(0.001)
    raise RuntimeError(f"no access log line for {request_id}")


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

    process, url, log = start_server(args.qspec, args.model)
    body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            client.post("/v1/completions", json=body)  # warm-up: connection, first allocation
            latencies, overheads, first_token, first_token_overheads = [], [], [], []
            # The standard library's client for the whole-response timing: httpx alone costs ~10 us per
            # generated token here (curl agrees with http.client to ~0.1 ms).
            host, port = url.removeprefix("http://").split(":")
            connection = http.client.HTTPConnection(host, int(port))
            payload = json.dumps(body)
            for run in range(args.runs):
                request_id = f"bench-{run}"
                start = time.perf_counter()
                connection.request("POST", "/v1/completions", payload,
                                   {"Content-Type": "application/json", "X-Request-Id": request_id})
                response = json.loads(connection.getresponse().read())
                latency = time.perf_counter() - start
                assert response["choices"][0]["token_ids"] == engine[0]["tokens"], "server and generate differ"
                latencies.append(latency)
                overheads.append(latency * 1e3 - engine_ms(log, request_id, "engine_ms"))
            for run in range(args.runs):
                request_id = f"bench-stream-{run}"
                start = time.perf_counter()
                with client.stream("POST", "/v1/completions", json={**body, "stream": True},
                                   headers={"X-Request-Id": request_id}) as stream:
                    for line in stream.iter_lines():  # read to the end, so that the request ends normally
                        if (len(first_token) == run and line.startswith("data: {")
                                and json.loads(line[6:])["choices"][0]["token_ids"]):
                            first_token.append(time.perf_counter() - start)
                first_token_overheads.append(first_token[-1] * 1e3 - engine_ms(log, request_id, "engine_ttft_ms"))
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
        "server_latency_ms": server_total * 1e3,
        "server_overhead_ms": statistics.median(overheads),
        "server_first_token_bytes_ms": ttfb * 1e3,
        "first_token_bytes_minus_prefill_ms": statistics.median(first_token_overheads),
        "cold_process_generate_latency_ms": generate_total * 1e3, "cold_process_generate_prefill_ms": prefill * 1e3,
        "targets": {"server_overhead_ms": 1.0, "first_token_bytes_minus_prefill_ms": 1.0},
    }
    out = ROOT / "bench" / "results" / f"{datetime.datetime.now():%Y%m%d-%H%M%S}-server-cpu-{platform.node()}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
