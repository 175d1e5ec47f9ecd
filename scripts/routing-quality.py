#!/usr/bin/env python3
"""Routing quality of every example policy against the KV-hit reference.

For each trace and fleet size, one `router replay --compare` runs round-robin,
least-loaded, power-of-two, kv-cost (examples/policies/kv.hcl) and the default
kv-affinity (examples/policies/kv-affinity.hcl) on the same trace, and this
script prints a Markdown table per trace: KV hit, KV reference, the share of
it reached, and TTFT mean / p90 / p99 (ms of simulated time). It then checks
issue #14's targets for the default policy in every cell and prints each
check; it exits 1 when one fails.

Targets (issue #14 section 2), per trace and fleet size:
  - KV hit >= 90% of kv_hit_reference, and >= round-robin's;
  - TTFT p90 and p99 <= 1.05 x the best of round-robin, least-loaded and
    power-of-two;
  - TTFT mean and p90 <= kv-cost's.

Replay is simulated time: the figures do not depend on the machine.

Usage: scripts/routing-quality.py [--bin bin/router] [--workers 4,8,16]
       [--seed N] [TRACE ...]   (default: the bundled conversation and arXiv
       traces and the generated session trace when present)
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ["round-robin", "least-loaded", "power-of-two", "kv", "kv-affinity"]
DEFAULT_TRACES = [
    "testdata/traces/mooncake_conversation_trace.jsonl",
    "testdata/traces/mooncake_arxiv_trace_first1000.jsonl",
    "testdata/traces/synthetic_sessions.jsonl",
]


def run(binary, trace, workers, seed):
    files = ",".join(os.path.join(ROOT, "examples/policies", p + ".hcl") for p in POLICIES)
    cmd = [binary, "replay", "--trace", trace, "--workers", str(workers), "--compare", files, "--report", "-"]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr}")
    return {r["policy"]: r for r in json.loads(out.stdout)}


MAX_WORKERS = 4096  # router replay's largest fleet (replay.MaxWorkers)


def fleet_sizes(text):
    """--workers: distinct whole numbers from 1 to MAX_WORKERS, comma-separated."""
    sizes = []
    for w in text.split(","):
        if not w.strip().isdigit() or not 1 <= int(w) <= MAX_WORKERS:
            raise argparse.ArgumentTypeError(
                f"{w!r} in {text!r}: want comma-separated whole numbers from 1 to {MAX_WORKERS}, such as 4,8,16")
        if int(w) in sizes:
            raise argparse.ArgumentTypeError(f"{text!r}: {int(w)} given twice")
        sizes.append(int(w))
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "bin/router"))
    ap.add_argument("--workers", type=fleet_sizes, default="4,8,16")
    ap.add_argument("--seed", type=int)
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()
    if not (os.path.isfile(a.bin) and os.access(a.bin, os.X_OK)):
        ap.error(f"argument --bin: {a.bin}: not an executable file (make build writes bin/router)")
    traces = a.traces or [os.path.join(ROOT, t) for t in DEFAULT_TRACES if os.path.exists(os.path.join(ROOT, t))]
    if not traces:
        ap.error("no trace given and none of the bundled ones found: " + ", ".join(DEFAULT_TRACES))
    fails = 0
    for trace in traces:
        cells = {w: run(a.bin, trace, w, a.seed) for w in a.workers}
        ws = sorted(cells)
        print(f"\n### {os.path.basename(trace)}\n")
        print("| policy | " + " | ".join(f"{w} workers: KV hit (of ref) | TTFT mean / p90 / p99 ms" for w in ws) + " |")
        print("| --- |" + " --- | --- |" * len(ws))
        print("| reference (one LRU of the fleet's capacity) | "
              + " | ".join(f"{cells[w]['kv-affinity']['kv_hit_reference'] * 100:.1f}% | " for w in ws) + " |")
        for p in POLICIES:
            row = []
            for w in ws:
                r = cells[w][p]
                t = r["ttft_ms"]
                row.append(f"{r['kv_hit_ratio'] * 100:.1f}% ({r['kv_hit_of_reference'] * 100:.0f}%)")
                row.append(f"{t['mean']:.0f} / {t['p90']:.0f} / {t['p99']:.0f}")
            name = {"kv": "kv-cost", "kv-affinity": "kv-affinity (default)"}.get(p, p)
            print(f"| {name} | " + " | ".join(row) + " |")
        print()
        for w in ws:
            c = cells[w]
            d, rr, kc = c["kv-affinity"], c["round-robin"], c["kv"]
            base = [c[p]["ttft_ms"] for p in ("round-robin", "least-loaded", "power-of-two")]
            checks = [
                ("KV hit >= 90% of reference", d["kv_hit_of_reference"] >= 0.9,
                 f"{d['kv_hit_of_reference'] * 100:.1f}%"),
                ("KV hit >= round-robin's", d["kv_hit_ratio"] >= rr["kv_hit_ratio"],
                 f"{d['kv_hit_ratio'] * 100:.1f}% vs {rr['kv_hit_ratio'] * 100:.1f}%"),
            ]
            for q in ("p90", "p99"):
                best = min(b[q] for b in base)
                checks.append((f"TTFT {q} <= 1.05 x best of rr/ll/p2c", d["ttft_ms"][q] <= 1.05 * best,
                               f"{d['ttft_ms'][q]:.0f} vs {1.05 * best:.0f}"))
            for q in ("mean", "p90"):
                checks.append((f"TTFT {q} <= kv-cost's", d["ttft_ms"][q] <= kc["ttft_ms"][q],
                               f"{d['ttft_ms'][q]:.0f} vs {kc['ttft_ms'][q]:.0f}"))
            for name, ok, detail in checks:
                fails += not ok
                print(f"- {w} workers: {'met' if ok else 'MISSED'}: {name} ({detail})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
