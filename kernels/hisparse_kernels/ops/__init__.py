"""Thin typed wrappers of ``torch.ops.hisparse.*`` (CPU tensors run the NumPy reference)."""

from hisparse_kernels.ops._extension import ensure_loaded, is_loaded
from hisparse_kernels.ops.hot_buffer import (
    backup_newest_rows,
    gather_plan,
    invalidate_slots,
    resolve,
    swap_in,
)

__all__ = [
    "backup_newest_rows",
    "ensure_loaded",
    "gather_plan",
    "invalidate_slots",
    "is_loaded",
    "resolve",
    "swap_in",
]
