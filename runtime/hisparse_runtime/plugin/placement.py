"""Host-pool placement for vLLM's HiSparse: pack the blocks a decode step reads into few GiB.

vLLM 0.33 keeps HiSparse's host KV layer-major (``[layers, blocks, block_size, row]``) and hands
host blocks out of a plain ``BlockPool``: freed blocks with a prefix hash go to the tail of its free
list and are reused least recently freed first. Once the pool has filled with cached blocks, a
request's blocks come from anywhere in a layer's span (2.6 GiB for 160 GiB over 61 layers), and each
layer's swap-in reads rows spread over all of it. On the lent H200 the copy from host memory loses
rate as the GiB one kernel touches grow (0.87 x memcpy at 1 GiB, 0.5 at 4 GiB for uniformly
scattered rows; ``kernels/results/NOTES.md``).

The ``pack`` policy replaces the host pool's free list by one that hands out the lowest free block id
first (ids map to addresses), so the live blocks of running requests sit at the bottom of each
layer's span and a step's misses touch only the GiB that hold live KV. Blocks without a prefix hash
are taken before cached ones, as vLLM does; when only cached blocks are free the lowest one is
evicted, not the least recently freed one, which trades prefix-cache retention order for locality.
Measured (kernels runs 30-32): a simulated fleet's step touches 1.21 GiB of a layer instead of 1.93,
but swap-in of those steps ran at the same rate as with vLLM's order (0.82-0.87 x memcpy either
way), so the policy is opt-in.

``install(policy)`` patches ``HiSparseSourceManager.bind_host_pool`` (the one place vLLM creates
the host pool); the vLLM general plugin calls it with ``HISPARSE_HOST_PLACEMENT`` (``pack`` or
``vllm``, the stock behaviour and the default). Only the free list's order changes: the pool's
accounting, prefix hits (``touch``), eviction of hashes and events are vLLM's own code.
"""

from __future__ import annotations

import heapq
import logging
import os
from typing import Any

__all__ = ["ENV", "POLICIES", "hook_missing", "install", "installed_policy", "make_packed_queue", "policy_from_env"]

log = logging.getLogger(__name__)

ENV = "HISPARSE_HOST_PLACEMENT"
POLICIES = ("pack", "vllm")
_PATCH_MARK = "_hisparse_placement"


def policy_from_env(environ: "dict[str, str] | os._Environ[str]" = os.environ) -> str:
    """The policy named by ``HISPARSE_HOST_PLACEMENT`` (unset: ``vllm``). Raises on other values."""
    value = environ.get(ENV, "vllm").strip() or "vllm"
    if value not in POLICIES:
        raise ValueError(
            f"{ENV}={value!r} is not a host placement policy; use one of {', '.join(POLICIES)} "
            "(pack: lowest free host block first; vllm: vLLM's own order)"
        )
    return value


def hook_missing() -> str | None:
    """What of vLLM's host-pool code the ``pack`` policy relies on is absent (None: all present)."""
    try:
        from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue
        from vllm.v1.core.single_type_kv_cache_manager import HiSparseSourceManager
    except Exception as exc:  # noqa: BLE001 - any import failure means the hook is not there
        return f"vLLM's HiSparse host manager ({type(exc).__name__}: {exc})"
    for owner, names in ((HiSparseSourceManager, ("bind_host_pool",)),
                         (FreeKVCacheBlockQueue, ("popleft", "popleft_n", "remove", "append", "append_n",
                                                  "prepend_n", "get_all_free_blocks"))):
        for name in names:
            if not callable(getattr(owner, name, None)):
                return f"{owner.__name__}.{name}"
    return None


def make_packed_queue(blocks: list[Any]) -> Any:
    """A ``FreeKVCacheBlockQueue`` over ``blocks`` whose pops take the lowest block id first."""
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    class PackedFreeBlockQueue(FreeKVCacheBlockQueue):
        """vLLM's doubly linked free list, popped lowest id first (uncached blocks before cached).

        The list itself is kept exactly as vLLM keeps it (``remove``, ``append``, iteration), so every
        caller outside the pops sees the same structure. Two heaps of block ids index it lazily: an
        entry is valid while its block is still linked (``prev_free_block`` set).
        """

        def __init__(self, free: list[Any]) -> None:
            super().__init__(free)
            self._by_id: dict[int, Any] = {}
            self._uncached: list[int] = []
            self._any: list[int] = []
            self._push(free)

        def _push(self, blocks: list[Any]) -> None:
            for block in blocks:
                self._by_id[block.block_id] = block
                heapq.heappush(self._any, block.block_id)
                if block.block_hash is None:
                    heapq.heappush(self._uncached, block.block_id)
            if len(self._any) > 4 * max(self.num_free_blocks, 1024):
                self._compact()

        def _compact(self) -> None:
            free = self.get_all_free_blocks()
            self._any = sorted(b.block_id for b in free)
            self._uncached = sorted(b.block_id for b in free if b.block_hash is None)

        def _linked(self, block_id: int) -> Any | None:
            block = self._by_id.get(block_id)
            return block if block is not None and block.prev_free_block is not None else None

        def _pop_lowest(self) -> Any:
            while self._uncached:
                block = self._linked(heapq.heappop(self._uncached))
                if block is not None and block.block_hash is None:
                    self.remove(block)
                    return block
            while self._any:
                block = self._linked(heapq.heappop(self._any))
                if block is not None:
                    self.remove(block)
                    return block
            return super().popleft()  # raises "No free blocks available" like vLLM's

        def popleft(self) -> Any:
            return self._pop_lowest()

        def popleft_n(self, n: int) -> list[Any]:
            assert self.num_free_blocks >= n
            return [self._pop_lowest() for _ in range(n)]

        def append(self, block: Any) -> None:
            super().append(block)
            self._push([block])

        def append_n(self, blocks: list[Any]) -> None:
            super().append_n(blocks)
            self._push(list(blocks))

        def prepend_n(self, blocks: list[Any]) -> None:
            super().prepend_n(blocks)
            self._push(list(blocks))

    return PackedFreeBlockQueue(blocks)


def apply(pool: Any, policy: str) -> None:
    """Give ``pool`` (a vLLM ``BlockPool``) the free-list order of ``policy``."""
    if policy == "vllm":
        return
    if policy != "pack":
        raise ValueError(f"unknown host placement policy {policy!r}; use one of {', '.join(POLICIES)}")
    free = pool.free_block_queue.get_all_free_blocks()
    pool.free_block_queue = make_packed_queue(free)


def installed_policy() -> str | None:
    """The policy ``install`` patched into vLLM's host pool in this process (None: not installed)."""
    from vllm.v1.core.single_type_kv_cache_manager import HiSparseSourceManager

    return getattr(HiSparseSourceManager.bind_host_pool, _PATCH_MARK, None)


def install(policy: str) -> bool:
    """Patch vLLM's HiSparse host pool creation to use ``policy``. Idempotent; returns whether a
    patch is in place (``vllm`` patches nothing). Raises ImportError if this vLLM has no HiSparse
    host manager (the hook this policy needs)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown host placement policy {policy!r}; use one of {', '.join(POLICIES)}")
    from vllm.v1.core.single_type_kv_cache_manager import HiSparseSourceManager

    current = getattr(HiSparseSourceManager.bind_host_pool, _PATCH_MARK, None)
    original = getattr(HiSparseSourceManager.bind_host_pool, "_hisparse_original", None)
    if original is None:
        original = HiSparseSourceManager.bind_host_pool
    if policy == "vllm":
        HiSparseSourceManager.bind_host_pool = original
        return False
    if current == policy:
        return True

    def bind_host_pool(self: Any, num_blocks: int) -> None:
        original(self, num_blocks)
        apply(self.block_pool, policy)
        log.info("HiSparse host pool: %d blocks, placement %s", num_blocks, policy)

    setattr(bind_host_pool, _PATCH_MARK, policy)
    setattr(bind_host_pool, "_hisparse_original", original)
    HiSparseSourceManager.bind_host_pool = bind_host_pool
    return True
