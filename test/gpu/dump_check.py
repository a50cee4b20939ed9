"""dump_check.py -- the pool's invariants that can be seen from outside, on
`vpmm-dump PID --json` documents taken from a running program (the soak,
test/gpu/soak.cu). libvpmm exports no call of vpmm_pool_check(), so this is
the part of it a region map shows (docs/dump-json.md):

  * every chunk is tiled: its regions are contiguous, in ascending order,
    start at the chunk and end at its end, and every region names a chunk;
  * regions are whole grains; holes and zombies are whole pages, at page
    offsets from their chunk's start;
  * the gauges agree with the map: hole regions sum to `holes`, zombie
    regions to `zombies`, chunks to `reserved`, and live + free regions to
    `mapped` = `live` + `reusable` (a sub-grain block freed into a stream's
    cache counts as reusable while its page stays a live region, so live
    regions may exceed `live` by exactly what free regions lack);
  * with --quiet (the document was taken with the program paused and the
    device idle, so no defragmentation or trim had regions in hand): no two
    neighbouring holes, and no two neighbouring free regions the pool would
    have merged (same chunk, not in a stream's cache, and the same stream or
    either one settled).

usage: dump_check.py [--quiet] FILE...
Prints one line per document; exit 0 when every document holds.
"""
import json
import sys


def check(doc, quiet):
    problems = []

    def expect(cond, msg):
        if not cond:
            problems.append(msg)

    pools = doc.get("pools")
    if not isinstance(pools, list) or not pools:
        return ["no pool in the document"], ""
    notes = []
    for pool in pools:
        dev = pool.get("device")
        stats, cfg = pool["stats"], pool["config"]
        page, grain = cfg["page_size"], cfg["grain"]
        chunks = {c["index"]: c for c in pool["chunks"]}
        regions = pool["regions"]
        sums = {"live": 0, "free": 0, "hole": 0, "zombie": 0}
        prev = None
        seen = set()
        for r in regions:
            kind = r["kind"]
            expect(kind in sums, "device %s: region %#x of kind %r" % (dev, r["va"], kind))
            sums[kind] = sums.get(kind, 0) + r["size"]
            c = chunks.get(r["chunk"])
            if c is None:
                problems.append("device %s: region %#x in chunk %s, which is not listed" % (dev, r["va"], r["chunk"]))
                prev = None
                continue
            expect(r["size"] > 0 and r["size"] % grain == 0,
                   "device %s: region %#x size %d not whole grains of %d" % (dev, r["va"], r["size"], grain))
            if kind in ("hole", "zombie"):
                expect((r["va"] - c["va"]) % page == 0 and r["size"] % page == 0,
                       "device %s: %s %#x+%d not whole pages" % (dev, kind, r["va"], r["size"]))
            if prev is None or prev["chunk"] != r["chunk"]:
                if prev is not None:
                    pc = chunks[prev["chunk"]]
                    expect(prev["va"] + prev["size"] == pc["va"] + pc["size"],
                           "device %s: chunk %d not covered to its end" % (dev, prev["chunk"]))
                expect(r["chunk"] not in seen, "device %s: chunk %d in two runs" % (dev, r["chunk"]))
                seen.add(r["chunk"])
                expect(r["va"] == c["va"], "device %s: chunk %d starts at %#x, its first region at %#x"
                       % (dev, r["chunk"], c["va"], r["va"]))
            else:
                expect(r["va"] == prev["va"] + prev["size"],
                       "device %s: gap or overlap at %#x" % (dev, r["va"]))
                if quiet and kind == "hole" and prev["kind"] == "hole":
                    problems.append("device %s: neighbouring holes at %#x" % (dev, r["va"]))
                if (quiet and kind == "free" and prev["kind"] == "free"
                        and not r.get("parked") and not prev.get("parked")
                        and (r["stream"] == prev["stream"] or r["settled"] or prev["settled"])):
                    problems.append("device %s: free neighbours the pool would merge at %#x" % (dev, r["va"]))
            prev = r
        if prev is not None:
            pc = chunks[prev["chunk"]]
            expect(prev["va"] + prev["size"] == pc["va"] + pc["size"],
                   "device %s: chunk %d not covered to its end" % (dev, prev["chunk"]))
        expect(seen == set(chunks), "device %s: chunks %s without regions" % (dev, sorted(set(chunks) - seen)))
        expect(sums["hole"] == stats["holes"], "device %s: holes %d in the map, %d in the stats"
               % (dev, sums["hole"], stats["holes"]))
        expect(sums["zombie"] == stats["zombies"], "device %s: zombies %d in the map, %d in the stats"
               % (dev, sums["zombie"], stats["zombies"]))
        expect(sum(c["size"] for c in pool["chunks"]) == stats["reserved"],
               "device %s: chunks sum to %d, reserved %d" % (dev, sum(c["size"] for c in pool["chunks"]), stats["reserved"]))
        expect(stats["live"] + stats["reusable"] == stats["mapped"], "device %s: live %d + reusable %d != mapped %d"
               % (dev, stats["live"], stats["reusable"], stats["mapped"]))
        expect(sums["live"] + sums["free"] == stats["mapped"], "device %s: live+free regions %d, mapped %d"
               % (dev, sums["live"] + sums["free"], stats["mapped"]))
        expect(sums["live"] >= stats["live"], "device %s: live regions %d < live %d" % (dev, sums["live"], stats["live"]))
        notes.append("device %s: %d regions, mapped %.1f MiB, live %.1f MiB, reusable %.1f MiB (%d parked), "
                     "%d chunk(s), zombies %.1f MiB"
                     % (dev, len(regions), stats["mapped"] / 2**20, stats["live"] / 2**20,
                        stats["reusable"] / 2**20, sum(1 for r in regions if r.get("parked")),
                        len(chunks), stats["zombies"] / 2**20))
    return problems, "; ".join(notes)


def main():
    args = sys.argv[1:]
    quiet = "--quiet" in args
    files = [a for a in args if a != "--quiet"]
    if not files:
        print(__doc__.strip().splitlines()[-2])
        return 2
    bad = 0
    for path in files:
        try:
            with open(path) as f:
                doc = json.load(f)
            problems, note = check(doc, quiet)
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems, note = ["unreadable: %s: %s" % (type(e).__name__, e)], ""
        if problems:
            bad += 1
            print("FAIL %s: %s" % (path, note))
            for p in problems[:20]:
                print("  " + p)
            if len(problems) > 20:
                print("  ... %d more" % (len(problems) - 20))
        else:
            print("ok   %s: %s" % (path, note))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
