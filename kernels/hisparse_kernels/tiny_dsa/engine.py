"""Batched greedy decoding of the tiny DSA model over one of two KV backends.

- :class:`FullKV`: every token's KV row stays on the device, indexed by global slot.
- :class:`HiSparseKV`: KV rows live in a pinned host pool; each decode step resolves the indexer's
  top-k into a per-request hot buffer with the hot-buffer ops (swap-in on full layers, index-sharing
  prefetch for shared layers, newest-row backup, invalidation when blocks are assigned).

Scheduling is identical for both backends (it depends only on the request list), so the two runs
see the same block assignments, slots, batch rows and recycling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from hisparse_kernels.host_pool import HostPool
from hisparse_kernels.hot_state import HotState
from hisparse_kernels.index_share import IndexSharePrefetcher
from hisparse_kernels.ops import backup_newest_rows, invalidate_slots, swap_in
from hisparse_kernels.reference.layout import region_stride_for
from hisparse_kernels.tiny_dsa.model import TinyDSAConfig, TinyDSAWeights
from hisparse_kernels.tiny_dsa.vllm_path import VllmOpsKV

__all__ = ["BatchResult", "FullKV", "HiSparseKV", "run_batch"]


class FullKV:
    """The non-HiSparse baseline: all KV rows on the device."""

    def __init__(self, config: TinyDSAConfig, device: torch.device) -> None:
        self.kv = torch.zeros(config.num_layers, config.num_slots, config.kv_row_dim,
                              dtype=torch.bfloat16, device=device)

    def assign_blocks(self, block_ids: list[int]) -> None:
        pass

    def write_prefill(self, layer: int, slots: torch.Tensor, rows: torch.Tensor, row: int | None = None) -> None:
        self.kv[layer][slots] = rows

    def write_newest(self, layer: int, rows_idx: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
        self.kv[layer][slots.long()] = rows

    def select(self, layer: int, topk: torch.Tensor, newest: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        return topk

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[layer][index.clamp(min=0).long()], index >= 0

    def finish_layer(self, layer: int, newest: torch.Tensor, real: torch.Tensor) -> None:
        pass

    def close(self) -> None:
        pass

    def counters(self) -> tuple[int, int]:
        return 0, 0


class HiSparseKV:
    """Host pool + per-request hot buffer driven by the hot-buffer ops."""

    def __init__(self, config: TinyDSAConfig, device: torch.device) -> None:
        c = config
        self.config = c
        self.h = c.hot_slots
        self.rs = region_stride_for(c.hot_slots)
        self.pool = HostPool(c.num_layers, c.num_slots, c.kv_row_bytes, pin=device.type == "cuda")
        self.hot = torch.zeros(c.num_layers, c.max_batch * self.rs, c.kv_row_bytes, dtype=torch.uint8,
                               device=device)
        self.states: dict[int, HotState] = {}
        self.prefetch: dict[int, IndexSharePrefetcher] = {}
        for layer in range(c.num_layers):
            if c.is_full_layer(layer):
                self.states[layer] = HotState.allocate(c.max_batch, c.index_topk, c.hot_slots, device)
                self.prefetch[layer] = IndexSharePrefetcher(len(self._shared(layer)), device)
        self.device = device

    def _shared(self, full_layer: int) -> list[int]:
        c = self.config
        return [l for l in range(full_layer + 1, min(full_layer + c.index_topk_freq, c.num_layers))]

    def _group(self, layer: int) -> int:
        return layer - layer % self.config.index_topk_freq

    def assign_blocks(self, block_ids: list[int]) -> None:
        ids = torch.tensor(block_ids, dtype=torch.int32, device=self.device)
        for state in self.states.values():
            invalidate_slots(state.dgi, ids, block_size=self.config.block_size)

    def write_prefill(self, layer: int, slots: torch.Tensor, rows: torch.Tensor, row: int | None = None) -> None:
        # Stands in for the KV that prefill (or an RDMA transfer) lands in the host pool.
        self.pool.layer(layer).view(torch.bfloat16)[slots.cpu()] = rows.cpu()

    def write_newest(self, layer: int, rows_idx: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
        self.hot[layer].view(torch.bfloat16)[rows_idx.long() * self.rs + self.h] = rows

    def select(self, layer: int, topk: torch.Tensor, newest: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        s = self.states[layer]
        swap_in(topk, newest, real, s.dgi, s.lru, s.hot_rows, s.plan_src, s.plan_dst, s.plan_count,
                s.counters, s.miss_mask, self.pool.layer(layer), self.hot[layer], region_stride=self.rs)
        shared = self._shared(layer)
        if shared:
            self.prefetch[layer].issue(s, [self.pool.layer(l) for l in shared], [self.hot[l] for l in shared],
                                       real)
        return s.hot_rows

    def gather(self, layer: int, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        group = self._group(layer)
        if layer != group:
            self.prefetch[group].wait(layer - group - 1)
        return self.hot[layer].view(torch.bfloat16)[index.clamp(min=0).long()], index >= 0

    def finish_layer(self, layer: int, newest: torch.Tensor, real: torch.Tensor) -> None:
        backup_newest_rows(self.hot[layer], self.pool.layer(layer), newest, real,
                           region_stride=self.rs, hot_slot=self.h)

    def counters(self) -> tuple[int, int]:
        hits = sum(int(s.counters[0]) for s in self.states.values())
        misses = sum(int(s.counters[1]) for s in self.states.values())
        return hits, misses

    def close(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.pool.close()


@dataclass
class _Request:
    index: int
    prompt: list[int]
    max_tokens: int
    blocks: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # global slot of every written position

    @property
    def seq_len(self) -> int:  # tokens whose KV is written
        return len(self.prompt) + len(self.out) - 1


@dataclass
class BatchResult:
    """Tokens per request (input order) and what the run went through."""

    tokens: list[list[int]]
    decode_steps: int
    max_concurrency: int
    blocks_recycled: int
    hits: int
    misses: int


class _Scheduler:
    def __init__(self, weights: TinyDSAWeights, backend: FullKV | HiSparseKV | VllmOpsKV,
                 device: torch.device) -> None:
        self.w = weights
        self.c = weights.config
        self.kv = backend
        self.device = device
        c = self.c
        self.free_blocks = list(range(c.num_blocks - 1, -1, -1))  # a stack: freed blocks come back first
        self.ever_used: set[int] = set()
        self.recycled = 0
        self.rows: list[_Request | None] = [None] * c.max_batch
        n_full = sum(1 for l in range(c.num_layers) if c.is_full_layer(l))
        self.index_cache = torch.zeros(n_full, c.num_slots, c.index_head_dim, device=device)

    # ----------------------------------------------------------------------------- blocks
    def _slot(self, req: _Request, pos: int) -> int:
        return req.blocks[pos // self.c.block_size] * self.c.block_size + pos % self.c.block_size

    def _grow(self, req: _Request, length: int) -> None:
        need = -(-length // self.c.block_size) - len(req.blocks)
        if need <= 0:
            return
        if need > len(self.free_blocks):
            raise RuntimeError("tiny DSA ran out of KV blocks: raise num_blocks")
        new = [self.free_blocks.pop() for _ in range(need)]
        self.recycled += sum(1 for b in new if b in self.ever_used)
        self.ever_used.update(new)
        req.blocks.extend(new)
        self.kv.assign_blocks(new)

    def _release(self, req: _Request) -> None:
        self.free_blocks.extend(reversed(req.blocks))
        req.blocks = []

    # ----------------------------------------------------------------------------- prefill
    @torch.no_grad()
    def prefill(self, req: _Request, row: int) -> None:
        c, w = self.c, self.w
        n = len(req.prompt)
        self._grow(req, n)
        req.slots = [self._slot(req, p) for p in range(n)]
        slots = torch.tensor(req.slots, dtype=torch.long, device=self.device)
        pos = torch.arange(n, device=self.device)
        x = w.embed[torch.tensor(req.prompt, device=self.device)]
        causal = pos[None, :] <= pos[:, None]
        k_eff = min(c.index_topk, n)
        local = None
        for layer in range(c.num_layers):
            h = w.attn_input(x, layer)
            rows = w.kv_rows(h, pos, layer)
            self.kv.write_prefill(layer, slots, rows, row)
            if c.is_full_layer(layer):
                keys = w.index_keys(h, layer)
                self.index_cache[layer // c.index_topk_freq][slots] = keys
                scores = w.index_scores(h, keys[None].expand(n, n, -1), layer).masked_fill(~causal, float("-inf"))
                vals, ids = scores.topk(k_eff, dim=-1)
                local = torch.where(torch.isinf(vals), torch.full_like(ids, -1), ids)
            assert local is not None
            kv = rows[local.clamp(min=0)]
            x = x + w.attention(h, pos, kv, local >= 0, layer)
            x = x + w.mlp(x, layer)
        req.out.append(int(w.logits(x[-1:]).argmax(-1)))

    # ----------------------------------------------------------------------------- decode
    @torch.no_grad()
    def decode_step(self) -> None:
        c, w, dev = self.c, self.w, self.device
        active = [r for r, req in enumerate(self.rows) if req is not None]
        b = c.max_batch
        tokens = torch.zeros(b, dtype=torch.long)
        pos = torch.zeros(b, dtype=torch.long)
        newest = torch.full((b,), -1, dtype=torch.int32)
        seqs: list[list[int]] = [[] for _ in range(b)]
        for r in active:
            req = self.rows[r]
            assert req is not None
            p = req.seq_len  # position of the token being fed
            self._grow(req, p + 1)
            tokens[r] = req.out[-1]
            pos[r] = p
            req.slots.append(self._slot(req, p))
            newest[r] = req.slots[-1]
            seqs[r] = req.slots
        lmax = max(len(s) for s in seqs)
        seq_slots = torch.full((b, lmax), -1, dtype=torch.long)
        for r in active:
            seq_slots[r, : len(seqs[r])] = torch.tensor(seqs[r])
        tokens, pos, newest, seq_slots = tokens.to(dev), pos.to(dev), newest.to(dev), seq_slots.to(dev)
        act = torch.tensor(active, dtype=torch.long, device=dev)
        real = torch.tensor([max(active) + 1], dtype=torch.int32, device=dev)
        k_eff = min(c.index_topk, lmax)

        x = w.embed[tokens]
        index = None
        for layer in range(c.num_layers):
            h = w.attn_input(x, layer)
            rows = w.kv_rows(h, pos, layer)
            self.kv.write_newest(layer, act, newest[act], rows[act])
            if c.is_full_layer(layer):
                cache = self.index_cache[layer // c.index_topk_freq]
                keys = w.index_keys(h, layer)
                cache[newest[act].long()] = keys[act]
                scores = w.index_scores(h, cache[seq_slots.clamp(min=0)], layer)
                scores = scores.masked_fill(seq_slots < 0, float("-inf"))
                vals, ids = scores.topk(k_eff, dim=-1)
                topk = torch.full((b, c.index_topk), -1, dtype=torch.int32, device=dev)
                chosen = seq_slots.gather(1, ids)
                topk[:, :k_eff] = torch.where(torch.isinf(vals), torch.full_like(chosen, -1), chosen).to(torch.int32)
                index = self.kv.select(layer, topk, newest, real)
            assert index is not None
            kv, valid = self.kv.gather(layer, index)
            x = x + w.attention(h, pos, kv, valid, layer)
            x = x + w.mlp(x, layer)
            self.kv.finish_layer(layer, newest, real)
        nxt = w.logits(x).argmax(-1).cpu()
        for r in active:
            req = self.rows[r]
            assert req is not None
            req.out.append(int(nxt[r]))


def run_batch(
    weights: TinyDSAWeights,
    requests: Sequence[tuple[list[int], int]],
    *,
    hisparse: bool,
    device: torch.device,
    max_concurrency: int | None = None,
    vllm_ops: Any | None = None,
) -> BatchResult:
    """Greedy-decode every ``(prompt, max_tokens)``; at most ``max_concurrency`` (default
    ``max_batch``) at once. A finished request frees its row and blocks at once, and the next
    waiting request takes the lowest free row (so rows and blocks are recycled). With ``vllm_ops``
    (and ``hisparse``), the KV path is vLLM's op sequence on that op set (``tiny_dsa.vllm_path``)."""
    c = weights.config
    limit = min(max_concurrency or c.max_batch, c.max_batch)
    backend: FullKV | HiSparseKV | VllmOpsKV
    if hisparse and vllm_ops is not None:
        backend = VllmOpsKV(c, device, vllm_ops)
    else:
        backend = HiSparseKV(c, device) if hisparse else FullKV(c, device)
    sched = _Scheduler(weights, backend, device)
    reqs = [_Request(i, list(p), m) for i, (p, m) in enumerate(requests)]
    for req in reqs:
        if not req.prompt or req.max_tokens < 1:
            raise ValueError(f"request {req.index}: needs a non-empty prompt and max_tokens >= 1")
    pending = list(reqs)
    steps = 0
    peak = 0
    try:
        while pending or any(r is not None for r in sched.rows):
            for r in range(limit):  # admit into free rows, lowest first
                if sched.rows[r] is None and pending:
                    req = pending.pop(0)
                    sched.prefill(req, r)
                    sched.rows[r] = req
            for r in range(limit):  # retire finished requests
                req = sched.rows[r]
                if req is not None and len(req.out) >= req.max_tokens:
                    sched._release(req)
                    sched.rows[r] = None
            if not any(r is not None for r in sched.rows):
                continue
            peak = max(peak, sum(1 for r in sched.rows if r is not None))
            sched.decode_step()
            steps += 1
        hits, misses = backend.counters()
    finally:
        backend.close()
    return BatchResult([r.out for r in reqs], steps, peak, sched.recycled, hits, misses)
