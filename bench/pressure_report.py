#!/usr/bin/env python3
"""pressure_report.py — the Markdown tables of bench/pressure.py's results:
the replays alone and under pressure (workload x allocator: completed, out
of memory, error, crash or hang; call time against the CUDA pool's alone),
and the soak's counts by allocator, VPMM_* settings and margin.

Owns the presentation only; reads the JSON bench/pressure.py writes (its
records: outcome, why, result = replay_gpu.py's RESULT, holder = the hold
program's state before the run). Only the standard library.

Usage: pressure_report.py RESULTS.json
"""
import json
import sys

MiB = 1 << 20
GiB = 1 << 30
OUTCOMES = ["completed", "oom", "error", "crash", "hang"]
ALLOC_HEAD = {"cudaMalloc": "cudaMalloc", "cuda_pool": "CUDA pool",
              "torch_native": "torch native", "torch_expandable": "torch expandable",
              "torch_async": "torch async", "vpmm_torch": "vpmm pluggable",
              "vpmm_preload": "vpmm preload",
              "vpmm_preload_always": "vpmm preload, REMAP=always"}


BASE = "base:"  # prefix of the allocators run with pressure.py --base-libvpmm


def unbased(a):
    """The allocator a names, without BASE."""
    return a[len(BASE):] if a.startswith(BASE) else a


def alloc_head(a):
    """A column's heading; base:NAME is NAME run with the other revision's
    library."""
    name = unbased(a)
    return ALLOC_HEAD.get(name, name) + (", base" if name != a else "")


def mib(n):
    return "—" if n is None else "%.0f" % (n / MiB)


def fmt_bytes(n):
    return "%.2f GiB" % (n / GiB) if n >= GiB else "%.0f MiB" % (n / MiB)


def setup_from(rec):
    """The bytes a replay process took before its first allocation."""
    res = (rec or {}).get("result") or {}
    if res.get("setup_used") is not None:
        return int(res["setup_used"])
    # No NVML: cudaMemGetInfo's used at the baseline against the holder's
    # free just before (the device's used then, the holder's context in it).
    st = rec.get("holder") or {}
    if res.get("measured_by") == "cudaMemGetInfo" and res.get("baseline_used") is not None \
            and st.get("free") is not None and st.get("total"):
        return max(0, int(res["baseline_used"]) - (st["total"] - st["free"]))
    return None


def title(doc, what):
    dev = doc.get("device") or "no GPU"
    if doc.get("fake"):
        dev += " (FAKE: dry replays, simulated holder)"
    return "## %s: %s, %s, %s" % (what, dev, doc.get("date"), doc.get("rev") or "rev unknown")


def ms(s):
    return "%.0f ms" % (s * 1e3) if s >= 0.1 else "%.1f ms" % (s * 1e3)


def pressure_cell(rec, pool_alone):
    if not rec:
        return "—"
    o = rec.get("outcome")
    res = rec.get("result") or {}
    if o == "completed":
        t = res.get("call_s")
        r = " = %.2f×" % (t / pool_alone) if pool_alone and t is not None else ""
        peak = ", peak %.3f" % res["ratio"] if res.get("ratio") else ""
        return ("ok, %s%s%s" % (ms(t), r, peak)) if t is not None else "ok"
    if o == "oom":
        at, ops = res.get("failed_at"), res.get("ops")
        return "oom at %d%%" % (100 * at // ops) if at is not None and ops else "oom"
    if o == "crash":
        return "**CRASH** %s" % (rec.get("signal") or "rc %s" % rec.get("rc"))
    if o in ("error", "hang"):
        return "**%s**" % o.upper()
    if o == "not run":
        return "not run (deadline)" if "deadline" in (rec.get("why") or "") else \
            "not run (alone failed)"
    return o or "—"


def pressure_table(doc):
    runs = {(r.get("workload"), r.get("alloc"), r.get("phase")): r for r in doc["runs"]}
    allocs = doc["allocs"]
    out = [title(doc, "Under memory pressure from another process"), ""]
    out.append("Seed %s. Another process (test/gpu/hold.cu) holds the device's memory "
               "but %.2f × the workload's peak live + the replay's own set-up (its run "
               "alone) + %s. Cells: outcome, call time = its ratio to the CUDA pool's "
               "time alone, peak used ÷ peak live; oom at N%% = the allocation that "
               "failed, N%% into the trace."
               % (doc.get("seed"), doc["margin"], fmt_bytes(doc["allowance"])))
    if doc.get("max_ops"):
        out.append("Traces cut to their first %d operations." % doc["max_ops"])
    out.append("")
    out.append("| workload (peak live; CUDA pool alone) | " +
               " | ".join(alloc_head(a) for a in allocs) + " |")
    out.append("|---|" + "---|" * len(allocs))
    alone_rows = []
    for w in doc["workloads"]:
        pool = runs.get((w, "cuda_pool", "alone"))
        pr = (pool or {}).get("result") or {}
        pool_t = pr.get("call_s") if (pool or {}).get("outcome") == "completed" else None
        peak = (runs.get((w, allocs[0], "alone")) or {}).get("peak_live") or \
            doc["index"].get(w, {}).get("peak_live", 0)
        out.append("| %s (%s; %s) | %s |" % (
            w, fmt_bytes(peak), ms(pool_t) if pool_t else "—",
            " | ".join(pressure_cell(runs.get((w, a, "pressure")), pool_t) for a in allocs)))
        cells = []
        for a in allocs:
            r = runs.get((w, a, "alone"))
            res = (r or {}).get("result") or {}
            if r and r.get("outcome") == "completed":
                t = res.get("call_s")
                cells.append("%s, %.3f" % ("%.2f×" % (t / pool_t) if pool_t else ms(t),
                                           res.get("ratio") or 0))
            else:
                cells.append(pressure_cell(r, pool_t))
        alone_rows.append("| %s | %s |" % (w, " | ".join(cells)))
    out += ["", "Alone (the holder holds nothing): call time ÷ the CUDA pool's, "
            "peak used ÷ peak live.", "",
            "| workload | " + " | ".join(alloc_head(a) for a in allocs) + " |",
            "|---|" + "---|" * len(allocs)] + alone_rows
    setups = []
    for a in allocs:
        v = [setup_from(r) for r in doc["runs"] if r.get("alloc") == a and
             r.get("phase") == "alone" and setup_from(r) is not None]
        if v:
            setups.append("%s %s–%s" % (a, mib(min(v)), mib(max(v))))
    eff = [r["effective_margin"] for r in doc["runs"] if r.get("effective_margin")]
    out += ["", "Set-up of a replay process alone, MiB (min–max over workloads): " +
            (", ".join(setups) or "—") + "."]
    if eff:
        out.append("Effective margins under pressure ((holder's free − the run's own "
                   "set-up) ÷ peak live): %.3f–%.3f." % (min(eff), max(eff)))
    out += counts_line(doc["runs"]) + bad_runs(doc["runs"])
    if doc.get("stopped"):
        out.append("\nStopped early: %s." % doc["stopped"])
    return "\n".join(out)


def counts_line(runs):
    c = {}
    for r in runs:
        c[r.get("outcome")] = c.get(r.get("outcome"), 0) + 1
    items = sorted(c.items(), key=lambda kv: str(kv[0]))
    return ["", "Runs: " + ", ".join("%s %d" % (k, v) for k, v in items) + "."]


def bad_runs(runs, limit=30):
    bad = [r for r in runs if r.get("outcome") in ("error", "crash", "hang")]
    if not bad:
        return []
    out = ["", "Not completed for another reason than out of memory:"]
    for r in bad[:limit]:
        out.append("- %s, %s%s%s: %s, %s" % (
            r.get("workload"), r.get("alloc"),
            ", " + r["vpmm_env"] if r.get("vpmm_env") else "",
            ", margin %.2f" % r["margin"] if r.get("margin") else "",
            r.get("outcome"), (r.get("why") or "")[:160]))
    if len(bad) > limit:
        out.append("- and %d more (the JSON, the crash log)" % (len(bad) - limit))
    return out


def soak_table(doc):
    runs = [r for r in doc["runs"] if r.get("outcome") in OUTCOMES]
    margins = doc["margins"]
    out = [title(doc, "Soak under memory pressure from another process"), ""]
    out.append("Seed %s; traces cut to their first %s operations; the holder leaves "
               "margin × the cut trace's peak live + the replay's own set-up + %s. "
               "%d runs of %d planned in %s s. Cells: completed / out of memory / "
               "**error+crash+hang**." % (
                   doc.get("seed"), doc.get("max_ops") or "all",
                   fmt_bytes(doc["allowance"]), len(runs), doc.get("planned", 0),
                   doc.get("elapsed_s")))
    if len(runs) < 100:
        out.append("Fewer than 100 runs: raise SOAK_DEADLINE or lower SOAK_MAX_OPS.")
    out += ["", "| allocator | VPMM settings | " +
            " | ".join("%.2f" % m for m in margins) + " | all |",
            "|---|---|" + "---|" * (len(margins) + 1)]

    def cell(rs):
        if not rs:
            return "—"
        c = sum(r["outcome"] == "completed" for r in rs)
        o = sum(r["outcome"] == "oom" for r in rs)
        b = len(rs) - c - o
        return "%d / %d / %s" % (c, o, "**%d**" % b if b else "0")

    for a in doc["allocs"]:
        for label in doc["vpmm_sets"]:
            rs = [r for r in runs if r["alloc"] == a and r.get("vpmm_env") == label]
            out.append("| %s | %s | %s | %s |" % (
                alloc_head(a), label,
                " | ".join(cell([r for r in rs if r.get("margin") == m]) for m in margins),
                cell(rs)))
    out += ["", "By workload (all settings and margins):", "",
            "| workload | runs | completed / oom / bad |", "|---|---|---|"]
    for w in doc["workloads"]:
        rs = [r for r in runs if r.get("workload") == w]
        out.append("| %s | %d | %s |" % (w, len(rs), cell(rs)))
    passthrough = [r for r in runs if unbased(r["alloc"]).startswith("vpmm") and
                   (r.get("result") or {}).get("pool_malloc") == 0 and
                   (r.get("result") or {}).get("done_ops")]
    if passthrough:
        out.append("\n%d vpmm runs in which the pool served nothing (the library was "
                   "off or refused its settings: those measured plain CUDA)."
                   % len(passthrough))
    unsettled = sum(1 for r in runs if not (r.get("holder") or {}).get("settled", 1))
    if unsettled:
        out.append("\nIn %d runs the device's free memory had not come back when the "
                   "holder adjusted (settled=0)." % unsettled)
    out += counts_line(doc["runs"] + doc.get("calibration", [])) + bad_runs(doc["runs"])
    if doc.get("stopped"):
        out.append("\nStopped early: %s." % doc["stopped"])
    return "\n".join(out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        doc = json.load(f)
    print(pressure_table(doc) if doc.get("mode") == "pressure" else soak_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
