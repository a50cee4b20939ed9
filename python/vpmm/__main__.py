"""python -m vpmm -- running a program with the pool.

    python -m vpmm run [--no-preload] [--no-torch] [--] COMMAND [ARGS...]
    python -m vpmm version

`run` replaces itself with COMMAND (the exit status is COMMAND's) in an
environment where:
  - LD_PRELOAD starts with the package's libvpmm.so, so that every CUDA
    program, Python or not, allocates from the pool (--no-preload: not);
  - PYTHONPATH starts with the package's _startup folder, whose
    sitecustomize.py makes the pool PyTorch's allocator as soon as a Python
    program imports torch (--no-torch: not), then runs any other
    sitecustomize it hides;
  - VPMM_LIBRARY names the library, so that the vpmm package in COMMAND
    (that sitecustomize's, or the program's own vpmm.stats() ...) uses the
    same one even without the preload.
Child processes inherit all three. Python started with -S, -I or -E skips
sitecustomize: such a program gets only the preload.
"""
import os
import sys

from . import _lib
from ._version import __version__

STARTUP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_startup")

USAGE = """usage: python -m vpmm run [--no-preload] [--no-torch] [--] COMMAND [ARGS...]
       python -m vpmm version

run: COMMAND with libvpmm.so preloaded (every CUDA allocation from the
     pool) and, in Python programs, the pool made PyTorch's allocator when
     torch is imported.
  --no-preload   no LD_PRELOAD: only PyTorch's allocator
  --no-torch     only the preload (PyTorch keeps its own allocator, which
                 then caches on top of the pool)
version: the package's and the library's versions.
"""


def prepend(env, name, value, sep):
    old = env.get(name, "")
    parts = [p for p in old.split(sep) if p and p != value]
    env[name] = sep.join([value] + parts)


def run_environment(env, preload=True, torch=True, library=None):
    """The environment `run` gives COMMAND (a new dict)."""
    env = dict(env)
    lib = library or _lib.library_path()
    if preload:
        # LD_PRELOAD takes spaces or colons between entries.
        prepend(env, "LD_PRELOAD", lib, ":")
    if torch:
        prepend(env, "PYTHONPATH", STARTUP, os.pathsep)
    env[_lib.LIBRARY_ENV] = lib
    return env


def main(argv):
    if not argv:
        sys.stderr.write(USAGE)
        return 2
    if argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    cmd, args = argv[0], argv[1:]
    if cmd == "version":
        try:
            lib = "libvpmm %s (%s)" % (_lib.handle().vpmm_version().decode(), _lib.library_path())
        except _lib.VpmmError as e:
            lib = "libvpmm: %s" % e
        print("vpmm %s, %s" % (__version__, lib))
        return 0
    if cmd != "run":
        sys.stderr.write("vpmm: unknown command %r\n%s" % (cmd, USAGE))
        return 2
    preload = torch = True
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt == "--":
            break
        if opt == "--no-preload":
            preload = False
        elif opt == "--no-torch":
            torch = False
        else:
            sys.stderr.write("vpmm run: unknown option %r\n%s" % (opt, USAGE))
            return 2
    if not args:
        sys.stderr.write("vpmm run: no command to run\n%s" % USAGE)
        return 2
    try:
        env = run_environment(os.environ, preload, torch)
    except _lib.VpmmError as e:
        sys.stderr.write("vpmm run: %s\n" % e)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args[0], args, env)
    except OSError as e:
        sys.stderr.write("vpmm run: cannot run %s: %s\n" % (args[0], e.strerror or e))
        return 126 if os.path.exists(args[0]) and "/" in args[0] else 127
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
