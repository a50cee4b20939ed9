"""A stand-in for the part of PyTorch that the vpmm package uses (the
pluggable allocator's Python API), for the python suite: no GPU, no real
torch. It behaves as torch 2.x does where vpmm depends on it and records
what it was given, so that the tests read it back."""
__version__ = "0.0+stand-in"

from . import cuda  # noqa: E402,F401
