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

A policy that completed no request has no TTFT (the report's ttft_ms is
null): its table cells read n/a; a check of the default policy's TTFT then
misses, and a check against a policy without one compares with the others
(skipped, "not judged", when none has one).

Replay is simulated time: the figures do not depend on the machine. They do
depend on the seeds: a random tie-break early in a run changes every later
decision. --seeds 1,2,3 repeats every cell with each seed (the example
policies' own component seeds dropped, so that the router seed governs every
draw) and prints, per check, how many (cell, seed) runs met it and the worst
value seen.

--peers adds the peer baselines of issue #30 (examples/policies/peers/:
Dynamo's KV router, llm-d's default scheduler profile, SGLang's cache-aware
policy, AIBrix's prefix-cache policy) to every comparison and to the tables;
with --seeds it also prints, per trace, a table of the default and each peer
averaged over the seeds, with the range of TTFT p90 across them. The checks
stay the default policy's against the example policies.

Usage: scripts/routing-quality.py [--bin bin/router] [--workers 4,8,16]
       [--seeds N,M,...] [--peers] [TRACE ...]   (default: the bundled
       conversation and arXiv traces and the generated session trace when
       present)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ["round-robin", "least-loaded", "power-of-two", "kv", "kv-affinity"]
PEERS = ["dynamo", "llm-d", "sglang", "aibrix"]  # examples/policies/peers/NAME.hcl
DEFAULT_TRACES = [
    "testdata/traces/mooncake_conversation_trace.jsonl",
    "testdata/traces/mooncake_arxiv_trace_first1000.jsonl",
    "testdata/traces/synthetic_sessions.jsonl",
]


def run(binary, trace, workers, seed, policy_dir, peers=False):
    """One --compare of the example policies (and the peers, from policy_dir/peers) on trace."""
    names = POLICIES + [os.path.join("peers", p) for p in PEERS] * peers
    files = ",".join(os.path.join(policy_dir, p + ".hcl") for p in names)
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


def seed_list(text):
    """--seeds: comma-separated whole numbers."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want comma-separated whole numbers, such as 1,2,3")


def ttft(r, q):
    """Record r's TTFT quantile q (ms), or None when it has none (ttft_ms null: no request completed)."""
    t = r.get("ttft_ms")
    return None if t is None else t[q]


def at_most(value, limit):
    """A latency check: True or False, None (not judged) without a limit; a missing value misses."""
    if limit is None:
        return None
    return value is not None and value <= limit


def checks(c):
    """Issue #14's checks of the default policy in one cell: (name, met, value, limit).

    met is True, False or None (not judged: no policy to compare with has a
    TTFT); value and limit are None where a policy has no TTFT."""
    d, rr, kc = c["kv-affinity"], c["round-robin"], c["kv"]
    base = [c[p] for p in ("round-robin", "least-loaded", "power-of-two")]
    out = [
        ("KV hit >= 90% of reference", d["kv_hit_of_reference"] >= 0.9, d["kv_hit_of_reference"] * 100, 90.0),
        ("KV hit >= round-robin's", d["kv_hit_ratio"] >= rr["kv_hit_ratio"], d["kv_hit_ratio"] * 100, rr["kv_hit_ratio"] * 100),
    ]
    for q in ("p90", "p99"):
        have = [ttft(b, q) for b in base if ttft(b, q) is not None]
        limit = 1.05 * min(have) if have else None
        out.append((f"TTFT {q} <= 1.05 x best of rr/ll/p2c", at_most(ttft(d, q), limit), ttft(d, q), limit))
    for q in ("mean", "p90"):
        out.append((f"TTFT {q} <= kv-cost's", at_most(ttft(d, q), ttft(kc, q)), ttft(d, q), ttft(kc, q)))
    return out


def num(v, fmt=".1f"):
    """v formatted, or n/a for None."""
    return "n/a" if v is None else format(v, fmt)


def verdict(ok):
    return {True: "met", False: "MISSED", None: "not judged"}[ok]


def ttft_cell(r):
    """A table's "TTFT mean / p90 / p99" cell of record r."""
    if r.get("ttft_ms") is None:
        return "n/a (none completed)"
    t = r["ttft_ms"]
    return f"{t['mean']:.0f} / {t['p90']:.0f} / {t['p99']:.0f}"


def unseeded_policies(tmp):
    """Copies of the example policies (and peers) without their components' own seeds."""
    os.makedirs(os.path.join(tmp, "peers"), exist_ok=True)
    for p in POLICIES + [os.path.join("peers", p) for p in PEERS]:
        with open(os.path.join(ROOT, "examples/policies", p + ".hcl")) as f:
            src = f.read()
        # A component's seed is indented deeper than the router block's.
        src = re.sub(r"(?m)^ {3,}seed\s*=.*$", "", src)
        with open(os.path.join(tmp, p + ".hcl"), "w") as f:
            f.write(src)
    return tmp


def label(p):
    return {"kv": "kv-cost", "kv-affinity": "kv-affinity (default)"}.get(p, p if p in POLICIES else "peer: " + p)


def peer_table(runs, ws, seeds):
    """The default and each peer, averaged over the seeds' runs: runs[(w, seed)] = {policy: record}."""
    print(f"\nseeds {','.join(map(str, seeds))}, component seeds dropped: mean over the seeds "
          "(TTFT p90 range across seeds in brackets)\n")
    print("| policy | " + " | ".join(f"{w} workers: KV hit (of ref) | TTFT mean / p90 [min-max] / p99 ms" for w in ws) + " |")
    print("| --- |" + " --- | --- |" * len(ws))
    for p in ["kv-affinity"] + PEERS:
        row = []
        for w in ws:
            rs = [runs[(w, seed)][p] for seed in seeds]
            m = lambda f: sum(f(r) for r in rs) / len(rs)
            row.append(f"{m(lambda r: r['kv_hit_ratio']) * 100:.1f}% ({m(lambda r: r['kv_hit_of_reference']) * 100:.0f}%)")
            # TTFT over the seeds' runs that have one (a run that completed
            # nothing has none).
            ts = [r for r in rs if r.get("ttft_ms") is not None]
            if not ts:
                row.append("n/a (none completed)")
                continue
            mt = lambda q: sum(r["ttft_ms"][q] for r in ts) / len(ts)
            p90s = [r["ttft_ms"]["p90"] for r in ts]
            some = f" ({len(ts)} of {len(rs)} seeds)" if len(ts) < len(rs) else ""
            row.append(f"{mt('mean'):.0f} / {mt('p90'):.0f} [{min(p90s):.0f}-{max(p90s):.0f}] / {mt('p99'):.0f}{some}")
        print(f"| {label(p)} | " + " | ".join(row) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "bin/router"))
    ap.add_argument("--workers", type=fleet_sizes, default="4,8,16")
    ap.add_argument("--seeds", type=seed_list, help="comma-separated seeds to repeat every cell with")
    ap.add_argument("--peers", action="store_true",
                    help="also compare the peer baselines of examples/policies/peers/ (issue #30)")
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()
    if not (os.path.isfile(a.bin) and os.access(a.bin, os.X_OK)):
        ap.error(f"argument --bin: {a.bin}: not an executable file (make build writes bin/router)")
    traces = a.traces or [os.path.join(ROOT, t) for t in DEFAULT_TRACES if os.path.exists(os.path.join(ROOT, t))]
    if not traces:
        ap.error("no trace given and none of the bundled ones found: " + ", ".join(DEFAULT_TRACES))
    for t in traces:
        if not os.path.isfile(t):
            ap.error(f"trace {t}: no such file")
    seeds = a.seeds or []
    examples = os.path.join(ROOT, "examples/policies")
    fails = 0
    for trace in traces:
        cells = {w: run(a.bin, trace, w, None, examples, a.peers) for w in a.workers}
        ws = sorted(cells)
        print(f"\n### {os.path.basename(trace)}\n")
        print("| policy | " + " | ".join(f"{w} workers: KV hit (of ref) | TTFT mean / p90 / p99 ms" for w in ws) + " |")
        print("| --- |" + " --- | --- |" * len(ws))
        print("| reference (one LRU of the fleet's capacity) | "
              + " | ".join(f"{cells[w]['kv-affinity']['kv_hit_reference'] * 100:.1f}% | " for w in ws) + " |")
        for p in POLICIES + PEERS * a.peers:
            row = []
            for w in ws:
                r = cells[w][p]
                row.append(f"{r['kv_hit_ratio'] * 100:.1f}% ({r['kv_hit_of_reference'] * 100:.0f}%)")
                row.append(ttft_cell(r))
            print(f"| {label(p)} | " + " | ".join(row) + " |")
        print()
        for w in ws:
            for name, ok, value, limit in checks(cells[w]):
                fails += ok is False
                print(f"- {w} workers: {verdict(ok)}: {name} ({num(value)} against {num(limit)})")
        if not seeds:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            unseeded = unseeded_policies(tmp)
            tally, seeded = {}, {}
            for w in ws:
                for seed in seeds:
                    seeded[(w, seed)] = run(a.bin, trace, w, seed, unseeded, a.peers)
                    for name, ok, value, limit in checks(seeded[(w, seed)]):
                        met, runs, skipped, worst = tally.get((w, name), (0, 0, 0, None))
                        if ok is None:
                            tally[(w, name)] = (met, runs, skipped + 1, worst)
                            continue
                        # The worst run: the smallest value for the KV checks,
                        # the largest for the latency ones; a default policy
                        # without a TTFT is worse than any with one.
                        if value is None:
                            bad = float("inf")
                        else:
                            bad = value - limit if name.startswith("TTFT") else limit - value
                        if worst is None or bad > worst[0]:
                            worst = (bad, seed, value, limit)
                        tally[(w, name)] = (met + ok, runs + 1, skipped, worst)
        print(f"\nseeds {','.join(map(str, seeds))}, component seeds dropped:")
        for (w, name), (met, runs, skipped, worst) in tally.items():
            line = f"- {w} workers: {name}: met in {met} of {runs}"
            if worst is not None:
                line += f" (worst: seed {worst[1]}, {num(worst[2])} against {num(worst[3])})"
            if skipped:
                line += f"; not judged in {skipped} (no policy to compare with completed a request)"
            print(line)
        if a.peers:
            peer_table(seeded, ws, seeds)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
