"""vpmm_probe.py -- what the GPU check scripts read about the process they
run in: libvpmm.so's pool stats and hook counters, through the functions the
shim exports (in the preloaded library, or in one loaded by path, as the
pluggable allocator loads it), and the device memory in use as NVML sees it,
sampled from a thread. Imported by test/gpu/shim_*.py, which run from this
folder."""
import ctypes
import json
import os
import threading
import time


def _export(lib, name):
    """Function `name` of library `lib` (None: the process and its preloads),
    or None when the library or the function is not there."""
    try:
        return getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None


def cuda_pci_bus_id():
    """The PCI bus id of the device CUDA calls 0 in this process (after
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER), from the driver, which makes
    no context for it; None where libcuda cannot say."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, buf = ctypes.c_int(), ctypes.create_string_buffer(64)
        if (cu.cuInit(0) != 0 or cu.cuDeviceGet(ctypes.byref(dev), 0) != 0
                or cu.cuDeviceGetPCIBusId(buf, 64, dev) != 0):
            return None
        return buf.value.decode()
    except (OSError, AttributeError):
        return None


def visible_index():
    """NVML's index of the device CUDA calls 0, by the first entry of
    CUDA_VISIBLE_DEVICES (which is NVML's numbering with
    CUDA_DEVICE_ORDER=PCI_BUS_ID); 0 without one. The fallback where the
    PCI bus id is not to be had."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def nvml_handle(pynvml):
    """pynvml's handle of the device CUDA calls 0 here. NVML numbers GPUs
    by PCI bus whatever CUDA_VISIBLE_DEVICES says: read on another GPU, a
    peak measured whatever ran there."""
    bus = cuda_pci_bus_id()
    if bus:
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception:  # noqa: B902 -- any NVML failure: the fallback
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(visible_index())


def pool_stats(lib=None, device=0):
    """The stats of `device`'s pool as a dict, or None without libvpmm.so or
    without a pool on that device yet."""
    fn = _export(lib, "vpmm_shim_stats_json")
    if fn is None:
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(4096)
    if fn(device, buf, 4096) < 0:
        return None
    return json.loads(buf.value.decode())


def hook_calls(name, lib=None):
    """How often the shim's hook (or counter) `name` ran; None without
    libvpmm.so, or when this libvpmm.so has no such hook."""
    fn = _export(lib, "vpmm_shim_hook_calls")
    if fn is None:
        return None
    fn.restype = ctypes.c_ulonglong
    fn.argtypes = [ctypes.c_char_p]
    n = fn(name.encode())
    return None if n == 2**64 - 1 else n


class NvmlPeak:
    """Device memory in use (NVML), sampled every millisecond from a thread:
    one measure of peak memory for every allocator. peak is above what was in
    use when the object was made (once the context exists)."""

    def __init__(self):
        import pynvml
        pynvml.nvmlInit()
        self.nvml, self.h = pynvml, nvml_handle(pynvml)
        self.base = self.used()
        self.peak, self.stop = 0, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def used(self):
        return self.nvml.nvmlDeviceGetMemoryInfo(self.h).used

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, self.used() - self.base)
            time.sleep(0.001)

    def done(self):
        self.stop = True
        self.t.join()
        return self.peak
