#!/usr/bin/env python3
"""pressure.py — the benchmark replays under memory pressure from a second
process: another process (test/gpu/hold.cu) holds all the device's memory but
what the replay should need, as another job or a KV cache sized from free
memory would, and each replay (bench/replay_gpu.py run, one process each)
completes, fails cleanly as out of memory, or crashes.

Owns: the holder's life (one hold process for a whole command, told how much
to leave before each replay, given back however the command ends), the
order and deadline of the replays, their classification, and the results
JSON. Calls bench/replay_gpu.py (imported for its trace reader and
the replay environments, run as a subprocess for each replay), the hold
program, and bench/pressure_report.py for the table (printed at the end
when there is no --out; pressure_report.py prints it from the JSON).
scripts/gpu-pressure.sh builds what it needs and runs it.

Commands:
  pressure  every workload x allocator twice: alone (the holder holds
            nothing), then with the holder leaving
              MARGIN x peak live + the replay's own set-up + ALLOWANCE
            free; the set-up (context, streams, allocator: replay_gpu's
            setup_used, NVML before the context against NVML before the
            first allocation) is the figure of the same allocator's run
            alone on the same workload.
  soak      margins x VPMM_* settings x allocators x workloads, each run
            under the holder, in a shuffled order (seeded) so that any prefix
            the deadline leaves covers every dimension; the set-up of each
            (allocator, settings) pair is measured first, alone.
  fake-hold a holder without a GPU (the same protocol over a simulated
            device), for checking all this with --fake on any machine.

Outcomes: completed; oom (the replay reported an allocation that failed as
out of memory: replay_gpu's failure "oom"); error (the replay reported any
other failure: a set-up that failed, another error code); crash (a signal,
or an exit status other than replay_gpu's 0 and 1, or no result line); hang
(killed at --timeout). --fake replays with replay_gpu's dry allocator, its
capacity the holder's free memory; --dry-run prints what would run.

An allocator named "base:" followed by a vpmm allocator's name
(base:vpmm_preload) is that allocator with --base-libvpmm, another
revision's library, so that two revisions meet the same pressure in one
command.
"""
import argparse
import ctypes
import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import replay_gpu  # noqa: E402  (same directory)
from pressure_report import (BASE, fmt_bytes, mib, pressure_table, setup_from,  # noqa: E402
                             soak_table, unbased)

REPLAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay_gpu.py")
MiB = 1 << 20
GiB = 1 << 30
NOTHING = 1 << 50           # "leave" that makes the holder hold nothing
WORKLOAD_ORDER = ["llm_serving", "training_varlen", "moe", "scratch_streams",
                  "lab_8x16_then_4x32", "lab_free_0_2_then_32", "lab_10g_pattern"]


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted("signal %d" % signum)


def die_with_parent():
    """In a child before exec: SIGKILL when this process dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def parse_size(s):
    s = str(s).strip()
    mult = {"K": 1 << 10, "M": MiB, "G": GiB, "T": 1 << 40}.get(s[-1:].upper())
    return int(float(s[:-1]) * mult) if mult else int(s)


# ---- the holder -----------------------------------------------------------------


class HolderError(Exception):
    pass


class Holder:
    """The hold process: `leave BYTES` lines in, one `HOLD k=v ...` line out."""

    def __init__(self, cmd, log, dry_run=False):
        self.dry_run = dry_run
        self.cmd = cmd + ["--leave", str(NOTHING), "--parent", str(os.getpid())]
        self.log = log
        self.state = {"held": 0, "free": None, "total": None}
        self.p = None
        self.restarts = []      # why the holder was started again
        if dry_run:
            print("hold: " + " ".join(self.cmd), flush=True)
            return
        self.start()

    def start(self):
        self.buf = b""
        self.p = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, preexec_fn=die_with_parent)
        self.state = self._read(120)

    def _read(self, timeout):
        fd = self.p.stdout.fileno()
        end = time.time() + timeout
        while b"\n" not in self.buf:
            left = end - time.time()
            if left <= 0:
                raise HolderError("no answer from the holder in %d s" % timeout)
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise HolderError("the holder exited (status %s)" % self.p.wait())
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        line = line.decode(errors="replace").strip()
        if not line.startswith("HOLD "):
            raise HolderError("the holder said: %s" % line)
        st = {}
        for kv in line.split()[1:]:
            k, _, v = kv.partition("=")
            st[k] = int(v)
        for k in ("held", "free", "total"):
            if k not in st:
                raise HolderError("the holder's line lacks %s: %s" % (k, line))
        return st

    def leave(self, n):
        """Adjusts the hold to leave n bytes free; the holder's state."""
        n = max(0, int(n))
        if self.dry_run:
            print("hold: leave %d%s" % (n, " (nothing held)" if n >= NOTHING else
                                        " (%s)" % fmt_bytes(n)), flush=True)
            return {"held": 0, "free": n if n < NOTHING else None, "total": None}
        try:
            self.state = self._ask(n)
        except (HolderError, OSError) as e:
            # Once per command: a holder that failed twice stops it.
            if self.restarts:
                raise HolderError("%s (after a restart: %s)" % (e, self.restarts[0]))
            self.restarts.append(str(e))
            print("holder: %s; starting it again" % e, flush=True)
            self.close()
            self.start()
            self.state = self._ask(n)
        return dict(self.state)

    def _ask(self, n):
        if self.p.poll() is not None:
            raise HolderError("the holder exited (status %s)" % self.p.returncode)
        self.p.stdin.write(b"leave %d\n" % n)
        self.p.stdin.flush()
        return self._read(120)

    def close(self):
        p, self.p = self.p, None
        if p is None:
            return
        try:
            if p.poll() is None:
                p.stdin.write(b"quit\n")
                p.stdin.close()
                p.wait(timeout=10)
        except Exception:
            pass
        if p.poll() is None:
            p.kill()
            p.wait()


def cmd_fake_hold(args):
    """The hold protocol over a simulated device of --total bytes with a
    512 MiB context: takes 2 MiB chunks, as hold.cu ends."""
    total = parse_size(args.total)
    ctx = 512 * MiB
    held = [0]

    def adjust(leave):
        room = total - ctx - leave
        held[0] = max(0, room // (2 * MiB) * (2 * MiB))
        free = total - ctx - held[0]
        print("HOLD held=%d free=%d total=%d chunks=%d short=%d settled=1 waited_ms=0"
              % (held[0], free, total, held[0] // (2 * MiB), int(free < leave)), flush=True)

    adjust(parse_size(args.leave))
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("leave "):
            adjust(int(line[6:]))
        elif line == "quit":
            break
        else:
            print("HOLD-ERROR unknown command %r" % line, flush=True)
    return 0


# ---- one replay -----------------------------------------------------------------


class Runner:
    """Runs replays one at a time and classifies them; the current child is
    killed if the command is interrupted."""

    def __init__(self, args, log):
        self.args = args
        self.log = log
        self.child = None
        self.trace_info = {}

    def workload_peak(self, path, max_ops):
        """The peak live bytes of the trace's first max_ops operations."""
        key = (path, max_ops)
        if key not in self.trace_info:
            _, _, peak = replay_gpu.load_trace(path, max_ops)
            self.trace_info[key] = peak
        return self.trace_info[key]

    def command(self, alloc, trace, max_ops, vpmm_env, capacity=None):
        a = self.args
        real = unbased(alloc)
        lib = a.libvpmm if real == alloc else a.base_libvpmm
        cmd = [sys.executable, REPLAY, "run", "--alloc", "dry" if a.fake else real,
               "--trace", trace]
        if max_ops:
            cmd += ["--max-ops", str(max_ops)]
        if lib:
            cmd += ["--libvpmm", lib]
        env = replay_gpu.child_env(real, lib or "")
        env.update(vpmm_env)
        if a.fake:
            for k, v in os.environ.items():
                if k.startswith("VPMM_BENCH_"):
                    env[k] = v
            env.pop("LD_PRELOAD", None)
            if capacity is not None:
                env["VPMM_BENCH_DRY_CAPACITY"] = str(max(1, capacity))
            for spec in a.fake_fault or []:
                who, _, fault = spec.partition(":")
                if who == alloc:
                    env["VPMM_BENCH_DRY_FAULT"] = fault
        shown = ["%s=%s" % (k, env[k]) for k in sorted(env)
                 if (k.startswith("VPMM_") or k in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF"))
                 and os.environ.get(k) != env[k]]
        return cmd, env, " ".join(["env"] + shown + cmd) if shown else " ".join(cmd)

    def run(self, alloc, trace, max_ops, vpmm_env, capacity=None):
        """One replay: a record with outcome, rc, signal, result, stderr."""
        cmd, env, shown = self.command(alloc, trace, max_ops, vpmm_env, capacity)
        rec = {"alloc": alloc, "command": shown}
        if self.args.dry_run:
            print("run:  " + shown, flush=True)
            rec.update(outcome="dry-run", result=None)
            return rec
        t0 = time.time()
        timed_out = False
        self.child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, preexec_fn=die_with_parent)
        try:
            out, err = self.child.communicate(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.child.kill()
            out, err = self.child.communicate()
        finally:
            if self.child.poll() is None:
                self.child.kill()
                self.child.wait()
        rc = self.child.returncode
        self.child = None
        out = out.decode(errors="replace")
        err = err.decode(errors="replace")
        res = None
        for line in out.splitlines():
            if line.startswith("RESULT "):
                try:
                    res = json.loads(line[7:])
                except ValueError:
                    pass
        outcome, why = classify(alloc, rc, res, err, timed_out)
        rec.update(outcome=outcome, why=why, rc=rc, process_s=round(time.time() - t0, 3),
                   signal=signal_name(-rc) if rc < 0 else None, result=res)
        if res:
            res.pop("pool_stats", None)   # large; the counters stay
        if outcome != "completed":
            rec["stderr_tail"] = err.strip().splitlines()[-15:]
            rec["stdout_tail"] = [line for line in out.strip().splitlines()
                                  if not line.startswith("RESULT ")][-5:]
        # The log keeps what the JSON does not: the output around the result
        # (which is cut short here) and the last 200 lines of stderr.
        out_lines = [line[:300] + ("..." if len(line) > 300 else "")
                     for line in out.rstrip().splitlines()]
        self.log.write("== %s\n   rc %s, %s (%s), %.1f s\n%s\n%s\n" % (
            shown, rc, outcome, why, rec["process_s"], "\n".join(out_lines),
            "\n".join(err.rstrip().splitlines()[-200:])))
        self.log.flush()
        return rec

    def kill_child(self):
        c, self.child = self.child, None
        if c is not None and c.poll() is None:
            c.kill()
            c.wait()


def signal_name(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return "signal %d" % n


def classify(alloc, rc, res, stderr, timed_out):
    """(outcome, why) of one replay process."""
    if timed_out:
        return "hang", "killed after the time limit"
    if rc < 0:
        return "crash", signal_name(-rc) + (" after its result" if res else "")
    if res is None:
        return "crash", "exit status %d without a result" % rc
    if res.get("ok"):
        if rc == 0:
            return "completed", ""
        return "crash", "exit status %d after a completed replay" % rc
    if rc != 1:
        return "crash", "exit status %d: %s" % (rc, res.get("error"))
    if res.get("failure") == "oom":
        # The pluggable entry point returns NULL for every failure and logs
        # the ones that are not out of memory.
        if alloc.startswith("vpmm_torch") and "CUresult" in stderr:
            return "error", "NULL with a CUresult on stderr: %s" % res.get("error")
        return "oom", res.get("error") or ""
    return "error", res.get("error") or "no error text"


# ---- shared by both commands -------------------------------------------------------


def known_alloc(a):
    """replay_gpu's allocators, and base: before a vpmm one."""
    if a.startswith(BASE):
        return unbased(a) in replay_gpu.VPMM_ALLOCATORS
    return a in replay_gpu.ALLOCATORS


def load_index(args):
    with open(os.path.join(args.workloads, "index.json")) as f:
        index = json.load(f)
    names = [w for w in WORKLOAD_ORDER if w in index] + \
        [w for w in index if w not in WORKLOAD_ORDER]
    if args.only:
        want = [w for w in args.only.split(",") if w]
        bad = [w for w in want if w not in index]
        if bad:
            raise SystemExit("pressure.py: unknown workload(s): %s" % ", ".join(bad))
        names = [w for w in names if w in want]
    return index, names


def header(args, mode):
    return {"mode": mode, "device": args.device or replay_gpu.device_name(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "rev": args.rev, "seed": args.seed, "fake": bool(args.fake),
            "allowance": parse_size(args.allowance), "timeout": args.timeout,
            "deadline": args.deadline}


def save(path, doc):
    if not path:
        return
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def vpmm_sets(text):
    """'default;VPMM_A=1;VPMM_B=0,VPMM_C=2M' -> [(label, {env})]."""
    out = []
    for item in [x.strip() for x in text.split(";") if x.strip()]:
        env = {}
        if item != "default":
            for kv in item.split(","):
                k, eq, v = kv.strip().partition("=")
                if not eq or not k.startswith("VPMM_"):
                    raise SystemExit("pressure.py: %r is not VPMM_NAME=VALUE" % kv)
                env[k] = v
        out.append((item, env))
    return out


def finish(args, doc, start, body, table):
    """Runs body under the holder, records in doc how it ended, saves doc
    and prints table(doc) where no output file was named; the exit status."""
    try:
        run_with_holder(args, body)
    except (Interrupted, HolderError) as e:
        doc["stopped"] = str(e)
        print("stopped: %s" % e, flush=True)
    doc["elapsed_s"] = round(time.time() - start, 1)
    doc["holder_restarts"] = getattr(args, "holder_restarts", [])
    save(args.out, doc)
    if not args.dry_run and not args.out:
        print(table(doc))
    return 0 if "stopped" not in doc else 1


def run_with_holder(args, body):
    """Starts the holder, runs body(holder, runner), gives the holder back
    however body ends (a signal included); returns body's value."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    log = open(args.log, "a") if args.log else open(os.devnull, "w")
    holder = runner = None
    try:
        hold_cmd = ([sys.executable, os.path.abspath(__file__), "fake-hold"] if args.fake
                    else [args.hold])
        holder = Holder(hold_cmd, log, args.dry_run)
        if args.pid_file and holder.p:
            with open(args.pid_file, "w") as f:
                f.write("%d\n" % holder.p.pid)
        runner = Runner(args, log)
        return body(holder, runner)
    finally:
        # A second signal must not stop the cleaning up.
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        if runner:
            runner.kill_child()
        if holder:
            holder.close()
            args.holder_restarts = holder.restarts
        if args.pid_file and os.path.exists(args.pid_file):
            os.unlink(args.pid_file)
        log.close()


def under_pressure(args, holder, runner, rec, alloc, trace, max_ops, vpmm_env,
                   peak_live, margin, setup):
    """One replay with the holder leaving margin x peak_live + setup +
    allowance; fills rec."""
    allowance = parse_size(args.allowance)
    leave = int(math.ceil(margin * peak_live)) + setup + allowance
    st = holder.leave(leave)
    rec.update(margin=margin, leave=leave, setup_assumed=setup, holder=st)
    r = runner.run(alloc, trace, max_ops, vpmm_env,
                   capacity=(st["free"] if args.fake and st.get("free") is not None else None))
    rec.update(r)
    res = r.get("result") or {}
    if st.get("free") is not None and res.get("setup_used") is not None and peak_live:
        # What the replay really had beside its own set-up, over its peak.
        rec["effective_margin"] = round((st["free"] - res["setup_used"]) / peak_live, 4)
    return rec


# ---- pressure ----------------------------------------------------------------------------


def cmd_pressure(args):
    index, names = load_index(args)
    allocs = [a for a in args.allocs.split(",") if a]
    bad = [a for a in allocs if not known_alloc(a)]
    if bad:
        raise SystemExit("pressure.py: unknown allocator(s): %s" % ", ".join(bad))
    # The CUDA pool alone first: the time every ratio divides by.
    allocs.sort(key=lambda a: a != "cuda_pool")
    doc = header(args, "pressure")
    doc.update(margin=args.margin, allocs=allocs, workloads=names, max_ops=args.max_ops,
               index={w: index[w] for w in names}, runs=[])
    start = time.time()

    def body(holder, runner):
        doc["holder_start"] = holder.state
        for w in names:
            trace = os.path.join(args.workloads, index[w]["file"])
            peak_live = runner.workload_peak(trace, args.max_ops) if args.max_ops \
                else index[w]["peak_live"]
            alone = {}
            for alloc in allocs:
                for phase in ("alone", "pressure"):
                    rec = {"workload": w, "alloc": alloc, "phase": phase,
                           "peak_live": peak_live}
                    doc["runs"].append(rec)
                    if args.deadline and time.time() - start > args.deadline:
                        rec.update(outcome="not run", why="past the %d s deadline"
                                   % args.deadline)
                        continue
                    if phase == "alone":
                        rec["holder"] = holder.leave(NOTHING)
                        rec.update(runner.run(alloc, trace, args.max_ops, {}))
                        alone[alloc] = rec
                    else:
                        setup = setup_of(alone.get(alloc), doc["runs"], alloc, args)
                        if setup is None:
                            rec.update(outcome="not run",
                                       why="no set-up figure (its run alone failed)")
                            continue
                        under_pressure(args, holder, runner, rec, alloc, trace,
                                       args.max_ops, {}, peak_live, args.margin, setup)
                    say(rec)
                    save(args.out, doc)
        holder.leave(NOTHING)
        return doc

    return finish(args, doc, start, body, pressure_table)


def setup_of(alone, runs, alloc, args):
    """The set-up bytes of a replay process of this allocator: its run alone
    on this workload, else the largest of its other runs alone."""
    if args.dry_run:
        return 0
    v = setup_from(alone)
    if v is not None:
        return v
    others = [setup_from(r) for r in runs if r.get("alloc") == alloc and
              r.get("phase") == "alone"]
    others = [x for x in others if x is not None]
    return max(others) if others else None


def say(rec):
    res = rec.get("result") or {}
    extra = ""
    if rec.get("phase") == "pressure" or "margin" in rec:
        st = rec.get("holder") or {}
        extra = "  leave %s MiB (set-up %s), held %s MiB, free %s MiB%s" % (
            mib(rec.get("leave")), mib(rec.get("setup_assumed")), mib(st.get("held")),
            mib(st.get("free")), "" if st.get("settled", 1) else " (not settled)")
        if rec.get("effective_margin") is not None:
            extra += ", effective margin %.3f" % rec["effective_margin"]
    t = " calls %.3f s" % res["call_s"] if res.get("call_s") is not None and \
        rec.get("outcome") == "completed" else ""
    print("%-21s %-17s %-8s %-9s%s %s%s" % (
        rec.get("workload"), rec.get("alloc"), rec.get("phase") or rec.get("vpmm_env", ""),
        rec.get("outcome"), t, (rec.get("why") or "")[:120], extra), flush=True)


# ---- soak ------------------------------------------------------------------------------------


def cmd_soak(args):
    index, names = load_index(args)
    allocs = [a for a in args.allocs.split(",") if a]
    bad = [a for a in allocs if not known_alloc(a)]
    if bad:
        raise SystemExit("pressure.py: unknown allocator(s): %s" % ", ".join(bad))
    margins = [float(m) for m in args.margins.split(",") if m]
    sets = vpmm_sets(args.vpmm_sets)
    combos = [(m, w, s, a) for m in margins for w in names for s in range(len(sets))
              for a in allocs]
    random.Random(args.seed).shuffle(combos)
    doc = header(args, "soak")
    doc.update(margins=margins, allocs=allocs, workloads=names, max_ops=args.max_ops,
               vpmm_sets=[label for label, _ in sets], planned=len(combos),
               index={w: index[w] for w in names}, calibration=[], runs=[])
    start = time.time()
    # The set-up is measured on the workload with the most streams (each
    # stream is made before the baseline), its first operations only.
    calib = max(names, key=lambda w: (len(index[w].get("streams", [0])), -names.index(w)))

    def body(holder, runner):
        doc["holder_start"] = holder.state
        setup = {}
        holder.leave(NOTHING)
        trace = os.path.join(args.workloads, index[calib]["file"])
        for a in allocs:
            for i, (label, env) in enumerate(sets):
                r = runner.run(a, trace, 16, env)
                r.update(workload=calib, vpmm_env=label, phase="set-up")
                doc["calibration"].append(r)
                setup[(a, i)] = 0 if args.dry_run else setup_from(r)
                say(r)
        save(args.out, doc)
        for n, (margin, w, si, a) in enumerate(combos):
            if args.deadline and time.time() - start > args.deadline:
                doc["not_run"] = len(combos) - n
                print("deadline: %d of %d runs not started" % (len(combos) - n, len(combos)),
                      flush=True)
                break
            label, env = sets[si]
            trace = os.path.join(args.workloads, index[w]["file"])
            peak = runner.workload_peak(trace, args.max_ops)
            rec = {"workload": w, "alloc": a, "vpmm_env": label, "margin": margin,
                   "peak_live": peak}
            doc["runs"].append(rec)
            s = setup.get((a, si))
            if s is None:
                rec.update(outcome="not run", why="no set-up figure (its run alone failed)")
                continue
            under_pressure(args, holder, runner, rec, a, trace, args.max_ops, env,
                           peak, margin, s)
            say(rec)
            if rec.get("outcome") in ("error", "crash", "hang") and args.crash_log:
                with open(args.crash_log, "a") as f:
                    f.write(crash_text(rec, args))
            save(args.out, doc)
        holder.leave(NOTHING)
        return doc

    return finish(args, doc, start, body, soak_table)


def crash_text(rec, args):
    st = rec.get("holder") or {}
    lines = ["== %s: %s %s, %s, margin %.2f: %s (%s)" % (
        rec.get("outcome"), rec.get("workload"), rec.get("alloc"), rec.get("vpmm_env"),
        rec.get("margin", 0), rec.get("why"), "rc %s" % rec.get("rc")),
        "   holder: leave %s, held %s, free %s (bytes); settled %s" % (
            rec.get("leave"), st.get("held"), st.get("free"), st.get("settled")),
        "   again: %s --leave %s --sleep & then: %s" % (
            args.hold, rec.get("leave"), rec.get("command")),
        "   stderr, last lines:"]
    lines += ["   | " + x for x in rec.get("stderr_tail") or []]
    return "\n".join(lines) + "\n"


# ---- command line ------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, allocs, deadline, timeout, max_ops):
        p.add_argument("--workloads", required=True, help="directory written by workloads.py")
        p.add_argument("--hold", default="hold", help="the hold program (test/gpu/hold.cu)")
        p.add_argument("--out", help="results JSON (rewritten as runs finish)")
        p.add_argument("--log", help="every replay's output is appended here")
        p.add_argument("--libvpmm", help="libvpmm.so, for the vpmm allocators")
        p.add_argument("--base-libvpmm", help="another revision's libvpmm.so, for the "
                       "allocators named base:vpmm_...")
        p.add_argument("--allocs", default=allocs, help="comma-separated (default %(default)s)")
        p.add_argument("--only", help="comma-separated workloads (default: all)")
        p.add_argument("--allowance", default="16M",
                       help="bytes left beyond margin x live + set-up (default %(default)s)")
        p.add_argument("--deadline", type=int, default=deadline,
                       help="seconds after which no run starts (0: none; default %(default)s)")
        p.add_argument("--timeout", type=int, default=timeout,
                       help="seconds a replay may take (default %(default)s)")
        p.add_argument("--max-ops", type=int, default=max_ops,
                       help="replay each trace's first N operations (0: all)")
        p.add_argument("--seed", type=int, default=11,
                       help="the workloads' seed, for the record; soak: the order's too")
        p.add_argument("--device", help="the card's name (default: nvidia-smi's)")
        p.add_argument("--rev", help="the tree's revision, for the title")
        p.add_argument("--pid-file", help="the holder's process id is written here")
        p.add_argument("--dry-run", action="store_true", help="print what would run")
        p.add_argument("--fake", action="store_true",
                       help="no GPU: dry replays under the simulated holder (tests)")
        p.add_argument("--fake-fault", action="append", metavar="ALLOC:KIND:N",
                       help="--fake: VPMM_BENCH_DRY_FAULT=KIND:N for ALLOC's replays")

    p = sub.add_parser("pressure", help="each workload x allocator alone and under pressure")
    common(p, "cuda_pool,torch_native,torch_expandable,vpmm_torch,vpmm_preload", 220, 60, 0)
    p.add_argument("--margin", type=float, default=1.02,
                   help="the holder leaves this x peak live (+ set-up, allowance)")
    s = sub.add_parser("soak", help="margins x VPMM settings x allocators x workloads")
    common(s, "vpmm_preload,vpmm_torch", 200, 30, 2000)
    s.add_argument("--margins", default="1.00,1.01,1.02,1.05,1.10")
    s.add_argument("--vpmm-sets", default="default;VPMM_GROWTH_SPLIT=1;"
                   "VPMM_GROWTH_SPLIT=0,VPMM_HANDLE_SIZE=2M;VPMM_REMAP=always",
                   help="';'-separated sets of ','-separated VPMM_NAME=VALUE ('default': none)")
    s.add_argument("--crash-log", help="details of every error, crash and hang")
    f = sub.add_parser("fake-hold", help="the hold protocol without a GPU (tests)")
    f.add_argument("--leave", required=True)
    f.add_argument("--total", default="80G")
    f.add_argument("--parent", type=int)
    args = ap.parse_args(argv)
    if args.cmd == "fake-hold":
        return cmd_fake_hold(args)
    for a in (args.allocs or "").split(","):
        base = a.startswith(BASE)
        lib = args.base_libvpmm if base else args.libvpmm
        if (base or a.startswith("vpmm")) and not args.fake and not args.dry_run and \
                not (lib and os.path.exists(lib)):
            ap.error("%s needs %s PATH (an existing libvpmm.so)"
                     % (a, "--base-libvpmm" if base else "--libvpmm"))
    if not args.fake and not args.dry_run and not os.access(args.hold, os.X_OK):
        ap.error("--hold %s: not an executable" % args.hold)
    return cmd_pressure(args) if args.cmd == "pressure" else cmd_soak(args)


if __name__ == "__main__":
    sys.exit(main())
