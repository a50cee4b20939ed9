#!/usr/bin/env python3
"""report.py — the one table of ratios scripts/gpu-bench.sh prints last.

Owns the presentation of the benchmark results: reads the replay matrix
(bench/replay_gpu.py matrix's JSON) and the hot path's HOTPATH_JSON line
(bench/hotpath.cu's output) and prints a single Markdown table, ready for
docs/performance.md. Either input may be missing; its rows then say so.

Columns: one per allocator of the replays, "vpmm direct" for the pool
called through vpmm.h (hotpath.cu), "driver" for libcuda called directly;
"ratio" is libvpmm's figure over the row's baseline (named in the measure),
"target" the goal docs/performance.md sets for that ratio or figure. In the replay rows the
ratio is the pluggable entry points' figure over the CUDA pool's (peak) or
the preload figure (time); "passthrough" marks a libvpmm run whose pool
served nothing (the shim was not active), i.e. plain CUDA was measured.

Usage: report.py [--replay results.json] [--hotpath hotpath.log]
"""
import argparse
import json
import sys

COLS = ["cudaMalloc", "cuda_pool", "torch_native", "torch_expandable", "torch_async",
        "vpmm_torch", "vpmm_preload", "direct", "driver"]
HEAD = ["cudaMalloc", "CUDA pool", "torch native", "torch expandable", "torch async",
        "vpmm pluggable", "vpmm preload", "vpmm direct", "driver"]
REPLAY_COLS = COLS[:7]


def fmt(v, unit="", digits=None):
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if digits is not None:
        return "%.*f%s" % (digits, v, unit)
    if abs(v) >= 100:
        s = "%.0f" % v
    elif abs(v) >= 10:
        s = "%.1f" % v
    else:
        s = "%.2f" % v
    return s + unit


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b


def row(measure, case, cells, r=None, target="", digits=None):
    vals = [fmt(cells.get(c), digits=digits) for c in COLS]
    return "| %s | %s | %s | %s | %s |" % (measure, case, " | ".join(vals),
                                           fmt(r, digits=digits), target)


def replay_rows(data):
    out = []
    res = {}
    for r in data.get("results", []):
        res[(r.get("trace"), r.get("alloc"))] = r
    traces = list(data.get("index", {}))
    order = [t for t in ("llm_serving", "training_varlen", "moe", "scratch_streams",
                         "lab_8x16_then_4x32", "lab_free_0_2_then_32", "lab_10g_pattern")
             if t in traces] + [t for t in traces if t not in
                                ("llm_serving", "training_varlen", "moe", "scratch_streams",
                                 "lab_8x16_then_4x32", "lab_free_0_2_then_32",
                                 "lab_10g_pattern")]

    def cell(t, a, key):
        r = res.get((t, a))
        if not r:
            return None
        if r.get("skipped"):
            return "skip"
        if not r.get("ok"):
            return "FAIL"
        if a.startswith("vpmm_") and r.get("pool_malloc") == 0:
            return "passthrough"   # libvpmm's pool served nothing: plain CUDA
        return r.get(key)

    for t in order:
        cells = {a: cell(t, a, "ratio") for a in REPLAY_COLS}
        v = cells.get("vpmm_torch")
        v = v if not isinstance(v, str) else None
        b = cells.get("cuda_pool")
        b = b if not isinstance(b, str) else None
        live = data["index"][t]["peak_live"] / (1 << 30)
        out.append(row("peak used ÷ peak live", "%s (%.2f GiB)" % (t, live), cells,
                       ratio(v, b), "≤ 1.01", digits=3))
    for t in order:
        base = cell(t, "cuda_pool", "call_s")
        base = base if not isinstance(base, str) else None
        cells = {}
        for a in REPLAY_COLS:
            c = cell(t, a, "call_s")
            cells[a] = c if isinstance(c, str) or c is None else ratio(c, base)
        v = cells.get("vpmm_preload")
        v = v if not isinstance(v, str) else None
        out.append(row("replay time ÷ CUDA pool's", "%s (%s ms)" % (t, fmt(base and base * 1e3)),
                       cells, v, "preload ≤ 1"))
    return out


def hotpath_rows(m):
    out = []
    for k in ("64K", "2M", "64M"):
        am, vm = m.get("hit_%s_async_malloc_ns" % k), m.get("hit_%s_vpmm_malloc_ns" % k)
        af, vf = m.get("hit_%s_async_free_ns" % k), m.get("hit_%s_vpmm_free_ns" % k)
        if am is None:
            continue
        out.append(row("malloc, pool hit, ns (vs cudaMallocAsync)", k,
                       {"cuda_pool": am, "direct": vm}, ratio(vm, am), "≤ 150 ns"))
        out.append(row("free, ns (vs cudaFreeAsync)", k,
                       {"cuda_pool": af, "direct": vf}, ratio(vf, af), "≤ 200 ns"))
        ap, vp = m.get("hit_%s_async_pair_ns" % k), m.get("hit_%s_vpmm_pair_ns" % k)
        if ap is not None:
            out.append(row("malloc+free pair, ns, batches of 1000 (vs CUDA pool)", k,
                           {"cuda_pool": ap, "direct": vp}, ratio(vp, ap), "≤ 350 ns"))
        nm, nf = (m.get("hit_%s_vpmm_nostream_malloc_ns" % k),
                  m.get("hit_%s_vpmm_nostream_free_ns" % k))
        if nm is not None:
            out.append(row("no-stream (cudaMalloc semantics) malloc / free, ns", k,
                           {"cuda_pool": "%s / %s" % (fmt(am), fmt(af)),
                            "direct": "%s / %s" % (fmt(nm), fmt(nf))},
                           ratio(nm, am), "≤ 150 / 200 ns"))
    for k in ("64M", "1G"):
        cm = m.get("growth_%s_cudamalloc_us" % k)
        if cm is None:
            continue
        pg, one = m.get("growth_%s_pages_us" % k), m.get("growth_%s_one_us" % k)
        out.append(row("growth, µs, 2 MiB handles (vs cudaMalloc)", k,
                       {"cudaMalloc": cm, "direct": pg,
                        "driver": m.get("growth_%s_raw_one_us" % k)},
                       ratio(pg, cm), "≤ 1.5"))
        out.append(row("growth, µs, one handle (vs cudaMalloc)", k,
                       {"cudaMalloc": cm, "direct": one,
                        "driver": m.get("growth_%s_raw_one_us" % k)},
                       ratio(one, cm), "≤ 1.5"))
        dp = m.get("growth_%s_default_us" % k)
        if dp is not None:
            out.append(row("growth, µs, default policy, %s handle(s) (vs cudaMalloc)"
                           % m.get("growth_%s_default_handles" % k, "?"), k,
                           {"cudaMalloc": cm, "direct": dp,
                            "driver": m.get("growth_%s_raw_one_us" % k)},
                           ratio(dp, cm), "≤ 1.5"))
    for n in ("64", "512"):
        v, d = m.get("defrag_%s_vpmm_us_per_handle" % n), m.get("defrag_%s_raw_us_per_handle" % n)
        if v is None:
            continue
        # The ratio is the median of paired rounds (pool and driver timed
        # back to back, hotpath.cu) where the log has it, with their range.
        def paired(key, a, b):
            r = m.get("defrag_%s_%s" % (n, key))
            if r is None:
                return ratio(a, b), "%s handles" % n
            return r, "%s handles, %d rounds: %.2f–%.2f" % (
                n, m.get("defrag_%s_rounds" % n, 0), m.get("defrag_%s_%s_min" % (n, key)),
                m.get("defrag_%s_%s_max" % (n, key)))
        r, case = paired("ratio", v, d)
        out.append(row("defrag, µs per remapped handle (vs driver map+access of fresh handles)",
                       case, {"direct": v, "driver": d}, r, "≤ 1.1"))
        d2 = m.get("defrag_%s_raw_second_us_per_handle" % n)
        if d2 is not None:
            r, case = paired("ratio_second", v, d2)
            out.append(row("defrag, µs per remapped handle (vs driver mapping the same "
                           "handles at a second address)", case,
                           {"direct": v, "driver": d2}, r, "≤ 1.1"))
        nx, un = (m.get("defrag_%s_next_malloc_us_per_handle" % n),
                  m.get("defrag_%s_raw_unmap_us_per_handle" % n))
        out.append(row("next malloc unmapping the zombies, µs per handle (vs driver unmap)",
                       "%s handles" % n, {"direct": nx, "driver": un}, ratio(nx, un),
                       "off the calling thread (0)"))
        bg = m.get("defrag_%s_bg_next_malloc_us_per_handle" % n)
        if bg is not None:
            out.append(row("next malloc with the background reclaimer (the shim's setting), "
                           "µs per handle (vs driver unmap)",
                           "%s handles" % n, {"direct": bg, "driver": un}, ratio(bg, un),
                           "off the calling thread (0)"))
    if "threads_vpmm_1_mpairs" in m:
        n = int(m.get("threads_n", 8))
        v = ratio(m["threads_vpmm_n_mpairs"], m["threads_vpmm_1_mpairs"])
        a = ratio(m["threads_async_n_mpairs"], m["threads_async_1_mpairs"])
        out.append(row("%d threads ÷ 1 thread, throughput (M pairs/s: 1 → %d)" % (n, n),
                       "2 MiB, own streams",
                       {"cuda_pool": "%.2f (%.1f → %.1f)" % (a, m["threads_async_1_mpairs"],
                                                            m["threads_async_n_mpairs"]),
                        "direct": "%.2f (%.1f → %.1f)" % (v, m["threads_vpmm_1_mpairs"],
                                                         m["threads_vpmm_n_mpairs"])},
                       v, "≥ 4"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replay", help="results JSON of replay_gpu.py matrix")
    ap.add_argument("--hotpath", help="output of bench/hotpath (HOTPATH_JSON line)")
    args = ap.parse_args(argv)

    lines = ["| measure | case | " + " | ".join(HEAD) + " | ratio | target |",
             "|" + "---|" * (len(HEAD) + 4)]
    device = date = None
    if args.replay:
        try:
            with open(args.replay) as f:
                data = json.load(f)
            device, date = data.get("device"), data.get("date")
            lines += replay_rows(data)
        except (OSError, ValueError) as e:
            lines.append("| replays | — | no results: %s |" % e)
    if args.hotpath:
        m = None
        try:
            with open(args.hotpath) as f:
                for line in f:
                    if line.startswith("HOTPATH_JSON "):
                        m = json.loads(line[len("HOTPATH_JSON "):])
        except (OSError, ValueError) as e:
            lines.append("| hot path | — | no results: %s |" % e)
        if m is not None:
            lines += hotpath_rows(m)
        else:
            lines.append("| hot path | — | no HOTPATH_JSON line |")
    print("Device: %s; date: %s" % (device or "?", date or "?"))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
