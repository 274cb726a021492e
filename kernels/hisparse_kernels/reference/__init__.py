"""NumPy reference of every hot-buffer op: readable, sequential, and the definition of exact output."""

from hisparse_kernels.reference.around import backup_newest_rows_ref, invalidate_slots_ref
from hisparse_kernels.reference.layout import region_stride_for
from hisparse_kernels.reference.swap_in import (
    ResolveState,
    gather_plan_ref,
    resolve_ref,
    resolve_row_ref,
    swap_in_ref,
)

__all__ = [
    "ResolveState",
    "backup_newest_rows_ref",
    "gather_plan_ref",
    "invalidate_slots_ref",
    "region_stride_for",
    "resolve_ref",
    "resolve_row_ref",
    "swap_in_ref",
]
