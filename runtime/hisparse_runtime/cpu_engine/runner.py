"""Continuous batching of the tiny DSA model on CPU, with the request life cycle of a vLLM engine.

The per-layer math and the KV backends are ``hisparse_kernels.tiny_dsa``'s (``TinyDSAWeights``,
``FullKV``, ``HiSparseKV``); the step functions below feed them exactly as the kernels' own greedy
engine does (same ops, same order, a fixed ``max_batch`` of rows), so a request decodes to the tokens
``TinyDSA.generate`` gives in-process. What this adds for serving: requests that arrive while others
run, log-probabilities, a prefill whose blocks outlive the request (P/D producer: held until decode
has read them), and a request whose prompt KV arrives from elsewhere (P/D consumer): its blocks are
filled by a NIXL READ and only the last prompt token is recomputed (as vLLM does on a full hit).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hisparse_kernels.tiny_dsa.engine import FullKV, HiSparseKV

__all__ = ["EngineRequest", "Runner", "RunnerStats"]

log = logging.getLogger("hisparse.cpu_engine")

POISON = 1000.0
"""What a freed block's KV rows and index keys hold (:meth:`Runner._poison`): finite, so that masked-out
reads of it (weight 0) stay 0, and far from anything a forward pass writes."""

Pull = Callable[["EngineRequest", list[int]], int]
"""Fill the request's blocks with its prompt KV from elsewhere; returns bytes moved (raises on failure)."""


@dataclass
class EngineRequest:
    """One completion in the engine (a vLLM ``Request``, reduced to what this model needs)."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    logprobs: int | None = None
    remote_kv: dict[str, Any] | None = None
    """Decode of a P/D pair: the prefill's ``kv_transfer_params`` (``do_remote_prefill``)."""
    hold_kv: bool = False
    """Prefill of a P/D pair (``do_remote_decode``): keep the blocks for decode to read."""
    arrival: float = field(default_factory=time.monotonic)
    # --- state, owned by the engine thread
    blocks: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    next_token: int | None = None
    output: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    scheduled: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    computed_prompt_tokens: int = 0
    external_prompt_tokens: int = 0
    bytes_pulled: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RunnerStats:
    """What ``/metrics`` reads; updated by the engine thread under the runner's lock."""

    running: int = 0
    waiting: int = 0
    blocks_used: int = 0
    blocks_total: int = 0
    hits: int = 0
    misses: int = 0


class Runner:
    """The engine loop: one thread owns the model, the KV blocks and every running request."""

    def __init__(self, weights: Any, *, hisparse: bool, on_finish: Callable[[EngineRequest], None],
                 on_step: Callable[[list[EngineRequest], int], None] | None = None) -> None:  # fmt: skip
        torch.set_num_threads(1)  # a stand-in on a shared CPU; also keeps results independent of cores
        self.w = weights
        self.c = c = weights.config
        self.device = torch.device("cpu")
        self.hisparse = hisparse
        self.kv: FullKV | HiSparseKV = HiSparseKV(c, self.device) if hisparse else FullKV(c, self.device)
        n_full = sum(1 for l in range(c.num_layers) if c.is_full_layer(l))
        self.index_cache = torch.zeros(n_full, c.num_slots, c.index_head_dim, device=self.device)
        self.free_blocks = list(range(c.num_blocks - 1, -1, -1))
        self.rows: list[EngineRequest | None] = [None] * c.max_batch
        self.waiting: deque[EngineRequest] = deque()
        self.held: dict[str, tuple[list[int], float]] = {}  # P/D producer: request id -> (blocks, expiry)
        self.pull: Pull | None = None
        self.notifications: Callable[[], list[str]] | None = None
        self.hold_seconds = 480.0
        self.recompute_on_pull_failure = False
        """``kv_load_failure_policy: recompute``: prefill locally when the pull fails (vLLM's default is fail)."""
        self.on_finish = on_finish
        self.on_step = on_step
        self.lock = threading.Condition()
        self.stats = RunnerStats(blocks_total=c.num_blocks)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="cpu-engine", daemon=True)

    # ------------------------------------------------------------------ regions for NIXL
    def kv_region(self) -> tuple[int, int, int, int]:
        """(address, layers, slots, row bytes) of the KV rows decode reads/writes: the HiSparse host
        pool on a HiSparse engine, the full KV cache otherwise."""
        c = self.c
        t = self.kv.pool.tensor if isinstance(self.kv, HiSparseKV) else self.kv.kv
        return t.data_ptr(), c.num_layers, c.num_slots, c.kv_row_bytes

    def index_region(self) -> tuple[int, int, int, int]:
        c = self.c
        return self.index_cache.data_ptr(), self.index_cache.shape[0], c.num_slots, c.index_head_dim * 4

    # ------------------------------------------------------------------ public API (any thread)
    def start(self) -> None:
        self._thread.start()

    def submit(self, req: EngineRequest) -> None:
        c = self.c
        need = len(req.prompt) + req.max_tokens
        if need > c.num_slots:
            raise ValueError(f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_tokens}) exceeds this"
                             f" model's KV capacity of {c.num_slots} tokens")  # fmt: skip
        with self.lock:
            self.waiting.append(req)
            self.stats.waiting = len(self.waiting)
            self.lock.notify_all()

    def abort(self, req: EngineRequest, reason: str = "abort") -> None:
        with self.lock:
            req.error = req.error or reason
            self.lock.notify_all()

    def abort_all(self) -> None:
        with self.lock:
            for req in list(self.waiting) + [r for r in self.rows if r is not None]:
                req.error = req.error or "aborted: the engine is shutting down"
            self.lock.notify_all()

    def busy(self) -> bool:
        with self.lock:
            return bool(self.waiting) or any(r is not None for r in self.rows)

    def stop(self) -> None:
        with self.lock:
            self._stop = True
            self.lock.notify_all()
        if self._thread.is_alive():
            self._thread.join(30)
        self.kv.close()

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self._stop and not self.waiting and not any(self.rows) and not self.held:
                    self.lock.wait(0.5)
                if self._stop:
                    return
            try:
                self._step()
            except Exception:  # a bug must fail its requests, never wedge the server
                log.exception("engine step failed")
                with self.lock:
                    for r, req in enumerate(self.rows):
                        if req is not None:
                            req.error = req.error or "engine step failed"
            if not any(self.rows) and not self.waiting and self.held:
                time.sleep(0.01)  # only held blocks to watch: poll notifications gently

    def _step(self) -> None:
        self._release_read_blocks()
        self._retire()
        self._admit()
        self._retire()
        active = [r for r, req in enumerate(self.rows) if req is not None]
        if active:
            self._decode_step(active)
            self._retire()
        with self.lock:
            self.stats.running = sum(1 for r in self.rows if r is not None)
            self.stats.waiting = len(self.waiting)
            self.stats.blocks_used = self.c.num_blocks - len(self.free_blocks)
            self.stats.hits, self.stats.misses = self.kv.counters()

    def _release_read_blocks(self) -> None:
        freed = False
        if self.notifications is not None and self.held:
            for request_id in self.notifications():
                entry = self.held.pop(request_id, None)
                if entry is not None:
                    self._free(entry[0])
                    freed = True
        now = time.monotonic()
        for request_id, (blocks, expiry) in list(self.held.items()):
            if now > expiry:
                log.warning("request %s: decode never read its KV; freeing its blocks", request_id)
                self.held.pop(request_id)
                self._free(blocks)
                freed = True
        if freed and self.on_step is not None:
            self.on_step([], 0)

    def _admit(self) -> None:
        while True:
            with self.lock:
                if not self.waiting:
                    return
                row = next((r for r, req in enumerate(self.rows) if req is None), None)
                if row is None:
                    return
                req = self.waiting[0]
                need = -(-(len(req.prompt) + req.max_tokens) // self.c.block_size)
                if req.error is None and need > len(self.free_blocks):
                    return  # wait for blocks (the whole request is reserved, as --scheduler-reserve-full-isl)
                self.waiting.popleft()
            if req.error is not None:
                self._finish(req, "abort")
                continue
            req.scheduled = time.monotonic()
            try:
                if req.remote_kv is not None and self.pull is not None:
                    try:
                        self._load_remote(req)
                    except Exception as exc:
                        if not self.recompute_on_pull_failure:
                            raise
                        log.warning("request %s: KV pull failed (%s); recomputing the prompt", req.request_id, exc)
                        self._free(req.blocks)
                        req.blocks, req.external_prompt_tokens, req.bytes_pulled = [], 0, 0
                        self._prefill(req)
                else:
                    self._prefill(req)
            except Exception as exc:
                log.warning("request %s failed to start: %s", req.request_id, exc)
                self._free(req.blocks)
                req.blocks = []
                req.error = str(exc)
                self._finish(req, "error")
                continue
            self.rows[row] = req

    def _retire(self) -> None:
        for r, req in enumerate(self.rows):
            if req is None:
                continue
            if req.error is not None:
                self.rows[r] = None
                self._free(req.blocks)
                self._finish(req, "abort" if req.error.startswith("abort") else "error")
            elif len(req.output) >= req.max_tokens:
                self.rows[r] = None
                if req.hold_kv and self.notifications is not None:
                    self.held[req.request_id] = (req.blocks, time.monotonic() + self.hold_seconds)
                else:
                    self._free(req.blocks)
                self._finish(req, "length")

    def _finish(self, req: EngineRequest, reason: str) -> None:
        req.finish_reason = reason
        try:
            self.on_finish(req)
        finally:
            req.done.set()

    # ------------------------------------------------------------------ blocks
    def _slot(self, req: EngineRequest, pos: int) -> int:
        bs = self.c.block_size
        return req.blocks[pos // bs] * bs + pos % bs

    def _grow(self, req: EngineRequest, length: int) -> None:
        need = -(-length // self.c.block_size) - len(req.blocks)
        if need <= 0:
            return
        if need > len(self.free_blocks):
            raise RuntimeError("out of KV blocks")
        new = [self.free_blocks.pop() for _ in range(need)]
        req.blocks.extend(new)
        self.kv.assign_blocks(new)

    def _free(self, blocks: list[int]) -> None:
        self._poison(blocks)
        self.free_blocks.extend(reversed(blocks))

    def _poison(self, blocks: list[int]) -> None:
        """Overwrite a freed block's KV rows and index keys (finite values no forward pass writes), so that
        what a later request finds there is never the KV of an earlier one: a transfer that moved nothing
        into a reused block would otherwise leave the earlier request's KV in place and, for the same
        prompt, the right tokens (the parity gate and the data-path tests run the same prompts again)."""
        if not blocks:
            return
        bs = self.c.block_size
        slots = torch.cat([torch.arange(b * bs, (b + 1) * bs) for b in blocks])
        rows = self.kv.pool.tensor.view(torch.bfloat16) if isinstance(self.kv, HiSparseKV) else self.kv.kv
        rows[:, slots] = POISON
        self.index_cache[:, slots] = POISON

    # ------------------------------------------------------------------ model steps
    def _sample(self, req: EngineRequest, logits: torch.Tensor) -> None:
        """Greedy token (and log-probabilities when asked) from one row of logits."""
        token = int(logits.argmax(-1))
        now = time.monotonic()
        if req.logprobs is not None:
            lp = torch.log_softmax(logits.to(torch.float32), dim=-1)
            req.token_logprobs.append(float(lp[token]))
            k = int(req.logprobs)
            if k > 0:
                vals, ids = lp.topk(k)
                req.top_logprobs.append([(int(i), float(v)) for i, v in zip(ids, vals)])
            else:
                req.top_logprobs.append([])
        if req.first_token is None:
            req.first_token = now
        req.token_times.append(now)
        req.output.append(token)
        req.next_token = token

    @torch.no_grad()
    def _prefill(self, req: EngineRequest) -> None:
        # The same ops, in the same order, as the tiny model's own greedy engine (tiny_dsa/engine.py).
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
            self.kv.write_prefill(layer, slots, rows)
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
        req.computed_prompt_tokens = n
        self._sample(req, w.logits(x[-1:])[0])

    def _load_remote(self, req: EngineRequest) -> None:
        """P/D consumer: read the prompt's KV into fresh blocks; the last prompt token is fed by the next
        decode step (its KV and logits recomputed here, as vLLM recomputes the last token of a full hit)."""
        assert self.pull is not None
        n = len(req.prompt)
        self._grow(req, n)
        req.bytes_pulled = self.pull(req, list(req.blocks))
        req.slots = [self._slot(req, p) for p in range(n - 1)]
        req.next_token = req.prompt[-1]
        req.external_prompt_tokens = n - 1
        req.computed_prompt_tokens = 1

    @torch.no_grad()
    def _decode_step(self, active: list[int]) -> None:
        c, w, dev = self.c, self.w, self.device
        b = c.max_batch
        tokens = torch.zeros(b, dtype=torch.long)
        pos = torch.zeros(b, dtype=torch.long)
        newest = torch.full((b,), -1, dtype=torch.int32)
        seqs: list[list[int]] = [[] for _ in range(b)]
        for r in active:
            req = self.rows[r]
            assert req is not None and req.next_token is not None
            p = len(req.slots)  # position of the token being fed
            self._grow(req, p + 1)
            tokens[r] = req.next_token
            pos[r] = p
            req.slots.append(self._slot(req, p))
            newest[r] = req.slots[-1]
            seqs[r] = req.slots
        act = torch.tensor(active, dtype=torch.long, device=dev)
        real = torch.tensor([max(active) + 1], dtype=torch.int32, device=dev)
        own_slots = {r: torch.tensor(seqs[r], dtype=torch.long) for r in active}

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
                topk = torch.full((b, c.index_topk), -1, dtype=torch.int32, device=dev)
                # Each row is scored alone, over exactly its own sequence: the shapes (and so the float
                # rounding) of a request's index scores never depend on what else is in the batch. Scored
                # over the longest sequence in the batch, top-k picked other rows at its edge and one build
                # gave other tokens to the same prompt beside live traffic (batch invariance, as the
                # parity gate needs it; runtime/tests/test_cpu_engine_batch_invariance.py).
                for r in active:
                    slots = own_slots[r]
                    scores = w.index_scores(h[r : r + 1], cache[slots][None], layer)[0]
                    k = min(c.index_topk, len(slots))
                    topk[r, :k] = slots[scores.topk(k).indices].to(torch.int32)
                index = self.kv.select(layer, topk, newest, real)
            assert index is not None
            kv, valid = self.kv.gather(layer, index)
            x = x + w.attention(h, pos, kv, valid, layer)
            x = x + w.mlp(x, layer)
            self.kv.finish_layer(layer, newest, real)
        logits = w.logits(x)
        for r in active:
            req = self.rows[r]
            assert req is not None
            self._sample(req, logits[r])
        if self.on_step is not None:
            self.on_step([self.rows[r] for r in active], len(active))  # type: ignore[misc]
