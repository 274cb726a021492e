"""HiSparse hot-buffer kernels.

The public face of the package. The reference (``hisparse_kernels.reference``) needs only NumPy;
everything that touches torch imports it lazily, so ``import hisparse_kernels`` works without it.

- Ops (``torch.ops.hisparse.*`` on CUDA tensors, the NumPy reference on CPU tensors):
  :func:`resolve`, :func:`swap_in`, :func:`gather_plan`, :func:`backup_newest_rows`,
  :func:`invalidate_slots`; :func:`ensure_loaded` builds or loads the extension.
- :class:`HostPool`: page-aligned, exactly registered pinned host memory for the full KV.
- :class:`HotState`: one resolve group's LRU state and miss plan.
- :class:`IndexSharePrefetcher`: copy-stream gathers of shared layers, one event per layer.
- ``hisparse_kernels.tiny_dsa``: the tiny DSA model used for token parity (needs torch).
"""

from hisparse_kernels.host_pool import HostPool
from hisparse_kernels.hot_state import HotState
from hisparse_kernels.index_share import IndexSharePrefetcher
from hisparse_kernels.ops import (
    backup_newest_rows,
    ensure_loaded,
    gather_plan,
    invalidate_slots,
    resolve,
    swap_in,
)
from hisparse_kernels.reference import (
    ResolveState,
    backup_newest_rows_ref,
    gather_plan_ref,
    invalidate_slots_ref,
    region_stride_for,
    resolve_ref,
    swap_in_ref,
)

__all__ = [
    "HostPool",
    "HotState",
    "IndexSharePrefetcher",
    "ResolveState",
    "backup_newest_rows",
    "backup_newest_rows_ref",
    "ensure_loaded",
    "gather_plan",
    "gather_plan_ref",
    "invalidate_slots",
    "invalidate_slots_ref",
    "region_stride_for",
    "resolve",
    "resolve_ref",
    "swap_in",
    "swap_in_ref",
]
