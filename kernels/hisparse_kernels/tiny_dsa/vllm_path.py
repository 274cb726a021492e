"""The tiny DSA model's KV path driven through vLLM 0.33's HiSparse op sequence.

:class:`VllmOpsKV` calls the four ops the way ``vllm/v1/hisparse/runtime.py`` does, through any op
set that carries vLLM's names (``hisparse_resolve_residency``, ``hisparse_gather_compact``,
``hisparse_gather_plan``, ``hisparse_invalidate_written_slots``):

- the new token's KV row of every layer lands in that layer's pinned host pool (the eager host
  mirror) and ``invalidate_written_slots`` drops its stale hot copy from the group's state;
- the group's first layer resolves the indexer's top-k (global ids, one row per request, state row =
  batch row, padding rows with state -1) into the paged hot cache and copies the misses with
  ``gather_compact``; attention reads the hot rows through ``attention_indices``;
- each index-sharing layer replays the same plan from its own host pool with ``gather_plan``
  (``resolved_global_indices``, ``hot_indices``, ``miss_mask``), after its own newest row is written;
- a request's prompt rows land in the host pools at prefill and ``invalidate_written_slots`` drops
  them from the request's state row, so a recycled block's stale hot copy is never read.

Op sets: :func:`wheel_ops` (vLLM's compiled ops), :func:`our_ops` (ours, registered in
``torch.ops.hisparse`` under ``vllm_*``), :func:`reference_ops` (the NumPy reference, CPU tensors).
The same requests decoded with two op sets must give the same tokens, and both the full-KV tokens.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from hisparse_kernels.host_pool import HostPool
from hisparse_kernels.ops.vllm_names import OURS_FOR_VLLM
from hisparse_kernels.reference import vllm_ops as ref
from hisparse_kernels.tiny_dsa.model import TinyDSAConfig

__all__ = ["VllmOpsKV", "load_wheel_ops", "our_ops", "reference_ops", "wheel_ops"]

HOT_BLOCK_SIZE = 16
"""Rows per block of the paged hot cache (vLLM's HMA blocks); the block table is a permutation."""


def load_wheel_ops(path: str) -> Any:
    """Load vLLM's compiled ops from the wheel's ``_C_stable_libtorch.abi3.so`` at ``path`` (its CUDA
    runtime from torch's own wheel, where torch carries one) and return ``torch.ops._C_cache_ops``."""
    import ctypes
    from pathlib import Path

    cudart = Path(torch.__file__).parent.parent / "nvidia" / "cu13" / "lib" / "libcudart.so.13"
    if cudart.exists():
        ctypes.CDLL(str(cudart), mode=ctypes.RTLD_GLOBAL)
    torch.ops.load_library(path)
    return wheel_ops()


def wheel_ops() -> Any:
    """vLLM's compiled ops (the wheel's ``_C_stable_libtorch`` must be loaded)."""
    return torch.ops._C_cache_ops


def our_ops() -> Any:
    """Ours under vLLM's names (``hisparse_kernels.ops.ensure_loaded()`` first)."""
    ns = torch.ops.hisparse
    return SimpleNamespace(**{theirs: getattr(ns, ours) for theirs, ours in OURS_FOR_VLLM.items()})


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.numpy()


def reference_ops() -> Any:
    """The NumPy reference behind vLLM's names, on CPU tensors (outputs written in place)."""

    def resolve(host_cache, hot_cache, hot_block_table, global_indices, hot_indices, device_global_indices,
                lru_slots, request_state_indices, region_stride, max_union_rows, miss_mask=None, stats=None,
                attention_indices=None, attention_block_stride=0, request_ids=None, source_block_table=None,
                source_block_size=0, resolved_global_indices=None, valid_counts=None,
                swap_host_physical_rows=None, swap_device_physical_rows=None, swap_counts=None,
                resident_block_table=None, resident_block_size=0, resident_null_block=0):
        ref.resolve_residency_ref(ref.VllmResolveArgs(
            host_rows=host_cache.shape[0], hot_block_size=hot_cache.shape[1] if hot_cache.dim() == 3 else 1,
            hot_block_table=_np(hot_block_table), global_indices=_np(global_indices), hot_indices=_np(hot_indices),
            device_global_indices=_np(device_global_indices), lru_slots=_np(lru_slots),
            request_state_indices=_np(request_state_indices), region_stride=region_stride,
            max_union_rows=max_union_rows, miss_mask=_np(miss_mask), stats=_np(stats),
            attention_indices=_np(attention_indices), attention_block_stride=attention_block_stride,
            request_ids=_np(request_ids), source_block_table=_np(source_block_table),
            source_block_size=source_block_size, resolved_global_indices=_np(resolved_global_indices),
            valid_counts=_np(valid_counts), swap_host_physical_rows=_np(swap_host_physical_rows),
            swap_device_physical_rows=_np(swap_device_physical_rows), swap_counts=_np(swap_counts),
            resident_block_table=_np(resident_block_table), resident_block_size=resident_block_size,
            resident_null_block=resident_null_block))

    def as_bytes(t: torch.Tensor) -> np.ndarray:
        return t.view(torch.uint8).numpy()

    return SimpleNamespace(
        hisparse_resolve_residency=resolve,
        hisparse_gather_compact=lambda host, hot, g, d, c: ref.gather_compact_ref(
            as_bytes(host), as_bytes(hot), _np(g), _np(d), _np(c)),
        hisparse_gather_plan=lambda host, hot, g, d, m, rsi, att=None, abs_=0: ref.gather_plan_ref(
            as_bytes(host), as_bytes(hot), _np(g), _np(d), _np(m), _np(rsi), _np(att), abs_),
        hisparse_invalidate_written_slots=lambda dgi, rsi, req, slots: ref.invalidate_written_slots_ref(
            _np(dgi), _np(rsi), _np(req), _np(slots)),
    )


class VllmOpsKV:
    """Host pool + paged hot cache driven by vLLM's op sequence (see the module docstring)."""

    def __init__(self, config: TinyDSAConfig, device: torch.device, ops: Any, *, seed: int = 0) -> None:
        c = config
        self.config = c
        self.ops = ops
        self.device = device
        self.h = c.hot_slots
        self.k = c.index_topk
        bs = HOT_BLOCK_SIZE
        if self.h % bs:
            raise ValueError(f"hot_slots {self.h} must be a multiple of the hot block size {bs}")
        blocks_per_row = self.h // bs
        # Pinned host pools (one per layer) as vLLM's host_cache: [rows, row bytes].
        self.pool = HostPool(c.num_layers, c.num_slots, c.kv_row_bytes, pin=device.type == "cuda")
        gen = torch.Generator().manual_seed(seed)
        nblocks = c.max_batch * blocks_per_row + 3  # spare blocks nobody maps
        self.hbt = torch.randperm(nblocks, generator=gen)[: c.max_batch * blocks_per_row].view(
            c.max_batch, blocks_per_row).to(torch.int32).to(device)
        self.hot = [torch.zeros(nblocks, bs, c.kv_row_bytes, dtype=torch.uint8, device=device)
                    for _ in range(c.num_layers)]
        b, k = c.max_batch, self.k
        i32 = {"dtype": torch.int32, "device": device}
        self.groups: dict[int, SimpleNamespace] = {}
        for layer in range(c.num_layers):
            if c.is_full_layer(layer):
                self.groups[layer] = SimpleNamespace(
                    dgi=torch.full((b, self.h), -1, **i32),
                    lru=torch.arange(self.h, dtype=torch.int16, device=device).repeat(b, 1).contiguous(),
                    stats=torch.zeros(2, dtype=torch.uint64, device=device),
                    hot_idx=torch.empty((b, k), **i32), miss_mask=torch.empty((b, k), **i32),
                    resolved=torch.empty((b, k), **i32), attention=torch.empty((b, k), **i32),
                    swap_host=torch.empty((b, k), **i32), swap_device=torch.empty((b, k), **i32),
                    swap_counts=torch.empty(b, **i32))
        self.rsi = torch.full((b,), -1, **i32)

    def _group(self, layer: int) -> int:
        return layer - layer % self.config.index_topk_freq

    def assign_blocks(self, block_ids: list[int]) -> None:
        """Nothing: every slot is written before it is read, and each write drops the writing row's
        stale hot copy (``invalidate_written_slots``), so a recycled block needs no sweep here. (vLLM
        also sweeps reassigned blocks with plain torch, ``invalidate_sorted_slots``; leaving it out
        makes the written-slot op the only guard, so a broken one changes the tokens.)"""

    def _written(self, layer: int, req_rows: torch.Tensor, slots: torch.Tensor) -> None:
        if layer in self.groups:  # the group's state drops the hot copies of the slots just written
            self.ops.hisparse_invalidate_written_slots(self.groups[layer].dgi, self.rsi, req_rows.to(torch.int32),
                                                       slots.to(torch.int64))

    def write_prefill(self, layer: int, slots: torch.Tensor, rows: torch.Tensor, row: int | None = None) -> None:
        if row is None:
            raise ValueError("VllmOpsKV.write_prefill needs the request's batch row (its state row)")
        self.pool.layer(layer).view(torch.bfloat16)[slots.cpu()] = rows.cpu()
        self.rsi[row] = row
        self._written(layer, torch.full_like(slots, row, device=self.device), slots.to(self.device))

    def write_newest(self, layer: int, rows_idx: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
        self.pool.layer(layer).view(torch.bfloat16)[slots.long().cpu()] = rows.cpu()
        if layer == 0:  # the step's active rows (state row = batch row), the rest padding
            self.rsi.fill_(-1)
            self.rsi[rows_idx.long()] = rows_idx.to(torch.int32)
        self._written(layer, rows_idx, slots)

    def select(self, layer: int, topk: torch.Tensor, newest: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        g = self.groups[layer]
        host = self.pool.layer(layer)
        self.ops.hisparse_resolve_residency(
            host, self.hot[layer], self.hbt, topk, g.hot_idx, g.dgi, g.lru, self.rsi, self.h, self.k,
            g.miss_mask, g.stats, g.attention, HOT_BLOCK_SIZE, None, None, 0, g.resolved, None,
            g.swap_host, g.swap_device, g.swap_counts, None, 0, 0)
        self.ops.hisparse_gather_compact(host, self.hot[layer], g.swap_host, g.swap_device, g.swap_counts)
        return g.attention

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        group = self._group(layer)
        if layer != group:  # replay the group's plan from this layer's pool (its newest row is written)
            g = self.groups[group]
            self.ops.hisparse_gather_plan(self.pool.layer(layer), self.hot[layer], g.resolved, g.hot_idx,
                                          g.miss_mask, self.rsi, None, 0)
        flat = self.hot[layer].view(-1, self.config.kv_row_bytes).view(torch.bfloat16)
        return flat[index.clamp(min=0).long()], index >= 0

    def finish_layer(self, layer: int, newest: torch.Tensor, real: torch.Tensor) -> None:
        pass

    def counters(self) -> tuple[int, int]:
        totals = sum(g.stats.cpu().numpy().astype(np.int64) for g in self.groups.values())
        return int(totals[0]), int(totals[1])

    def close(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.pool.close()
