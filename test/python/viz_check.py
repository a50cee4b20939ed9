"""viz_check.py -- what pytorch.org/memory_viz (torch/utils/viz/MemoryViz.js)
needs of a memory snapshot to draw it, checked in Python: used by
check_package.py on the stand-ins and by test/gpu/vpmm_package.py with
PyTorch. Raises AssertionError saying what is wrong."""


def _check(cond, what):
    if not cond:
        raise AssertionError(what)


# The pickle opcodes memory_viz's own unpickler reads (protocols 2 to 4):
# any other and it refuses the file.
VIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1",
    "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "EMPTY_LIST", "APPEND", "APPENDS", "LIST",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_DICT", "DICT", "SETITEM",
    "SETITEMS"}


def viz_pickle(data):
    """Checks that memory_viz can unpickle `data` (bytes): protocol 2 to 4,
    and only the opcodes it reads."""
    import pickletools
    ops = set()
    for op, arg, _ in pickletools.genops(data):
        ops.add(op.name)
        if op.name == "PROTO":
            _check(2 <= arg <= 4, "pickle protocol %d: memory_viz reads 2 to 4" % arg)
    _check(ops <= VIZ_OPCODES, "opcodes memory_viz does not read: %s"
           % ", ".join(sorted(ops - VIZ_OPCODES)))


def viz_replay(snap, device):
    """What memory_viz's segment view does with a snapshot, checked: it lays
    the blocks out from each segment's address by their sizes, merges a
    free_requested followed by the free_completed of the same address into
    one free, then steps back from the last event to the first (a free
    brings its block back, an alloc removes it, segment_unmap/segment_free
    bring a segment back, segment_map/segment_alloc remove one), and at
    every step draws each live block inside the segment holding its
    address (a block outside every segment breaks the page)."""
    segs = [(g["address"], g["total_size"]) for g in snap["segments"] if g["device"] == device]
    blocks = {}
    for g in snap["segments"]:
        if g["device"] != device:
            continue
        at = g["address"]
        for b in g["blocks"]:
            _check(b["address"] == at, "block at %#x, laid out at %#x" % (b["address"], at))
            _check(0 <= b["requested_size"] <= b["size"], "requested_size of %r" % b)
            if b["state"] == "active_allocated":
                blocks[at] = b["size"]
            at += b["size"]
        _check(at == g["address"] + g["total_size"], "blocks do not tile %r" % g)
    events = []
    for e in snap["device_traces"][device]:
        _check(all(k in e for k in ("action", "addr", "size", "stream", "frames")),
              "trace entry %r" % e)
        if (e["action"] == "free_completed" and events and
                events[-1]["action"] == "free_requested" and events[-1]["addr"] == e["addr"]):
            events[-1] = dict(events[-1], action="free")
            continue
        events.append(e)
    _check(not any(e["action"] == "free_requested" for e in events),
          "a free_requested without its free_completed")

    def drawable(when):
        for addr in blocks:
            _check(any(a <= addr < a + n for a, n in segs),
                  "block %#x lies in no segment %s" % (addr, when))

    for i in range(len(events) - 1, -1, -1):
        drawable("at event %d" % (i + 1))
        e = events[i]
        if e["action"] == "free":
            blocks[e["addr"]] = e["size"]
        elif e["action"] == "alloc":
            blocks.pop(e["addr"], None)
        elif e["action"] in ("segment_unmap", "segment_free"):
            segs.append((e["addr"], e["size"]))
        elif e["action"] in ("segment_map", "segment_alloc"):
            segs.remove((e["addr"], e["size"]))
    drawable("before the first event")
