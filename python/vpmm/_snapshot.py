"""vpmm._snapshot -- the pool's memory as PyTorch's memory snapshot (the
dictionary torch.cuda.memory._snapshot() returns, which
pytorch.org/memory_viz and torch.cuda._memory_viz read), built the way
`vpmm-dump --torch-snapshot` builds it (docs/vpmm-dump.md, "PyTorch
snapshots"): from the `map` reply of this process's own vpmm socket
(shim/protocol.h), so that the region list is copied under the pool's lock
in one step.

Segments are maximal runs of address-contiguous live and free regions of
one VA chunk (holes are unmapped, zombies are a second address of pages
counted where they now are); blocks tile them in address order.

While vpmm.record_history() records (_record), the recorded allocations
add what the pool's map does not have: each live block's Python frames
and the bytes asked for (requested_size); a page carved into small
allocations is split into one block per recorded allocation, the rest of
it staying one block each between them; and device_traces, one list per
device of the recorded events in order ("alloc", then "free_requested"
and "free_completed" for a free: the pool may hand the memory out again on
its stream at once), each with its frames. Memory that the trace used and
that the pool has since unmapped gets one "segment_unmap" at the end of
its device's trace, so that memory_viz, which replays the trace backwards
from the segments, finds a segment under every block. Without recording,
device_traces are empty lists and frames empty, as vpmm-dump writes."""
import bisect
import json
import socket

from . import _lib, _record

PROTOCOL = 1
REPLY_MAX = 256 << 20  # VPMM_REPLY_MAX


def _request(path, request, timeout):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall(("vpmm %d %s\n" % (PROTOCOL, request)).encode())
        data = bytearray()
        while not data.endswith(b"\n"):
            chunk = s.recv(1 << 16)
            if not chunk:
                raise _lib.VpmmError("%s: the reply to %s ended early" % (path, request))
            data += chunk
            if len(data) > REPLY_MAX:
                raise _lib.VpmmError("%s: the reply to %s is too long" % (path, request))
    except OSError as e:
        raise _lib.VpmmError("%s: %s" % (path, e)) from e
    finally:
        s.close()
    reply = json.loads(data.decode())
    if not reply.get("ok"):
        raise _lib.VpmmError("%s: %s" % (path, reply.get("error", "refused")))
    return reply


def _block(va, size, live=True, requested=None, frames=None):
    return {"address": va, "size": size,
            "requested_size": (size if requested is None else requested) if live else 0,
            "state": "active_allocated" if live else "inactive",
            "frames": frames if frames is not None else []}


def _slab_blocks(r, recorded):
    """A live page carved into small allocations: one block per recorded
    allocation in it, and one frameless block for each stretch between."""
    out, at, end = [], r["va"], r["va"] + r["size"]
    i = bisect.bisect_left(recorded[0], at)
    while i < len(recorded[0]) and recorded[0][i] < end:
        va = recorded[0][i]
        _, size, frames = recorded[1][va]
        size = min(max(size, 1), end - va)
        if va > at:
            out.append(_block(at, va - at))
        if va >= at:
            out.append(_block(va, size, requested=size, frames=frames))
            at = va + size
        i += 1
    if at < end:
        out.append(_block(at, end - at))
    return out


def _blocks(r, recorded):
    if r["kind"] != "live":
        return [_block(r["va"], r["size"], live=False)]
    if recorded is None:
        return [_block(r["va"], r["size"])]
    if r.get("small"):
        return _slab_blocks(r, recorded)
    rec = recorded[1].get(r["va"])
    if rec is None:
        return [_block(r["va"], r["size"])]
    return [_block(r["va"], r["size"], requested=min(rec[1], r["size"]), frames=rec[2])]


def _segments(pool, recorded=None):
    """The pool's segments; `recorded`: (sorted addresses, {address:
    (device, size, frames)}) of the recorded live allocations, or None."""
    device = pool["device"]
    segments, run = [], []

    def close():
        if not run:
            return
        live = sum(r["size"] for r in run if r["kind"] == "live")
        blocks = [b for r in run for b in _blocks(r, recorded)]
        requested = sum(b["requested_size"] for b in blocks)
        segments.append({
            "device": device, "address": run[0]["va"],
            "total_size": sum(r["size"] for r in run),
            "allocated_size": live, "active_size": live, "requested_size": requested,
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": True, "frames": [], "blocks": blocks})
        del run[:]

    for r in pool["regions"]:
        mapped = r["kind"] in ("live", "free")
        if run and (not mapped or r["chunk"] != run[-1]["chunk"] or
                    r["va"] != run[-1]["va"] + run[-1]["size"]):
            close()
        if mapped:
            run.append(r)
    close()
    return segments


def _uncovered(spans, segments):
    """The parts of the address ranges `spans` that no segment covers,
    merged and in address order."""
    segs = sorted((g["address"], g["address"] + g["total_size"]) for g in segments)
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    gaps = []
    for a, b in out:
        for sa, sb in segs:
            if sb <= a or sa >= b:
                continue
            if sa > a:
                gaps.append((a, sa))
            a = max(a, sb)
            if a >= b:
                break
        if a < b:
            gaps.append((a, b))
    return gaps


def _traces(trace, segments, ndev):
    """device_traces from the recorded events."""
    traces = [[] for _ in range(ndev)]
    spans = [[] for _ in range(ndev)]
    for kind, device, addr, size, stream, time_us, frames in trace:
        e = {"addr": addr, "size": size, "stream": stream, "time_us": time_us, "frames": frames}
        if kind == "alloc":
            traces[device].append(dict(e, action="alloc"))
        else:
            traces[device].append(dict(e, action="free_requested"))
            traces[device].append(dict(e, action="free_completed"))
        if size:
            spans[device].append((addr, addr + size))
    for device in range(ndev):
        mine = [g for g in segments if g["device"] == device]
        end = traces[device][-1]["time_us"] if traces[device] else 0
        for a, b in _uncovered(spans[device], mine):
            traces[device].append({"action": "segment_unmap", "addr": a, "size": b - a,
                                   "stream": 0, "time_us": end, "frames": []})
    return traces


def snapshot(timeout=10.0):
    """The snapshot of every pool of this process, as a dict."""
    path = _lib.handle().vpmm_shim_socket().decode()
    if not path:
        raise _lib.VpmmError(
            "this process serves no vpmm socket (VPMM_SOCKET=off, or no CUDA call "
            "went through the library yet): the snapshot is read from it")
    pools = _request(path, "map", timeout)["pools"]
    history = _record.read()
    recorded = None
    if history is not None:
        live, trace = history
        recorded = (sorted(live), live)
    segments = []
    for pool in pools:
        segments += _segments(pool, recorded)
    devices = [p["device"] for p in pools]
    if history is None:
        return {"segments": segments,
                "device_traces": [[] for _ in range(max(devices, default=-1) + 1)]}
    ndev = max(devices + [e[1] for e in trace], default=-1) + 1
    return {"segments": segments, "device_traces": _traces(trace, segments, ndev)}
