"""vpmm._lib -- finding and loading libvpmm.so, and its process-level API
(vpmm/vpmm.h) through ctypes. Uses only the standard library; calls
nothing of PyTorch.

The library a process uses must be one: a program started under
LD_PRELOAD (or linked with -lvpmm) already has one in its global scope, and
that one is used, wherever it lies; otherwise the one VPMM_LIBRARY names
(`python -m vpmm run` sets it); otherwise the one bundled in this
package."""
import ctypes
import ctypes.util
import errno
import json
import os

BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libvpmm.so")
LIBRARY_ENV = "VPMM_LIBRARY"


class VpmmError(RuntimeError):
    """What vpmm could not do, and why."""


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _dladdr():
    """dladdr(3): in libc since glibc 2.34, in libdl before."""
    for lib in (None, ctypes.util.find_library("dl")):
        try:
            fn = ctypes.CDLL(lib).dladdr
        except (OSError, AttributeError, TypeError):
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        fn.restype = ctypes.c_int
        return fn
    return None


def loaded_path():
    """The file of the libvpmm.so in this process's global scope (preloaded
    or linked), or None when there is none."""
    try:
        fn = ctypes.CDLL(None).vpmm_shim_stats_json
    except AttributeError:
        return None
    dladdr = _dladdr()
    info = _DlInfo()
    if dladdr is None or not dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)):
        return None
    return os.path.realpath(os.fsdecode(info.dli_fname)) if info.dli_fname else None


def library_path():
    """The libvpmm.so this process uses: the one already in its global
    scope, else the one $VPMM_LIBRARY names, else the one bundled in the
    package."""
    path = loaded_path()
    if path:
        return path
    named = os.environ.get(LIBRARY_ENV)
    if named:
        if not os.path.isfile(named):
            raise VpmmError("%s=%s: no such file" % (LIBRARY_ENV, named))
        return named
    if not os.path.isfile(BUNDLED):
        raise VpmmError("the package's libvpmm.so is missing (%s): reinstall vpmm" % BUNDLED)
    return BUNDLED


_handle = None
_handle_path = None


def handle():
    """The library, loaded with ctypes (the same copy the process already
    has, if any: the loader returns it), its functions typed."""
    global _handle, _handle_path
    path = library_path()
    if _handle is not None and _handle_path == path:
        return _handle
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise VpmmError("cannot load %s: %s" % (path, e)) from e
    sigs = {
        "vpmm_version": (ctypes.c_char_p, []),
        "vpmm_shim_active": (ctypes.c_int, []),
        "vpmm_shim_stats_json": (ctypes.c_long, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
        "vpmm_shim_layout": (ctypes.c_long, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                             ctypes.c_size_t]),
        "vpmm_shim_trim": (ctypes.c_longlong, [ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]),
        "vpmm_shim_hook_calls": (ctypes.c_ulonglong, [ctypes.c_char_p]),
        "vpmm_shim_socket": (ctypes.c_char_p, []),
        "vpmm_torch_malloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
        "vpmm_torch_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                   ctypes.c_void_p]),
    }
    for name, (restype, argtypes) in sigs.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise VpmmError("%s has no %s: it is not a libvpmm.so of this version" % (path, name)) from e
        fn.restype, fn.argtypes = restype, argtypes
    _handle, _handle_path = lib, path
    return lib


def _errno_text(rc):
    return "%s (%s)" % (os.strerror(-rc), errno.errorcode.get(-rc, str(-rc)))


def _text(fn, device, *args):
    """A snprintf-like call of the library: the whole text, or None for
    -ENODEV (no pool on that device)."""
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = fn(device, buf, size, *args)
        if n == -errno.ENODEV:
            return None
        if n < 0:
            raise VpmmError("device %d: %s" % (device, _errno_text(n)))
        if n < size:
            return buf.value.decode()
        size = n + 1 + 1024  # the numbers may grow between two calls


def stats_json(device):
    text = _text(handle().vpmm_shim_stats_json, device)
    return None if text is None else json.loads(text)


def layout(device, unit):
    return _text(handle().vpmm_shim_layout, device, unit)


TRIM_WAIT = 1  # VPMM_TRIM_WAIT


def trim(device, keep, wait):
    n = handle().vpmm_shim_trim(device, keep, TRIM_WAIT if wait else 0)
    if n == -errno.ENODEV:
        return 0
    if n < 0:
        raise VpmmError("trim: %s" % _errno_text(n))
    return n
