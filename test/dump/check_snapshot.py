"""check_snapshot.py — loads a `vpmm-dump --torch-snapshot` file with Python's
pickle and checks the structure PyTorch's memory visualizer reads.

usage: check_snapshot.py FILE MAPPED LIVE TRACE_ENTRIES
  MAPPED / LIVE: bytes the segments / active blocks must sum to
  TRACE_ENTRIES: entries expected in device_traces[0] (-1: don't check)
Exit 0 when everything holds; otherwise 1 with one line per problem.
"""
import pickle
import pickletools
import sys

# The opcodes the unpickler of PyTorch's memory visualizer (MemoryViz.js)
# implements; a snapshot using any other does not open there.
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE",
    "SETITEM", "SETITEMS", "APPEND", "APPENDS", "DICT", "LIST", "TUPLE", "TUPLE1",
    "TUPLE2", "TUPLE3", "SHORT_BINUNICODE", "BINUNICODE", "BININT", "BININT1",
    "BININT2", "LONG1", "NEWTRUE", "NEWFALSE", "NONE", "BINFLOAT", "MEMOIZE",
    "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
}


def main():
    path, mapped, live, ntrace = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with open(path, "rb") as f:
        raw = f.read()
    problems = []

    def expect(cond, msg):
        if not cond:
            problems.append(msg)

    expect(raw[:2] == b"\x80\x04", "not a protocol 4 pickle")
    used = {op.name for op, _, _ in pickletools.genops(raw)}
    expect(used <= VIEWER_OPCODES, "opcodes the viewer cannot read: %s" % sorted(used - VIEWER_OPCODES))
    snap = pickle.loads(raw)
    expect(isinstance(snap, dict), "not a dict")
    segs = snap.get("segments")
    traces = snap.get("device_traces")
    expect(isinstance(segs, list), "segments is not a list")
    expect(isinstance(traces, list) and all(isinstance(t, list) for t in traces),
           "device_traces is not a list of lists")
    if problems:
        print("\n".join(problems))
        return 1
    total = active = 0
    for s in segs:
        for key, typ in (("device", int), ("address", int), ("total_size", int),
                         ("allocated_size", int), ("active_size", int), ("stream", int),
                         ("segment_type", str), ("blocks", list)):
            expect(isinstance(s.get(key), typ), "segment lacks %s" % key)
        expect(s.get("segment_type") == "large", "segment_type %r" % s.get("segment_type"))
        addr = s["address"]
        seg_active = 0
        for b in s["blocks"]:
            expect(isinstance(b.get("size"), int) and b["size"] > 0, "block without size")
            expect(b.get("state") in ("active_allocated", "inactive"), "state %r" % b.get("state"))
            expect(b.get("address", addr) == addr, "blocks do not tile segment %#x" % s["address"])
            addr += b["size"]
            if b.get("state") == "active_allocated":
                seg_active += b["size"]
        expect(addr == s["address"] + s["total_size"], "blocks do not cover segment %#x" % s["address"])
        expect(seg_active == s["allocated_size"] == s["active_size"], "allocated_size mismatch")
        total += s["total_size"]
        active += seg_active
    expect(total == mapped, "segments sum to %d, expected mapped %d" % (total, mapped))
    expect(active == live, "active blocks sum to %d, expected live %d" % (active, live))
    if ntrace >= 0:
        got = len(traces[0]) if traces else 0
        expect(got == ntrace, "device_traces[0] has %d entries, expected %d" % (got, ntrace))
    for t in traces:
        for e in t:
            expect(e.get("action") in ("alloc", "free_requested", "free_completed", "oom"),
                   "trace action %r" % e.get("action"))
            for key in ("size", "stream"):
                expect(isinstance(e.get(key), int), "trace entry lacks %s" % key)
            # a stream is a cudaStream_t; no stream order is 0
            expect(isinstance(e.get("stream"), int) and 0 <= e["stream"] < 1 << 63,
                   "trace entry's stream %r is no cudaStream_t" % e.get("stream"))
            if e.get("action") != "oom":
                expect(isinstance(e.get("addr"), int), "trace entry lacks addr")
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
