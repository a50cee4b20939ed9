#!/usr/bin/env python3
"""workloads.py — deterministic allocation traces for the benchmarks.

Owns: the benchmark's workload generators (LLM serving, training with a new
sequence length every iteration, MoE, scratch on several streams, the
laboratory cases) and writing them as RMM-style CSV logs
(`Thread,Time,Action,Pointer,Size,Stream`, actions `allocate`/`free`,
pointers and streams in hex (0x...), time as HH:MM:SS:micro) that
tools/vpmm-replay and bench/replay_gpu.py read.

Only the standard library: the generators run on any machine. Every workload
draws from its own random.Random seeded from (seed, name), so adding one
workload never changes another's trace. Pointers are synthetic and never
reused; a replayer maps them to what its allocator returns.

Usage: workloads.py --out DIR [--seed N] [--only NAME,...] [--lab-scale K] [--list]
Writes DIR/NAME.csv per workload and DIR/index.json with ops, allocations,
peak live bytes and the largest request of each. --lab-scale K multiplies
every size of the laboratory cases by K (default 1; bench/pressure.py uses 4,
so that a fixed allowance of a few MiB does not dwarf a 64 MiB case).
"""
import argparse
import json
import math
import os
import random
import sys

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# Every workload's peak live bytes stays under this, so that the worst
# allocator seen (PyTorch native, up to 2.64x) still fits a 78 GiB card.
PEAK_BUDGET = 20 * GiB


class Trace:
    """An allocation trace being built: live set, peak, synthetic pointers."""

    def __init__(self, name):
        self.name = name
        self.rows = []          # (action, ptr, size, stream)
        self.live = {}          # ptr -> (size, stream)
        self.live_bytes = 0
        self.peak = 0
        self.allocs = 0
        self.largest = 0
        self._next_ptr = 0x7F0000000000

    def alloc(self, size, stream=0):
        size = int(size)
        if size <= 0:
            raise ValueError("%s: allocation of %d bytes" % (self.name, size))
        ptr = self._next_ptr
        # 512-byte spacing like cudaMalloc's alignment; never reused.
        self._next_ptr += (size + 511) // 512 * 512
        self.rows.append(("allocate", ptr, size, stream))
        self.live[ptr] = (size, stream)
        self.live_bytes += size
        self.allocs += 1
        self.largest = max(self.largest, size)
        self.peak = max(self.peak, self.live_bytes)
        return ptr

    def free(self, ptr):
        size, stream = self.live.pop(ptr)
        self.live_bytes -= size
        self.rows.append(("free", ptr, size, stream))

    def free_all(self, ptrs):
        for p in ptrs:
            self.free(p)

    def finish(self):
        """Free whatever is still live (newest first), so every trace ends empty."""
        for ptr in sorted(self.live, reverse=True):
            self.free(ptr)

    def write(self, path):
        with open(path, "w") as f:
            f.write("Thread,Time,Action,Pointer,Size,Stream\n")
            for i, (act, ptr, size, stream) in enumerate(self.rows):
                # A synthetic clock: one microsecond per event.
                us = i
                s, us = divmod(us, 1000000)
                m, s = divmod(s, 60)
                h, m = divmod(m, 60)
                f.write("1,%02d:%02d:%02d:%06d,%s,0x%x,%d,0x%x\n"
                        % (h, m, s, us, act, ptr, size, stream))

    def summary(self):
        return {
            "ops": len(self.rows),
            "allocs": self.allocs,
            "peak_live": self.peak,
            "largest": self.largest,
            "streams": sorted({r[3] for r in self.rows}),
        }


def rng_for(seed, name):
    return random.Random("%d:%s" % (seed, name))


def loguniform(rng, lo, hi):
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


# ---- LLM serving -----------------------------------------------------------

def llm_serving(seed):
    """A decoder serving requests: weights once; per request one KV tensor
    sized by its prompt (256-32k tokens, log-uniform), held for a random
    number of steps; per step the activations of the prefill batch, sized by
    its longest prompt (padded batch), allocated and freed layer by layer;
    small decode-step buffers for the running batch."""
    rng = rng_for(seed, "llm_serving")
    t = Trace("llm_serving")
    hidden, inter, layers, vocab = 2048, 5632, 22, 32000
    kv_per_token = layers * 2 * 512 * 2    # GQA: 4 KV heads of 128, fp16

    # Weights: per layer q/k/v/o, gate/up/down, two norms; embedding, head.
    weights = [t.alloc(vocab * hidden * 2)]
    for _ in range(layers):
        weights.append(t.alloc(hidden * 4))            # norm (8 KiB)
        weights.append(t.alloc(hidden * hidden * 2))   # q
        weights.append(t.alloc(hidden * 512 * 2))      # k
        weights.append(t.alloc(hidden * 512 * 2))      # v
        weights.append(t.alloc(hidden * hidden * 2))   # o
        weights.append(t.alloc(hidden * 4))            # norm
        for _ in range(3):
            weights.append(t.alloc(hidden * inter * 2))
    weights.append(t.alloc(vocab * hidden * 2))

    running = []        # [kv_ptr, steps_left]
    kv_budget = 9 * GiB
    kv_live = 0
    for step in range(250):
        # Requests finish.
        still = []
        for r in running:
            r[1] -= 1
            if r[1] <= 0:
                t.free(r[0])
                kv_live -= r[2]
            else:
                still.append(r)
        running = still
        # Admit 0-3 new requests while the KV budget allows.
        prompts = []
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            n = loguniform(rng, 256, 32768)
            if kv_live + n * kv_per_token > kv_budget:
                break
            prompts.append(n)
        new_kv = []
        for n in prompts:
            size = n * kv_per_token
            kv = t.alloc(size)
            kv_live += size
            new_kv.append([kv, rng.randint(4, 120), size])
        if prompts:
            # Prefill, padded to the longest prompt in the batch: per layer
            # the norm output, qkv, attention output, MLP gate/up/act, down.
            tokens = len(prompts) * max(prompts)
            resid = t.alloc(tokens * hidden * 2)
            for _ in range(layers // 2):     # half the layers keep ops modest
                x = t.alloc(tokens * hidden * 2)
                qkv = t.alloc(tokens * (hidden + 1024) * 2)
                t.free(x)
                att = t.alloc(tokens * hidden * 2)
                t.free(qkv)
                o = t.alloc(tokens * hidden * 2)
                t.free(att)
                t.free(o)
                x = t.alloc(tokens * hidden * 2)
                g = t.alloc(tokens * inter * 2)
                u = t.alloc(tokens * inter * 2)
                t.free(x)
                a = t.alloc(tokens * inter * 2)
                t.free(g)
                t.free(u)
                d = t.alloc(tokens * hidden * 2)
                t.free(a)
                t.free(d)
            logits = t.alloc(len(prompts) * vocab * 4)
            t.free(resid)
            t.free(logits)
        running.extend(new_kv)
        if running:
            # Decode step for the running batch: small buffers (< 2 MiB).
            b = len(running)
            bufs = [t.alloc(b * hidden * 2), t.alloc(b * (hidden + 1024) * 2),
                    t.alloc(b * inter * 2), t.alloc(b * vocab * 4),
                    t.alloc(b * 8)]
            for p in reversed(bufs):
                t.free(p)
    t.finish()
    return t


# ---- training with a new sequence length every iteration -----------------------

def training_varlen(seed):
    """Training of a small transformer: weights, gradients and Adam states
    persistent (gradients allocated during the first backward); each
    iteration a new sequence length; activations saved in forward order and
    freed in backward order while gradient temporaries come and go."""
    rng = rng_for(seed, "training_varlen")
    t = Trace("training_varlen")
    hidden, inter, layers, vocab = 2048, 5632, 10, 32000
    shapes = [vocab * hidden]
    for _ in range(layers):
        shapes += [hidden, hidden * hidden * 3, hidden * hidden, hidden,
                   hidden * inter, hidden * inter, inter * hidden]
    weights = [t.alloc(n * 2) for n in shapes]                 # bf16
    adam = [t.alloc(n * 4) for n in shapes for _ in range(2)]  # fp32 m, v
    grads = None
    for it in range(40):
        batch = rng.choice((1, 2, 4))
        seqlen = rng.choice((512, 1024, 1536, 2048, 3072, 4096))
        tok = batch * seqlen
        emb = t.alloc(tok * hidden * 2)
        saved = [emb]
        for _ in range(layers):
            x = t.alloc(tok * hidden * 2)          # norm out (saved)
            qkv = t.alloc(tok * hidden * 3 * 2)    # saved
            att = t.alloc(tok * hidden * 2)        # saved
            lse = t.alloc(batch * 16 * seqlen * 4)  # softmax stats (small)
            o = t.alloc(tok * hidden * 2)          # residual add
            x2 = t.alloc(tok * hidden * 2)         # saved
            g = t.alloc(tok * inter * 2)           # saved
            u = t.alloc(tok * inter * 2)           # saved
            a = t.alloc(tok * inter * 2)           # saved
            d = t.alloc(tok * hidden * 2)
            saved += [x, qkv, att, lse, o, x2, g, u, a, d]
        logits = t.alloc(tok * vocab * 2)
        loss = t.alloc(4)
        # Backward.
        dlogits = t.alloc(tok * vocab * 2)
        t.free(loss)
        t.free(logits)
        if grads is None:
            grads = []
        gi = 0
        dx = t.alloc(tok * hidden * 2)
        t.free(dlogits)
        for layer in range(layers):
            acts = saved[-10:]
            del saved[-10:]
            # Gradients of the layer's weights, reverse order, kept forever.
            if len(grads) < len(shapes) - 1:
                for n in reversed(shapes[1 + (layers - 1 - layer) * 7:
                                         1 + (layers - layer) * 7]):
                    grads.append(t.alloc(n * 2))
            da = t.alloc(tok * inter * 2)
            dg = t.alloc(tok * inter * 2)
            du = t.alloc(tok * inter * 2)
            t.free(da)
            dx2 = t.alloc(tok * hidden * 2)
            t.free(dg)
            t.free(du)
            for p in reversed(acts[4:]):
                t.free(p)
            datt = t.alloc(tok * hidden * 2)
            dqkv = t.alloc(tok * hidden * 3 * 2)
            t.free(datt)
            ndx = t.alloc(tok * hidden * 2)
            t.free(dqkv)
            t.free(dx2)
            for p in reversed(acts[:4]):
                t.free(p)
            t.free(dx)
            dx = ndx
            gi += 1
        if len(grads) < len(shapes):
            grads.append(t.alloc(shapes[0] * 2))
        t.free(dx)
        t.free(saved.pop())  # embedding output
        assert not saved
        # Optimizer step: a flat fp32 scratch for the update (multi-tensor).
        scratch = t.alloc(sum(shapes) // 8 * 4)
        t.free(scratch)
    t.finish()
    return t


# ---- mixture of experts ---------------------------------------------------------

def moe(seed):
    """MoE layers with 16 experts, top-2 routing: per step and layer each
    expert's input gather, hidden and output buffers are sized by the tokens
    routed to it (random, skewed, different every step); each layer's
    combined output is kept until the end of the step (saved for backward)."""
    rng = rng_for(seed, "moe")
    t = Trace("moe")
    hidden, inter, experts, layers = 2048, 2816, 16, 8
    weights = []
    for _ in range(layers):
        weights.append(t.alloc(hidden * hidden * 4 * 2))     # attention
        weights.append(t.alloc(hidden * experts * 4))        # router (small)
        for _ in range(experts):
            weights.append(t.alloc(hidden * inter * 3 * 2))
    for step in range(24):
        tokens = rng.choice((4096, 8192, 12288, 16384))
        kept = []
        for _ in range(layers):
            x = t.alloc(tokens * hidden * 2)
            scores = t.alloc(tokens * experts * 4)
            idx = t.alloc(tokens * 2 * 8)
            # Skewed routing: Dirichlet-like weights from gamma draws.
            w = [rng.gammavariate(0.6, 1.0) for _ in range(experts)]
            s = sum(w)
            counts = [int(tokens * 2 * v / s) for v in w]
            outs = []
            for e in range(experts):
                n = counts[e]
                if n == 0:
                    continue
                inp = t.alloc(n * hidden * 2)
                h = t.alloc(n * inter * 2 * 2)
                t.free(inp)
                a = t.alloc(n * inter * 2)
                t.free(h)
                outs.append(t.alloc(n * hidden * 2))
                t.free(a)
            y = t.alloc(tokens * hidden * 2)
            for p in outs:
                t.free(p)
            t.free(idx)
            t.free(scores)
            t.free(x)
            kept.append(y)
        for p in reversed(kept):
            t.free(p)
    t.finish()
    return t


# ---- scratch on several streams -------------------------------------------------

def scratch_streams(seed):
    """Four streams (0 = the default stream, 1-3 created ones) interleave
    short-lived scratch buffers (64 KiB - 512 MiB, log-uniform, sometimes
    1 GiB); each lives for a random number of its stream's next operations; a
    few long-lived buffers per stream pin memory between them."""
    rng = rng_for(seed, "scratch_streams")
    t = Trace("scratch_streams")
    nstreams = 4
    queues = {s: [] for s in range(nstreams)}   # [ptr, ops_left]
    budget = 12 * GiB
    for i in range(6000):
        s = rng.randrange(nstreams)
        q = queues[s]
        for e in q:
            e[1] -= 1
        for e in [e for e in q if e[1] <= 0]:
            q.remove(e)
            t.free(e[0])
        if rng.random() < 0.03:
            size = 1 * GiB
        else:
            size = loguniform(rng, 64 * KiB, 512 * MiB)
        while t.live_bytes + size > budget and any(queues.values()):
            # Over budget: the stream with the most live work drains its oldest.
            victim = max(queues, key=lambda k: len(queues[k]))
            t.free(queues[victim].pop(0)[0])
        life = 400 if rng.random() < 0.02 else int(rng.expovariate(1 / 6)) + 1
        q.append([t.alloc(size, s), life])
    t.finish()
    return t


# ---- the laboratory cases -------------------------------------------------------

# Multiplies every size of the laboratory cases (--lab-scale).
LAB_SCALE = 1


def lab_8x16_then_4x32(seed):
    """8 x 16 MiB, free all, then 4 x 32 MiB (native caching: 2.0)."""
    t = Trace("lab_8x16_then_4x32")
    small = [t.alloc(16 * MiB * LAB_SCALE) for _ in range(8)]
    t.free_all(small)
    large = [t.alloc(32 * MiB * LAB_SCALE) for _ in range(4)]
    t.free_all(large)
    return t


def lab_free_0_2_then_32(seed):
    """Four 16 MiB, free #0 and #2, then 32 MiB (every pool seen: 1.5)."""
    t = Trace("lab_free_0_2_then_32")
    p = [t.alloc(16 * MiB * LAB_SCALE) for _ in range(4)]
    t.free(p[0])
    t.free(p[2])
    big = t.alloc(32 * MiB * LAB_SCALE)
    t.free(big)
    t.free(p[1])
    t.free(p[3])
    return t


def lab_10g_pattern(seed):
    """+10G +1G -10G +4G +11G scaled by 1/4 (units of 256 MiB): +2.5G +256M
    -2.5G +1G +2.75G; peak live 4 GiB. Native and expandable: 1.375."""
    t = Trace("lab_10g_pattern")
    u = 256 * MiB * LAB_SCALE
    a = t.alloc(10 * u)
    b = t.alloc(1 * u)
    t.free(a)
    c = t.alloc(4 * u)
    d = t.alloc(11 * u)
    t.free(d)
    t.free(c)
    t.free(b)
    return t


WORKLOADS = {
    "llm_serving": llm_serving,
    "training_varlen": training_varlen,
    "moe": moe,
    "scratch_streams": scratch_streams,
    "lab_8x16_then_4x32": lab_8x16_then_4x32,
    "lab_free_0_2_then_32": lab_free_0_2_then_32,
    "lab_10g_pattern": lab_10g_pattern,
}


def fmt_bytes(n):
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            return "%.2f %s" % (n / div, unit)
    return "%d B" % n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="directory for NAME.csv and index.json")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--lab-scale", type=int, default=1,
                    help="multiply the laboratory cases' sizes by this (1-5)")
    ap.add_argument("--list", action="store_true", help="list the workloads")
    args = ap.parse_args(argv)
    if not 1 <= args.lab_scale <= 5:
        # lab_10g_pattern peaks at 4 GiB x K, under PEAK_BUDGET up to 5.
        ap.error("--lab-scale must be 1-5")
    global LAB_SCALE
    LAB_SCALE = args.lab_scale
    if args.list:
        for name, fn in WORKLOADS.items():
            print("%-22s %s" % (name, fn.__doc__.split("\n")[0]))
        return 0
    if not args.out:
        ap.error("--out is required")
    names = list(WORKLOADS)
    if args.only:
        names = [n for n in args.only.split(",") if n]
        bad = [n for n in names if n not in WORKLOADS]
        if bad:
            ap.error("unknown workload(s): %s" % ", ".join(bad))
    os.makedirs(args.out, exist_ok=True)
    index = {}
    for name in names:
        t = WORKLOADS[name](args.seed)
        if t.live:
            raise AssertionError("%s: trace ends with live allocations" % name)
        if t.peak > PEAK_BUDGET:
            raise AssertionError("%s: peak live %s over the %s budget"
                                 % (name, fmt_bytes(t.peak), fmt_bytes(PEAK_BUDGET)))
        path = os.path.join(args.out, name + ".csv")
        t.write(path)
        info = t.summary()
        info["seed"] = args.seed
        if name.startswith("lab_") and args.lab_scale != 1:
            info["lab_scale"] = args.lab_scale
        info["file"] = name + ".csv"
        info["description"] = " ".join(WORKLOADS[name].__doc__.split())
        index[name] = info
        print("%-22s %7d ops %6d allocs  peak live %10s  largest %10s  streams %s"
              % (name, info["ops"], info["allocs"], fmt_bytes(info["peak_live"]),
                 fmt_bytes(info["largest"]), info["streams"]))
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
