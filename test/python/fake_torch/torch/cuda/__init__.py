"""torch.cuda, as far as vpmm uses it. CUDA counts as initialised when
STANDIN_TORCH_CUDA_INITIALIZED=1 (as after the first CUDA tensor)."""
import os

from . import memory  # noqa: F401


def is_initialized():
    return os.environ.get("STANDIN_TORCH_CUDA_INITIALIZED") == "1"
