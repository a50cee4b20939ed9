"""vpmm._snapshot -- the pool's memory as PyTorch's memory snapshot (the
dictionary torch.cuda.memory._snapshot() returns, which
pytorch.org/memory_viz and torch.cuda._memory_viz read), built the way
`vpmm-dump --torch-snapshot` builds it (docs/vpmm-dump.md, "PyTorch
snapshots"): from the `map` reply of this process's own vpmm socket
(shim/protocol.h), so that the region list is copied under the pool's lock
in one step.

Segments are maximal runs of address-contiguous live and free regions of
one VA chunk (holes are unmapped, zombies are a second address of pages
counted where they now are); blocks tile them in address order. The
allocation history (device_traces) is left empty: the pool keeps none of
its own, and Python stack frames are not recorded."""
import json
import socket

from . import _lib

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


def _segments(pool):
    device = pool["device"]
    segments, run = [], []

    def close():
        if not run:
            return
        live = sum(r["size"] for r in run if r["kind"] == "live")
        blocks = [{"address": r["va"], "size": r["size"],
                   "requested_size": r["size"] if r["kind"] == "live" else 0,
                   "state": "active_allocated" if r["kind"] == "live" else "inactive",
                   "frames": []} for r in run]
        segments.append({
            "device": device, "address": run[0]["va"],
            "total_size": sum(r["size"] for r in run),
            "allocated_size": live, "active_size": live, "requested_size": live,
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


def snapshot(timeout=10.0):
    """The snapshot of every pool of this process, as a dict."""
    path = _lib.handle().vpmm_shim_socket().decode()
    if not path:
        raise _lib.VpmmError(
            "this process serves no vpmm socket (VPMM_SOCKET=off, or no CUDA call "
            "went through the library yet): the snapshot is read from it")
    pools = _request(path, "map", timeout)["pools"]
    segments = []
    for pool in pools:
        segments += _segments(pool)
    ndev = max([p["device"] for p in pools], default=-1) + 1
    return {"segments": segments, "device_traces": [[] for _ in range(ndev)]}
