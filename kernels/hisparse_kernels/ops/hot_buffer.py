"""Typed wrappers of ``torch.ops.hisparse.*``.

CUDA tensors go to the compiled kernels; CPU tensors run the NumPy reference in place, so the same
call works in CPU tests and in the CPU path of the parity model. Every op mutates its ``!`` arguments
and returns ``None``. Shapes: ``B`` request rows, ``K`` top-k width, ``H`` LRU slots, ``W`` row bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hisparse_kernels import reference as ref
from hisparse_kernels.ops._extension import ensure_loaded

if TYPE_CHECKING:
    import torch

__all__ = [
    "backup_newest_rows",
    "gather_plan",
    "invalidate_slots",
    "resolve",
    "swap_in",
]


def _np(t: "torch.Tensor"):  # noqa: ANN202 - numpy view sharing the tensor's memory
    return t.detach().numpy()


def _ops():  # noqa: ANN202
    import torch

    ensure_loaded()
    return torch.ops.hisparse


def resolve(
    topk: "torch.Tensor",
    newest: "torch.Tensor",
    num_real_reqs: "torch.Tensor",
    dgi: "torch.Tensor",
    lru: "torch.Tensor",
    hot_rows: "torch.Tensor",
    plan_src: "torch.Tensor",
    plan_dst: "torch.Tensor",
    plan_count: "torch.Tensor",
    counters: "torch.Tensor",
    miss_mask: "torch.Tensor | None" = None,
    *,
    region_stride: int,
    pool_rows: int,
) -> None:
    """Resolve top-k global slots to hot rows and plan the misses (no copy).

    ``topk`` int32 [B, K] (-1 padding); ``newest`` int32 [B]; ``num_real_reqs`` int32 [1] on device.
    Mutates ``dgi`` int32 [B, H], ``lru`` int16 [B, H], ``hot_rows`` int32 [B, K] (absolute hot row
    ``r * region_stride + slot`` or -1), ``plan_src`` / ``plan_dst`` int32 [B, K], ``plan_count``
    int32 [B], ``counters`` int64 [2] (+= hits, misses) and ``miss_mask`` uint8 [B, K] if given.
    Exact semantics: :func:`hisparse_kernels.reference.resolve_ref`.
    """
    if topk.is_cuda:
        _ops().resolve(topk, newest, num_real_reqs, dgi, lru, hot_rows, plan_src, plan_dst,
                       plan_count, counters, miss_mask, region_stride, pool_rows)
        return
    state = ref.ResolveState(_np(dgi), _np(lru), _np(hot_rows), _np(plan_src), _np(plan_dst),
                             _np(plan_count), _np(counters),
                             None if miss_mask is None else _np(miss_mask))
    ref.resolve_ref(_np(topk), _np(newest), int(num_real_reqs[0]), state,
                    region_stride=region_stride, pool_rows=pool_rows)


def gather_plan(
    host_pool: "torch.Tensor",
    hot: "torch.Tensor",
    plan_src: "torch.Tensor",
    plan_dst: "torch.Tensor",
    plan_count: "torch.Tensor",
    num_real_reqs: "torch.Tensor",
    *,
    max_blocks: int = 0,
) -> None:
    """Copy a plan: ``hot[dst] = host_pool[src]`` (zeros for ``src`` outside the pool).

    ``host_pool`` uint8 [P, W] pinned CPU memory read through UVA; ``hot`` uint8 [N, W] (mutated).
    Used by shared layers to replay their full layer's plan. ``max_blocks`` caps the grid (0 fills
    the chip): a prefetch that overlaps compute wants a few blocks that leave the SMs to it (a capped
    grid uses a copy of 1024-thread blocks with 128 KiB in flight each). Exact semantics:
    :func:`hisparse_kernels.reference.gather_plan_ref`.
    """
    if hot.is_cuda:
        _ops().gather_plan(host_pool, hot, plan_src, plan_dst, plan_count, num_real_reqs, max_blocks)
        return
    ref.gather_plan_ref(_np(host_pool), _np(hot), _np(plan_src), _np(plan_dst), _np(plan_count),
                        int(num_real_reqs[0]))


def swap_in(
    topk: "torch.Tensor",
    newest: "torch.Tensor",
    num_real_reqs: "torch.Tensor",
    dgi: "torch.Tensor",
    lru: "torch.Tensor",
    hot_rows: "torch.Tensor",
    plan_src: "torch.Tensor",
    plan_dst: "torch.Tensor",
    plan_count: "torch.Tensor",
    counters: "torch.Tensor",
    miss_mask: "torch.Tensor | None",
    host_pool: "torch.Tensor",
    hot: "torch.Tensor",
    *,
    region_stride: int,
) -> None:
    """:func:`resolve` then :func:`gather_plan` on the same stream (``pool_rows = host_pool.shape[0]``)."""
    if topk.is_cuda:
        _ops().swap_in(topk, newest, num_real_reqs, dgi, lru, hot_rows, plan_src, plan_dst,
                       plan_count, counters, miss_mask, host_pool, hot, region_stride)
        return
    resolve(topk, newest, num_real_reqs, dgi, lru, hot_rows, plan_src, plan_dst, plan_count,
            counters, miss_mask, region_stride=region_stride, pool_rows=host_pool.shape[0])
    gather_plan(host_pool, hot, plan_src, plan_dst, plan_count, num_real_reqs)


def backup_newest_rows(
    hot: "torch.Tensor",
    host_pool: "torch.Tensor",
    newest: "torch.Tensor",
    num_real_reqs: "torch.Tensor",
    *,
    region_stride: int,
    hot_slot: int,
) -> None:
    """Copy ``hot[r * region_stride + hot_slot]`` to ``host_pool[newest[r]]`` (mutated) for real rows.

    The row count is clamped to ``min(len(newest), num_real_reqs, N // region_stride)``; slots
    outside the pool are skipped. Exact semantics: :func:`hisparse_kernels.reference.backup_newest_rows_ref`.
    """
    if hot.is_cuda:
        _ops().backup_newest_rows(hot, host_pool, newest, num_real_reqs, region_stride, hot_slot)
        return
    ref.backup_newest_rows_ref(_np(hot), _np(host_pool), _np(newest), int(num_real_reqs[0]),
                               region_stride=region_stride, hot_slot=hot_slot)


def invalidate_slots(dgi: "torch.Tensor", block_ids: "torch.Tensor", *, block_size: int) -> None:
    """Drop every hot copy of the given blocks' slots: ``dgi[r, s] = -1`` where
    ``dgi[r, s] // block_size`` is in ``block_ids`` (int32 [M]). Call once when blocks are assigned."""
    if dgi.is_cuda:
        _ops().invalidate_slots(dgi, block_ids, block_size)
        return
    ref.invalidate_slots_ref(_np(dgi), _np(block_ids), block_size=block_size)
