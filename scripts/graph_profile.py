#!/usr/bin/env python3
"""Summarises QSPEC_GRAPH_PROFILE files (src/backend/cuda/graph_profile.h): per step graph, the time by kernel
(sum of the nodes' marginal costs, launches, mean) and its most expensive nodes.

    python3 scripts/graph_profile.py FILE.jsonl [--top N]
"""
import argparse
import json
from collections import defaultdict


def summarise(graph, top):
    nodes = graph["nodes"]
    print(f"\n== step graph: {len(nodes)} nodes, {graph['step_us']:.1f} us per replay")
    by_kernel = defaultdict(lambda: [0, 0.0])
    for node in nodes:
        entry = by_kernel[node["kernel"]]
        entry[0] += 1
        entry[1] += node["us"]
    print(f"{'kernel':<40}{'nodes':>6}{'us':>10}{'us/node':>9}{'share':>7}")
    for name, (count, us) in sorted(by_kernel.items(), key=lambda item: -item[1][1]):
        print(f"{name:<40}{count:>6}{us:>10.1f}{us / count:>9.2f}{100 * us / graph['step_us']:>6.1f}%")
    print(f"most expensive nodes (index: kernel us):")
    ranked = sorted(range(len(nodes)), key=lambda i: -nodes[i]["us"])[:top]
    print("  " + ", ".join(f"{i}: {nodes[i]['kernel']} {nodes[i]['us']:.1f}" for i in ranked))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    with open(args.file) as f:
        for line in f:
            if line.strip():
                summarise(json.loads(line), args.top)


if __name__ == "__main__":
    main()
