"""torch.cuda.memory's pluggable allocator, as torch 2.x implements it in
Python: the library opened with ctypes.CDLL (RTLD_LOCAL), the two entry
points looked up by name, and change_current_allocator refusing once CUDA
is initialised. Records what it got: `current` and `changes`. The entry
points run with the GIL released (ctypes.CDLL), as PyTorch's operators
release it before they allocate."""
import ctypes

current = None
changes = 0


class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path_to_so_file)
        self.path = path_to_so_file
        self.names = (alloc_fn_name, free_fn_name)
        self.malloc = getattr(lib, alloc_fn_name)
        self.malloc.restype = ctypes.c_void_p
        self.malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.free = getattr(lib, free_fn_name)
        self.free.restype = None
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]


def change_current_allocator(allocator):
    global current, changes
    from . import is_initialized
    if is_initialized():
        raise RuntimeError("Can't swap an already initialized allocator")
    current = allocator
    changes += 1
