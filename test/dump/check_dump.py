"""check_dump.py — an independent reader of `vpmm-dump PID --json` for the
dump suite: parses the document with Python's json module and checks it
against the facts the test program passes (see test_dump.c).

usage: check_dump.py FILE PID LIVE_BYTES REGIONS KINDS
  KINDS: comma-separated kind=bytes pairs the regions must sum to
Exit 0 when everything holds; otherwise 1 with one line per problem.
"""
import json
import sys


def main():
    path, pid, live, nregions, kinds = sys.argv[1:6]
    with open(path) as f:
        doc = json.load(f)
    problems = []

    def expect(cond, msg):
        if not cond:
            problems.append(msg)

    expect(doc.get("vpmm_dump") == 1, "vpmm_dump is not 1")
    expect(doc.get("protocol") == 1, "protocol is not 1")
    expect(doc.get("pid") == int(pid), "pid %r, expected %s" % (doc.get("pid"), pid))
    expect(isinstance(doc.get("process"), dict), "no process object")
    pools = doc.get("pools")
    expect(isinstance(pools, list) and len(pools) == 1, "expected one pool")
    if problems:
        print("\n".join(problems))
        return 1
    pool = pools[0]
    stats = pool["stats"]
    regions = pool["regions"]
    expect(stats["live"] == int(live), "live %d, expected %s" % (stats["live"], live))
    expect(len(regions) == int(nregions), "%d regions, expected %s" % (len(regions), nregions))
    sums = {}
    prev_end = None
    for r in regions:
        sums[r["kind"]] = sums.get(r["kind"], 0) + r["size"]
        expect(r["kind"] in ("live", "free", "hole", "zombie"), "bad kind %r" % r["kind"])
        if r["kind"] == "free":
            expect("stream" in r and "settled" in r, "free region without stream/settled")
        if prev_end is not None and r["chunk"] == prev_chunk:
            expect(r["va"] == prev_end, "regions not contiguous at %#x" % r["va"])
        prev_end, prev_chunk = r["va"] + r["size"], r["chunk"]
    for pair in kinds.split(","):
        k, v = pair.split("=")
        expect(sums.get(k, 0) == int(v), "%s sums to %d, expected %s" % (k, sums.get(k, 0), v))
    expect(sums.get("live", 0) == stats["live"], "live regions != live gauge")
    expect(sums.get("free", 0) == stats["reusable"], "free regions != reusable gauge")
    expect(sums.get("hole", 0) == stats["holes"], "hole regions != holes gauge")
    expect(sums.get("zombie", 0) == stats["zombies"], "zombie regions != zombies gauge")
    expect(sum(c["size"] for c in pool["chunks"]) == stats["reserved"], "chunks != reserved")
    split = pool.get("free_split")
    expect(split is not None, "no free_split")
    if split:
        expect(split["whole"] + split["stranded"] == sums.get("free", 0),
               "free_split %d + %d != free regions %d" % (split["whole"], split["stranded"], sums.get("free", 0)))
        expect(split["largest"] == max([r["size"] for r in regions if r["kind"] == "free"] or [0]),
               "free_split largest %d is not the largest free region" % split["largest"])
        expect(split["whole"] % stats["page_size"] == 0 and
               (split["whole_handles"] == 0) == (split["whole"] == 0),
               "free_split whole %d in %d handles" % (split["whole"], split["whole_handles"]))
    for key in ("page_size", "va_size", "handle_size", "limit", "defrag"):
        expect(key in pool["config"], "config lacks %s" % key)
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
