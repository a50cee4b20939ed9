#!/usr/bin/env python3
"""check_demo.py — the demo suite: scripts/demo.sh's path without a GPU run
for real (its numbers and its time), the choice between its two paths with
DRY_RUN=1 and stand-ins for nvidia-smi and nvcc, and examples/demo.cu
compiled when nvcc is found (exit 77, a skip, when it is not).

Usage: check_demo.py REPO BUILD (cpu|choice|nvcc)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO, BUILD, PART = sys.argv[1], sys.argv[2], sys.argv[3]
DEMO = os.path.join(REPO, "scripts", "demo.sh")


def gib(text):
    return float(text)


def demo(env, tmp):
    e = {"PATH": os.environ["PATH"], "HOME": tmp, "BUILD": BUILD,
         "OUT": os.path.join(tmp, "out")}
    e.update(env)
    return subprocess.run(["bash", DEMO], env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)


def check_cpu(tmp):
    t0 = time.monotonic()
    r = demo({"VPMM_DEMO": "cpu"}, tmp)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    assert took < 60, "the demo took %.1f s" % took
    out = r.stdout
    num = r"\s+([0-9.]+) GiB"
    d = re.search(r"design: \+10 \+1 -10 \+4 \+11 GiB" + num * 3, out)
    s = re.search(r"LLM serving, (\d+) operations" + num * 3, out)
    a = re.search(r"the same, VPMM_REMAP=always" + num, out)
    assert d and s and a, out
    # The design's story: 16 GiB live, 16 mapped by the pool; a cache keeps
    # 10 + 1 and must add 11: 22.
    assert [gib(x) for x in d.groups()] == [16.0, 16.0, 22.0], d.groups()
    ops = int(s.group(1))
    live, pool, cache = (gib(x) for x in s.groups()[1:])
    always = gib(a.group(1))
    assert live <= always <= pool < cache, (live, always, pool, cache)
    assert "is a model, not a measurement" in out, out
    assert len(out.splitlines()) <= 16, out
    # The figures are vpmm-replay's own.
    csv = os.path.join(tmp, "out", "llm_serving.csv")
    j = subprocess.run([os.path.join(BUILD, "tools", "vpmm-replay"), "--json",
                        "--event-interval-us", "0", csv],
                       stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    import json
    j = json.loads(j)
    assert j["ops"] == ops, (j["ops"], ops)
    assert "%.2f" % (j["peak_mapped_bytes"] / 2**30) == "%.2f" % pool, (j, pool)
    svg = ET.parse(os.path.join(tmp, "out", "llm_serving.svg")).getroot()
    assert svg.tag.endswith("svg"), svg.tag
    print("cpu path: %.1f s\n%s" % (took, out))


def fake(bindir, name, text, status=0):
    path = os.path.join(bindir, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n%sexit %d\n" % ("echo '%s'\n" % text if text else "", status))
    os.chmod(path, 0o755)
    return path


def check_choice(tmp):
    gpu = os.path.join(tmp, "gpu")
    none = os.path.join(tmp, "none")
    os.makedirs(gpu)
    os.makedirs(none)
    fake(gpu, "nvidia-smi", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)")
    fake(none, "nvidia-smi", "No devices were found", 6)
    nvcc = fake(tmp, "nvcc", "")
    path = os.environ["PATH"]
    cases = [
        ({"PATH": gpu + ":" + path, "NVCC": nvcc}, "gpu"),
        ({"PATH": gpu + ":" + path, "NVCC": os.path.join(tmp, "no-nvcc")}, "cpu"),
        ({"PATH": none + ":" + path, "NVCC": nvcc}, "cpu"),
        ({"PATH": none + ":" + path, "NVCC": nvcc, "VPMM_DEMO": "gpu"}, "gpu"),
    ]
    for env, want in cases:
        env["DRY_RUN"] = "1"
        r = demo(env, tmp)
        assert r.returncode == 0, (env, r.stderr)
        assert r.stdout.startswith("demo.sh: the %s path\n" % want), (env, r.stdout)
        cmds = r.stdout.splitlines()[1:]
        assert all(c.startswith("+ ") for c in cmds), r.stdout
        if want == "gpu":
            # built with the fake nvcc, run plainly, then under the preload
            # with vpmm-dump at the end
            assert any(c.startswith("+ %s " % nvcc) and "examples/demo.cu" in c
                       for c in cmds), r.stdout
            runs = [c for c in cmds if c.endswith("/demo")]
            assert len(runs) == 2, r.stdout
            assert "LD_PRELOAD=%s/shim/libvpmm.so" % BUILD in runs[1], runs
            assert "VPMM_DEMO_DUMP=%s/tools/vpmm-dump" % BUILD in runs[1], runs
            assert "LD_PRELOAD" not in runs[0], runs
        else:
            assert any("demo_cpu.py" in c for c in cmds), r.stdout
    r = demo({"VPMM_DEMO": "tpu"}, tmp)
    assert r.returncode == 2 and "expected cpu or gpu" in r.stderr, r.stderr
    r = demo({"VPMM_DEMO": "cpu", "BUILD": os.path.join(tmp, "no-build")}, tmp)
    assert r.returncode == 2 and "is not built" in r.stderr, r.stderr
    print("the paths chosen as they should be")


def check_nvcc(tmp):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.access(nvcc, os.X_OK):
        print("no nvcc: examples/demo.cu not compiled")
        sys.exit(77)
    r = subprocess.run([nvcc, "-O2", "-o", os.path.join(tmp, "demo"),
                        os.path.join(REPO, "examples", "demo.cu"), "-ldl"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    assert r.returncode == 0, r.stdout
    print("examples/demo.cu compiles with %s" % nvcc)


with tempfile.TemporaryDirectory() as tmp:
    {"cpu": check_cpu, "choice": check_choice, "nvcc": check_nvcc}[PART](tmp)
