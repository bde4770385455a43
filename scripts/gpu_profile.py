#!/usr/bin/env python3
"""Where a step's GPU time goes: every kernel of a prefill, of decode steps and of speculative steps, timed by
Nsight Compute (gpu__time_duration, one pass per kernel, clocks left alone) and grouped by kernel name.

Runs on the GPU machine (called by `scripts/gpu.sh run` when QSPEC_PROFILE=1):
    gpu_profile.py BUNDLE TARGET_DIR DRAFTER_DIR OUT_JSON

Phases are found from the launch sequence itself: a plain run of P prompt tokens and N new tokens is a prefill
followed by N - 1 identical decode steps, so the decode step is the shortest period that repeats at the end.
Kernel times exclude the gaps between launches; the bench's step times include them, and the difference is
the cost of the launches."""
import csv
import io
import json
import os
import re
import subprocess
import sys
from collections import OrderedDict


def ncu_kernels(cmd, log):
    ncu = os.environ.get("NCU", "ncu")
    full = [ncu, "--csv", "--clock-control", "none", "--cache-control", "none", "--metrics", "gpu__time_duration.sum",
            "--print-units", "base", "--print-kernel-base", "function", "--log-file", log] + cmd
    proc = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ncu failed ({proc.returncode}): {proc.stdout[-2000:]}")
    text = open(log).read()
    start = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    kernels = []
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = re.sub(r"<.*", "", row["Kernel Name"]).split("::")[-1]
        kernels.append((name, float(row["Metric Value"].replace(",", "")) / 1000.0))  # ns -> us
    return kernels


def period(names, repeats, shortest=1, trailing=0):
    """Smallest p >= shortest such that `repeats` blocks of p launches are identical, ending at most `trailing`
    launches before the end (a run's last step may differ)."""
    for p in range(shortest, len(names) // repeats + 1):
        for s in range(0, trailing + 1):
            end = len(names) - s
            if all(names[end - (i + 1) * p:end - i * p] == names[end - p:end] for i in range(1, repeats)):
                return p, s
    return None


def summarize(kernels, steps=1):
    groups = OrderedDict()
    for name, us in kernels:
        g = groups.setdefault(name, [0, 0.0])
        g[0] += 1
        g[1] += us
    total = sum(us for _, us in kernels)
    table = sorted(({"kernel": k, "launches": c / steps, "us": t / steps} for k, (c, t) in groups.items()),
                   key=lambda r: -r["us"])
    return {"launches": len(kernels) / steps, "kernel_us": total / steps, "by_kernel": table}


def print_phase(title, s, top=14):
    print(f"\n-- {title}: {s['launches']:.0f} launches, {s['kernel_us']:.1f} us of kernel time")
    for r in s["by_kernel"][:top]:
        print(f"   {r['kernel'][:52]:<52}{r['launches']:>6.0f}x{r['us']:>10.1f} us"
              f"{100 * r['us'] / max(s['kernel_us'], 1e-9):>6.1f}%")


def main():
    bundle, target, drafter, out_json = sys.argv[1:5]
    qspec = os.path.join(bundle, "qspec")
    report = {}
    # QSPEC_PROFILE_PREFILL: the prompt's length, prefilled in one chunk (default 2048).
    prompt_tokens = int(os.environ.get("QSPEC_PROFILE_PREFILL", "2048"))
    prompt = ",".join(str(1000 + (i * 7919) % 50000) for i in range(prompt_tokens))
    new = 4
    kernels = ncu_kernels([qspec, "generate", "--model", target, "--backend", "cuda", "--ignore-eos",
                              "--prompt-ids", prompt, "--prefill-chunk", str(prompt_tokens), "-n", str(new)],
                          "/tmp/ncu_plain.csv")
    names = [k for k, _ in kernels]
    found = period(names, new - 1)
    if found is None:
        raise RuntimeError("no repeating decode step in the plain run")
    p = found[0]
    report[f"prefill_{prompt_tokens}"] = summarize(kernels[:len(kernels) - (new - 1) * p])
    report["decode"] = summarize(kernels[len(kernels) - (new - 1) * p:], new - 1)

    if os.path.isdir(drafter):
        short = ",".join(str(1000 + i) for i in range(60))
        plain = subprocess.run([qspec, "generate", "--model", target, "--backend", "cuda", "--ignore-eos",
                                "--prompt-ids", short, "-n", "80", "--json"], stdout=subprocess.PIPE, text=True,
                               check=True)
        tokens = json.loads(plain.stdout)["tokens"]
        with open("/tmp/oracle.json", "w") as f:
            json.dump(tokens, f)
        steps = 5
        kernels = ncu_kernels([qspec, "generate", "--model", target, "--backend", "cuda", "--ignore-eos",
                                  "--prompt-ids", short, "-n", str(1 + 16 * steps), "--draft-model", drafter,
                                  "--draft-oracle", "/tmp/oracle.json"], "/tmp/ncu_spec.csv")
        names = [k for k, _ in kernels]
        # A step is draft + verify + commit (hundreds of launches); the commit alone repeats with period 2.
        found = period(names, 2, shortest=100, trailing=300)
        if found is None:
            raise RuntimeError("no repeating speculative step")
        p, s = found
        end = len(kernels) - s
        report["speculative_step"] = summarize(kernels[end - 2 * p:end], 2)

    with open(out_json, "w") as f:
        json.dump(report, f, indent=1)
    for title, s in report.items():
        print_phase(title, s)


if __name__ == "__main__":
    main()
