#!/usr/bin/env python3
"""demo_cpu.py — the demo without a GPU (scripts/demo.sh runs it): what the
pool maps, replayed by vpmm-replay on its simulated device, against what a
caching allocator would hold, for the design's scenario and a serving-shaped
trace that bench/workloads.py generates.

Owns the demo's output and the caching allocator's model; runs vpmm-replay
and bench/workloads.py. Only the standard library.

Usage: demo_cpu.py --replay PATH --workloads PATH --out DIR
Writes DIR/design.csv, DIR/llm_serving.csv and DIR/llm_serving.svg
(vpmm-replay --plot); prints the comparison.
"""
import argparse
import bisect
import json
import os
import subprocess
import sys

GiB = 1 << 30
SEED = 5


class CachingModel:
    """A model of a caching allocator (PyTorch's, or a pool over cudaMalloc):
    requests rounded to 512 bytes take the best-fitting cached free block,
    split; when none fits, a new segment of the request rounded to 2 MiB is
    cudaMalloc'd. A freed block merges with its free neighbours in its own
    segment only, and no segment is ever given back."""

    def __init__(self):
        self.segments = []   # per segment: sorted [offset, size, free] blocks
        self.free = []       # sorted (size, segment, offset) of free blocks
        self.where = {}      # pointer -> (segment, offset)
        self.mapped = self.peak = 0

    def _block(self, seg, off):
        blocks = self.segments[seg]
        i = bisect.bisect_left(blocks, [off])
        return blocks, i

    def alloc(self, ptr, size):
        size = (size + 511) // 512 * 512
        i = bisect.bisect_left(self.free, (size, -1, -1))
        if i < len(self.free):
            _, seg, off = self.free.pop(i)
        else:
            seg_size = (size + (2 << 20) - 1) // (2 << 20) * (2 << 20)
            seg, off = len(self.segments), 0
            self.segments.append([[0, seg_size, True]])
            self.mapped += seg_size
            self.peak = max(self.peak, self.mapped)
        blocks, k = self._block(seg, off)
        b = blocks[k]
        if b[1] > size:      # split: the rest stays free
            blocks.insert(k + 1, [off + size, b[1] - size, True])
            bisect.insort(self.free, (b[1] - size, seg, off + size))
        b[1], b[2] = size, False
        self.where[ptr] = (seg, off)

    def release(self, ptr):
        seg, off = self.where.pop(ptr)
        blocks, k = self._block(seg, off)
        b = blocks[k]
        b[2] = True
        for j in (k + 1, k - 1):   # merge the right, then the left neighbour
            if 0 <= j < len(blocks) and blocks[j][2]:
                lo, hi = (k, j) if j > k else (j, k)
                self.free.remove((blocks[j][1], seg, blocks[j][0]))
                blocks[lo][1] += blocks[hi][1]
                del blocks[hi]
                k = lo
        bisect.insort(self.free, (blocks[k][1], seg, blocks[k][0]))


def model_peak(csv_path):
    m = CachingModel()
    with open(csv_path) as f:
        next(f)
        for line in f:
            _, _, action, ptr, size, _ = line.strip().split(",")
            if action == "allocate":
                m.alloc(ptr, int(size))
            elif action == "free":
                m.release(ptr)
    return m.peak


def replay(tool, csv_path, *args):
    # An event on every free: the same figures however fast the host runs
    # (the default's 50 us between a stream's events is wall-clock time).
    cmd = [tool, "--json", "--event-interval-us", "0"] + list(args) + [csv_path]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    return json.loads(out)


def design_log(path):
    rows = [("allocate", 1, 10), ("allocate", 2, 1), ("free", 1, 10),
            ("allocate", 3, 4), ("allocate", 4, 11)]
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for i, (action, ptr, gib) in enumerate(rows):
            f.write("1,00:00:00:%06d,%s,0x%x,%d,0x0\n" % (i, action, ptr << 40, gib * GiB))


def gib(n):
    return "%.2f GiB" % (n / GiB)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replay", required=True, help="the built vpmm-replay")
    ap.add_argument("--workloads", required=True, help="bench/workloads.py")
    ap.add_argument("--out", required=True, help="directory for the logs and the plot")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    design = os.path.join(a.out, "design.csv")
    design_log(design)
    subprocess.run([sys.executable, a.workloads, "--out", a.out, "--only", "llm_serving",
                    "--seed", str(SEED)], check=True, stdout=subprocess.DEVNULL)
    serving = os.path.join(a.out, "llm_serving.csv")
    svg = os.path.join(a.out, "llm_serving.svg")

    d = replay(a.replay, design)
    s = replay(a.replay, serving, "--plot", svg)
    s_always = replay(a.replay, serving, "--remap", "always")

    row = "%-31s %11s %14s %15s"
    print("libvpmm demo, no GPU: vpmm-replay runs the pool on a simulated device.\n")
    print(row % ("", "peak live", "libvpmm maps", "caching model"))
    print(row % ("design: +10 +1 -10 +4 +11 GiB", gib(d["peak_requested_bytes"]),
                 gib(d["peak_mapped_bytes"]), gib(model_peak(design))))
    print(row % ("LLM serving, %d operations" % s["ops"],
                 gib(s["peak_requested_bytes"]), gib(s["peak_mapped_bytes"]),
                 gib(model_peak(serving))))
    print((row % ("  the same, VPMM_REMAP=always", "", gib(s_always["peak_mapped_bytes"]),
                  "")).rstrip())
    print("""
In the scenario, +11 GiB finds 6 free GiB in the first 10 GiB block: the
pool maps them next to 5 new ones (%d handles remapped, no copy); a cache
must add 11 GiB. The caching allocator is a model, not a measurement: best
fit among cached blocks, a new cudaMalloc'd segment when none fits, blocks
merge only within their segment, nothing given back. The trace comes from
bench/workloads.py (llm_serving, seed %d); its picture: %s""" % (
        d["handles_remapped"], SEED, svg))


if __name__ == "__main__":
    main()
