"""Per-group hot-buffer state: the LRU bookkeeping of one full layer and the plan its shared layers
replay. Allocated once (static addresses, so a captured CUDA graph can reuse it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hisparse_kernels.reference.layout import region_stride_for

if TYPE_CHECKING:
    import torch

__all__ = ["HotState"]


@dataclass
class HotState:
    """Tensors of one resolve group. ``B`` rows, ``K`` top-k width, ``H`` LRU slots."""

    dgi: "torch.Tensor"         # int32 [B, H], -1 empty
    lru: "torch.Tensor"         # int16 [B, H], least recent first
    hot_rows: "torch.Tensor"    # int32 [B, K]
    plan_src: "torch.Tensor"    # int32 [B, K]
    plan_dst: "torch.Tensor"    # int32 [B, K]
    plan_count: "torch.Tensor"  # int32 [B]
    miss_mask: "torch.Tensor"   # uint8 [B, K]
    counters: "torch.Tensor"    # int64 [2]: hits, misses
    region_stride: int

    @property
    def hot_slot(self) -> int:
        """H: the reserved slot of the newest token."""
        return self.dgi.shape[1]

    @classmethod
    def allocate(cls, num_rows: int, k: int, h: int, device: "torch.device | str") -> "HotState":
        import torch

        if h < k:
            raise ValueError(f"H={h} must be >= K={k}")
        i32 = dict(dtype=torch.int32, device=device)
        state = cls(
            dgi=torch.empty(num_rows, h, **i32),
            lru=torch.empty(num_rows, h, dtype=torch.int16, device=device),
            hot_rows=torch.full((num_rows, k), -1, **i32),
            plan_src=torch.zeros(num_rows, k, **i32),
            plan_dst=torch.full((num_rows, k), -1, **i32),
            plan_count=torch.zeros(num_rows, **i32),
            miss_mask=torch.zeros(num_rows, k, dtype=torch.uint8, device=device),
            counters=torch.zeros(2, dtype=torch.int64, device=device),
            region_stride=region_stride_for(h),
        )
        state.reset_rows(range(num_rows))
        return state

    def reset_rows(self, rows: "range | list[int]") -> None:
        """Empty the given rows: no hot copies, LRU in slot order."""
        import torch

        idx = torch.as_tensor(list(rows), dtype=torch.long, device=self.dgi.device)
        if idx.numel() == 0:
            return
        h = self.hot_slot
        self.dgi[idx] = -1
        self.lru[idx] = torch.arange(h, dtype=torch.int16, device=self.dgi.device).expand(idx.numel(), h)
