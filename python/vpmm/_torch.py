"""vpmm._torch -- libvpmm.so as PyTorch's CUDA allocator
(torch.cuda.memory.CUDAPluggableAllocator with vpmm_torch_malloc and
vpmm_torch_free). Imports torch only when asked to install it.

PyTorch lets its allocator be replaced only before it initialised CUDA
(the first CUDA tensor, or anything that needs the device); later,
change_current_allocator refuses. enable() checks first and says so."""
from . import _lib

MALLOC = "vpmm_torch_malloc"
FREE = "vpmm_torch_free"

_enabled_path = None


def enabled():
    """The library PyTorch allocates from, if enable() installed it."""
    return _enabled_path


def enable(torch=None):
    """Installs libvpmm.so as PyTorch's CUDA allocator; returns its path.
    Does nothing the second time. Raises VpmmError when torch cannot be
    imported, when PyTorch already initialised CUDA, or when PyTorch refuses
    the allocator."""
    global _enabled_path
    if _enabled_path is not None:
        return _enabled_path
    if torch is None:
        try:
            import torch
        except ImportError as e:
            raise _lib.VpmmError(
                "vpmm.enable() makes the pool PyTorch's allocator, but torch cannot be "
                "imported (%s). For a program without PyTorch, run it with "
                "`python -m vpmm run -- COMMAND` (the library preloaded)." % e) from e
    path = _lib.library_path()
    _lib.handle()  # the library loads and has both entry points
    try:
        initialized = torch.cuda.is_initialized()
        memory = torch.cuda.memory
        make = memory.CUDAPluggableAllocator
        change = memory.change_current_allocator
    except AttributeError as e:
        raise _lib.VpmmError(
            "this torch (%s) has no pluggable CUDA allocator (%s): a build without "
            "CUDA, or older than 2.0" % (getattr(torch, "__version__", "?"), e)) from e
    if initialized:
        raise _lib.VpmmError(
            "too late: PyTorch has already initialised CUDA in this process, and "
            "its allocator cannot be replaced after that. Call vpmm.enable() right "
            "after `import torch`, before the first CUDA tensor or call, or start "
            "the program with `python -m vpmm run -- python ...`.")
    try:
        change(make(path, MALLOC, FREE))
    except (RuntimeError, OSError, AttributeError) as e:
        raise _lib.VpmmError("PyTorch refused libvpmm.so (%s) as its allocator: %s" % (path, e)) from e
    _enabled_path = path
    return path
