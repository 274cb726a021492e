"""Loading the compiled ops: the ahead-of-time build if installed, else a JIT build of csrc/."""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["CSRC_DIR", "SOURCES", "ensure_loaded", "is_loaded"]

CSRC_DIR = Path(__file__).resolve().parent.parent / "csrc"
SOURCES = ("registration.cpp", "hot_buffer_ops.cu", "vllm_resolve_ops.cu")
NVCC_FLAGS = ("-O3", "-lineinfo")

_lock = threading.Lock()
_loaded = False


def is_loaded() -> bool:
    return _loaded


def ensure_loaded(*, verbose: bool = False) -> None:
    """Make ``torch.ops.hisparse.*`` available (idempotent).

    Prefers the extension built by ``setup.py`` (``hisparse_kernels._C``); otherwise compiles csrc/
    with ``torch.utils.cpp_extension.load`` for the archs in ``TORCH_CUDA_ARCH_LIST``.
    """
    global _loaded
    with _lock:
        if _loaded:
            return
        import torch  # noqa: F401  (the extension links against it)

        if os.environ.get("HISPARSE_FORCE_JIT") != "1":
            try:
                from hisparse_kernels import _C  # noqa: F401
            except ImportError:
                _jit_build(verbose)
        else:
            _jit_build(verbose)
        from hisparse_kernels.ops import _fake

        _fake.register()
        _loaded = True


def _jit_build(verbose: bool) -> None:
    from torch.utils.cpp_extension import load

    load(
        name="hisparse_kernels_jit",
        sources=[str(CSRC_DIR / s) for s in SOURCES],
        extra_cflags=["-O3"],
        extra_cuda_cflags=list(NVCC_FLAGS),
        is_python_module=False,
        verbose=verbose,
    )
