"""sitecustomize for `python -m vpmm run` (the only file of the folder it
puts first on PYTHONPATH). In a Python program started that way:

  - when the program imports torch, right after torch's own import and
    before it can touch CUDA, libvpmm.so (the preloaded one, else the one
    VPMM_LIBRARY names) becomes PyTorch's allocator through vpmm.enable()
    (`python -m vpmm run --no-torch` leaves this folder out); if that cannot be
    done, one line on stderr says why and the program goes on (under the
    preload, PyTorch's own allocator then caches on top of the pool);
  - the sitecustomize this file hides (a later one on sys.path, such as
    the distribution's) still runs.

Imports nothing heavy. Python 3.8 and later."""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(msg):
    sys.stderr.write("vpmm: warning: %s\n" % msg)


def _vpmm():
    """The vpmm package: importable in this interpreter, else the one this
    file belongs to, loaded from its folder."""
    try:
        import vpmm
        return vpmm
    except ImportError:
        pass
    pkg = os.path.dirname(_HERE)
    spec = importlib.util.spec_from_file_location(
        "vpmm", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg])
    module = importlib.util.module_from_spec(spec)
    sys.modules["vpmm"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["vpmm"]
        raise
    return module


def _torch_imported(torch):
    try:
        _vpmm()._torch.enable(torch)
    except Exception as e:  # the program must go on, whatever happened
        _warn("PyTorch keeps its own allocator: %s" % e)


class _TorchHook:
    """A meta path finder that lets the real finders find torch and runs
    _torch_imported once torch's module has been executed. Removes itself
    on first use."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_enable(module):
            exec_module(module)
            _torch_imported(module)

        spec.loader.exec_module = exec_then_enable
        return spec


def _chain():
    """Runs the sitecustomize that would have run without this folder."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if "torch" in sys.modules:
    _torch_imported(sys.modules["torch"])
else:
    sys.meta_path.insert(0, _TorchHook())
try:
    _chain()
except Exception as e:
    _warn("the hidden sitecustomize failed: %r" % (e,))
