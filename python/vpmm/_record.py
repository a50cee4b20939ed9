"""vpmm._record -- the allocation history of vpmm.record_history(): the
Python stack frames of each allocation and free the pool takes, which
snapshot() puts into its blocks and its device_traces.

The recording itself is the extension module _history (C): libvpmm.so
calls it on every allocation and free (vpmm_set_alloc_observer, found in
the library this process uses: _lib.handle()), and it captures the frames
of the allocating thread when that thread holds the GIL. This file only
switches it on and off and reads it."""
import atexit
import ctypes

from . import _lib

DEFAULT_ENTRIES = 100000  # events kept in device_traces (the latest)

_at_exit = False


def _ext():
    try:
        from . import _history
    except ImportError as e:
        raise _lib.VpmmError(
            "this vpmm package has no _history extension module (%s): reinstall it "
            "with `pip install` from a source tree (Python's headers are needed to "
            "build it)" % e) from e
    return _history


def record_history(enabled, max_entries):
    global _at_exit
    if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 0:
        raise ValueError("max_entries must be a whole number of events, 0 or more")
    h = _ext()
    if not enabled:
        h.stop()
        return
    lib = _lib.handle()
    try:
        setter = lib.vpmm_set_alloc_observer
    except AttributeError as e:
        raise _lib.VpmmError(
            "%s has no vpmm_set_alloc_observer: a libvpmm.so older than this package, "
            "which cannot record the history" % _lib.library_path()) from e
    h.attach(ctypes.cast(setter, ctypes.c_void_p).value)
    h.start(max_entries)
    if not _at_exit:
        # before the interpreter goes: frees made after it (PyTorch's
        # static destructors) must not reach a finalised Python
        atexit.register(h.stop)
        _at_exit = True


def recording():
    try:
        from . import _history
    except ImportError:
        return False
    return _history.recording()


def read():
    """(live, trace) as _history.read() gives them, or None when nothing is
    recorded."""
    if not recording():
        return None
    return _ext().read()


def counts():
    """The sizes of the recording's tables: live (recorded allocations
    still live), frames and stacks (distinct ones), trace (events kept),
    dropped (events the trace let go, oldest first), lost (no memory)."""
    return _ext().counts()
