"""gpt2enc_edu: the GPT-2 encoder kernels of llm.c, for learning and for use.

NumPy arrays run a bit-exact NumPy mirror of each kernel; CuPy arrays run the CUDA kernels in ``kernels/``.

    >>> import numpy as np, ml_dtypes, gpt2enc_edu as enc
    >>> inp = np.array([[3, 1]], dtype=np.int32)
    >>> wte = np.ones((8, 8), dtype=ml_dtypes.bfloat16); wpe = np.ones((4, 8), dtype=ml_dtypes.bfloat16)
    >>> enc.encoder_forward(inp, wte, wpe)[0, 0, :2]
    array([2, 2], dtype=bfloat16)
"""

from . import compare, reference
from .backend import Backend, array_module, gpu_status, last_backend
from .buckets import BucketTable
from .encoder import encoder_backward, encoder_forward, make_buckets
from .rounding import bfloat16

__all__ = [
    "Backend",
    "BucketTable",
    "array_module",
    "bfloat16",
    "compare",
    "encoder_backward",
    "encoder_forward",
    "gpu_status",
    "last_backend",
    "make_buckets",
    "reference",
]

__version__ = "0.1.0"
