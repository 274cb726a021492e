"""Hot-buffer layout arithmetic shared by the kernels, the wrappers and the model."""

from __future__ import annotations

__all__ = ["MAX_HOT_SLOTS", "region_stride_for"]

MAX_HOT_SLOTS = 32766
"""Largest H: LRU entries are int16 and slot H itself must fit."""


def region_stride_for(hot_slots: int) -> int:
    """Rows per request region: ``round_up(H + 1, 128)`` (H LRU slots plus the newest slot)."""
    if not 0 < hot_slots <= MAX_HOT_SLOTS:
        raise ValueError(f"H={hot_slots} must be in [1, {MAX_HOT_SLOTS}] (int16 slot ids)")
    return (hot_slots + 1 + 127) // 128 * 128
