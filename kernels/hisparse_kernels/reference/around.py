"""Reference newest-row backup and slot invalidation."""

from __future__ import annotations

import numpy as np

__all__ = ["backup_newest_rows_ref", "invalidate_slots_ref"]


def backup_newest_rows_ref(
    hot: np.ndarray,
    host_pool: np.ndarray,
    newest: np.ndarray,
    num_real_reqs: int,
    *,
    region_stride: int,
    hot_slot: int,
) -> None:
    """Copy each real row's newest hot row to the host pool at its global slot.

    ``hot``: uint8 [N, W]; ``host_pool``: uint8 [P, W]; ``newest``: int32 [B]. Row ``r`` copies
    ``hot[r * region_stride + hot_slot]`` to ``host_pool[newest[r]]`` for
    ``r < min(B, num_real_reqs, N // region_stride)``; ``newest[r]`` outside ``[0, P)`` is skipped.
    Two rows naming the same slot are a caller error (the kernel would race).
    """
    rows = min(len(newest), int(num_real_reqs), hot.shape[0] // region_stride)
    for r in range(max(rows, 0)):
        g = int(newest[r])
        if 0 <= g < host_pool.shape[0]:
            host_pool[g] = hot[r * region_stride + hot_slot]


def invalidate_slots_ref(dgi: np.ndarray, block_ids: np.ndarray, *, block_size: int) -> None:
    """Drop hot copies of every slot of the given blocks: ``dgi[r, s] = -1`` where
    ``dgi[r, s] // block_size`` is in ``block_ids`` (all rows; negative ids and entries ignored)."""
    blocks = {int(b) for b in block_ids if b >= 0}
    for r in range(dgi.shape[0]):
        for s in range(dgi.shape[1]):
            g = int(dgi[r, s])
            if g >= 0 and g // block_size in blocks:
                dgi[r, s] = -1
