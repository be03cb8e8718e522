#!/usr/bin/env python3
"""Median table of several `scripts/bench-codec.sh --json-out` runs (docs/PERFORMANCE.md).

    bench/codec/summarize.py run1.json run2.json run3.json > table.md

Every cell is the median over the runs: rates of each codec, and the ratios as measured
within each run (rounds alternate between the codecs, so a ratio is taken on one machine
state; on a shared machine the rates themselves move between runs more than the ratios).
The summary is the geometric mean of the rows' median ratios, by working set.
"""
import json
import math
import statistics
import sys


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    keys = [(r["case"], r["shard_bytes"], r["working_set"]) for r in runs[0]["rows"]]
    by = [{(r["case"], r["shard_bytes"], r["working_set"]): r for r in run["rows"]} for run in runs]
    print("| case | shard | set | sbod GB/s | ISA-L GB/s | klauspost GB/s | sbod/ISA-L "
          "| sbod/klauspost | sbod/faster peer | sbod % of ceiling |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = {"cache": {"isal": [], "peer": []}, "stream": {"isal": [], "peer": []}}
    wins = {"isal": [0, 0], "peer": [0, 0]}
    for k in keys:
        rows = [b[k] for b in by if k in b]

        def rate(codec):
            return med(r[codec]["gbps"] if r.get(codec) else None for r in rows)

        vs_isal = med(r.get("sbod_vs_isal") for r in rows)
        vs_kp = med(r.get("sbod_vs_klauspost") for r in rows)
        vs_peer = med(
            min(x for x in (r.get("sbod_vs_isal"), r.get("sbod_vs_klauspost")) if x is not None)
            for r in rows
        )
        pct = med(r.get("sbod_pct_of_ceiling") for r in rows)
        shard = k[1] // 1024
        shard = f"{shard // 1024}M" if shard >= 1024 else f"{shard}K"
        print(f"| {k[0]} | {shard} | {k[2]} | {fmt(rate('sbod'), '.1f')} | "
              f"{fmt(rate('isal'), '.1f')} | {fmt(rate('klauspost'), '.1f')} | "
              f"{fmt(vs_isal, '.2f')} | {fmt(vs_kp, '.2f')} | {fmt(vs_peer, '.2f')} | "
              f"{'' if pct is None else f'{pct:.0f}%'} |")
        set_ = "cache" if k[2] == "cache" else "stream"
        for name, x in (("isal", vs_isal), ("peer", vs_peer)):
            if x is not None:
                ratios[set_][name].append(x)
                wins[name][0] += x >= 1.0
                wins[name][1] += 1

    def gm(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")

    print()
    print("| | cache-resident | streaming |")
    print("|---|---:|---:|")
    print(f"| sbod / ISA-L | {gm(ratios['cache']['isal']):.2f} | {gm(ratios['stream']['isal']):.2f} |")
    print(f"| sbod / the faster peer | {gm(ratios['cache']['peer']):.2f} | "
          f"{gm(ratios['stream']['peer']):.2f} |")
    print()
    print(f"rows at or above 1.0: vs ISA-L {wins['isal'][0]} of {wins['isal'][1]}, "
          f"vs the faster peer {wins['peer'][0]} of {wins['peer'][1]}")
    ceil = [r["ceiling"]["copy_gbps"] for r in runs]
    print("memory ceiling (streaming copy, GB/s copied) per run: "
          + ", ".join(f"{c:.1f}" for c in ceil))


if __name__ == "__main__":
    main(sys.argv[1:])
