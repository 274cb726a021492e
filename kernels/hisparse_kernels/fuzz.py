"""Randomized checks of the compiled ops against the reference, shared by the GPU tests and the
sanitizer script. Every check draws fresh inputs, poisons every output, runs the op and the
reference on copies of the same inputs, and compares every byte of every written tensor."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hisparse_kernels import reference as ref
from hisparse_kernels.reference.layout import region_stride_for

__all__ = [
    "ResolveCase",
    "check_backup_newest_rows",
    "check_gather_plan",
    "check_invalidate_slots",
    "check_swap_in",
    "random_resolve_case",
]

POISON_I32 = -999
POISON_U8 = 0xA5


@dataclass
class ResolveCase:
    topk: np.ndarray      # int32 [B, K]
    newest: np.ndarray    # int32 [B]
    dgi: np.ndarray       # int32 [B, H]
    lru: np.ndarray       # int16 [B, H]
    num_real: int
    pool_rows: int
    row_bytes: int

    @property
    def h(self) -> int:
        return self.dgi.shape[1]


def random_resolve_case(
    rng: np.random.Generator,
    *,
    b: int,
    k: int,
    h: int,
    row_bytes: int,
    pool_rows: int,
    corrupt: bool = False,
    seq_len: int | None = None,
) -> ResolveCase:
    """A step of a batch: each row's sequence is ``seq_len`` (random if None, shorter or longer than
    H) slots of the pool; its top-k draws from them with -1 padding, duplicates, the newest slot and a
    few out-of-pool ids; its hot state holds part of the sequence (from earlier steps)."""
    topk = np.full((b, k), -1, np.int32)
    newest = np.full(b, -1, np.int32)
    dgi = np.full((b, h), -1, np.int32)
    lru = np.tile(np.arange(h, dtype=np.int16), (b, 1))
    for r in range(b):
        n = seq_len if seq_len is not None else int(rng.integers(1, 3 * h + 2))
        n = max(1, min(n, pool_rows))
        seq = rng.choice(pool_rows, size=n, replace=False).astype(np.int32)
        newest[r] = seq[-1] if rng.random() < 0.9 else -1
        take = min(k, n)
        cols = rng.choice(seq, size=take, replace=False)
        topk[r, :take] = cols
        if rng.random() < 0.3:  # top-k tie overflow: a -1 tail
            tail = int(rng.integers(0, take + 1))
            topk[r, tail:] = -1
        if rng.random() < 0.3:  # -1 anywhere
            topk[r, rng.random(k) < 0.1] = -1
        if rng.random() < 0.3 and k > 1:  # duplicates
            i, j = rng.choice(k, size=2, replace=False)
            topk[r, i] = topk[r, j]
        if rng.random() < 0.2:  # ids beyond the host pool
            topk[r, int(rng.integers(0, k))] = pool_rows + int(rng.integers(0, 1000))
        held = rng.choice(seq, size=min(n, int(rng.integers(0, h + 1))), replace=False)
        slots = rng.choice(h, size=len(held), replace=False)
        dgi[r, slots] = held
        lru[r] = rng.permutation(h).astype(np.int16)
        if corrupt:
            if rng.random() < 0.5:
                lru[r, rng.random(h) < 0.05] = rng.integers(-5, h + 5, dtype=np.int16)
            if rng.random() < 0.5:
                dgi[r, rng.random(h) < 0.05] = int(seq[0])  # several slots claim one id
            if rng.random() < 0.3:
                dgi[r, int(rng.integers(0, h))] = pool_rows + 7  # stale id beyond the pool
    num_real = int(rng.integers(0, b + 1)) if rng.random() < 0.5 else b
    return ResolveCase(topk, newest, dgi, lru, num_real, pool_rows, row_bytes)


def _diff(name: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = np.argwhere(got != want) if got.shape == want.shape else "shape"
        raise AssertionError(f"{name} differs from the reference at {bad[:8] if not isinstance(bad, str) else bad}"
                             f" ({0 if isinstance(bad, str) else len(bad)} elements)")


def check_swap_in(case: ResolveCase, rng: np.random.Generator, *, with_mask: bool = True,
                  resolve_only: bool = False) -> dict[str, int]:
    """Run ``swap_in`` (or ``resolve``) on CUDA and the reference; compare every output."""
    import torch

    from hisparse_kernels.host_pool import HostPool
    from hisparse_kernels.ops import resolve, swap_in

    dev = torch.device("cuda")
    b, k = case.topk.shape
    h = case.h
    rs = region_stride_for(h)
    w = case.row_bytes
    with HostPool(1, case.pool_rows, w) as pool:
        host = pool.layer(0)
        host.copy_(torch.from_numpy(rng.integers(0, 256, size=(case.pool_rows, w), dtype=np.uint8)))
        hot_init = rng.integers(0, 256, size=(b * rs, w), dtype=np.uint8)
        state = ref.ResolveState(
            dgi=case.dgi.copy(), lru=case.lru.copy(),
            hot_rows=np.full((b, k), POISON_I32, np.int32),
            plan_src=np.full((b, k), POISON_I32, np.int32),
            plan_dst=np.full((b, k), POISON_I32, np.int32),
            plan_count=np.full(b, POISON_I32, np.int32),
            counters=np.array([5, 9], np.int64),
            miss_mask=np.full((b, k), POISON_U8, np.uint8) if with_mask else None,
        )
        t = {name: torch.from_numpy(getattr(state, name).copy()).to(dev)
             for name in ("dgi", "lru", "hot_rows", "plan_src", "plan_dst", "plan_count", "counters")}
        mask_t = torch.from_numpy(state.miss_mask.copy()).to(dev) if with_mask else None
        hot_t = torch.from_numpy(hot_init.copy()).to(dev)
        topk_t = torch.from_numpy(case.topk).to(dev)
        newest_t = torch.from_numpy(case.newest).to(dev)
        num_real_t = torch.tensor([case.num_real], dtype=torch.int32, device=dev)
        hot_ref = hot_init.copy()
        if resolve_only:
            resolve(topk_t, newest_t, num_real_t, t["dgi"], t["lru"], t["hot_rows"], t["plan_src"],
                    t["plan_dst"], t["plan_count"], t["counters"], mask_t,
                    region_stride=rs, pool_rows=case.pool_rows)
            ref.resolve_ref(case.topk, case.newest, case.num_real, state, region_stride=rs,
                            pool_rows=case.pool_rows)
        else:
            swap_in(topk_t, newest_t, num_real_t, t["dgi"], t["lru"], t["hot_rows"], t["plan_src"],
                    t["plan_dst"], t["plan_count"], t["counters"], mask_t, host, hot_t, region_stride=rs)
            ref.swap_in_ref(case.topk, case.newest, case.num_real, state, host.numpy(), hot_ref,
                            region_stride=rs)
        torch.cuda.synchronize()
        for name in ("dgi", "lru", "hot_rows", "plan_src", "plan_dst", "plan_count", "counters"):
            _diff(name, t[name].cpu().numpy(), getattr(state, name))
        if with_mask:
            _diff("miss_mask", mask_t.cpu().numpy(), state.miss_mask)
        _diff("hot", hot_t.cpu().numpy(), hot_ref)
    return {"hits": int(state.counters[0] - 5), "misses": int(state.counters[1] - 9)}


def check_gather_plan(rng: np.random.Generator, *, b: int, k: int, row_bytes: int, pool_rows: int,
                      hot_rows: int, max_blocks: int = 0, runs: bool = False) -> None:
    """Random plans (unique destinations, out-of-pool and -1 sources, bad counts) on CUDA vs reference.

    ``runs``: each row's sources are sorted runs of adjacent slots (with repeats, the pool's last
    slots and invalid slots mixed in), the shape resolve's plans have, where adjacent rows merge."""
    import torch

    from hisparse_kernels.host_pool import HostPool
    from hisparse_kernels.ops import gather_plan

    dev = torch.device("cuda")
    src = rng.integers(-2, pool_rows + 50, size=(b, k)).astype(np.int32)
    if runs:
        for r in range(b):
            starts = rng.integers(-3, pool_rows + 3, size=k)
            lengths = rng.integers(1, 9, size=k)
            row = np.concatenate([s + np.arange(n) for s, n in zip(starts, lengths)])[:k]
            src[r] = np.sort(row.astype(np.int64).astype(np.uint32)).astype(np.int32)  # the plan's order
    dst = rng.permutation(max(hot_rows + 20, b * k))[: b * k].reshape(b, k).astype(np.int32) - 10
    count = rng.integers(-2, k + 5, size=b).astype(np.int32)
    num_real = int(rng.integers(0, b + 1))
    with HostPool(1, pool_rows, row_bytes) as pool:
        host = pool.layer(0)
        host.copy_(torch.from_numpy(rng.integers(0, 256, size=(pool_rows, row_bytes), dtype=np.uint8)))
        hot_init = rng.integers(0, 256, size=(hot_rows, row_bytes), dtype=np.uint8)
        hot_t = torch.from_numpy(hot_init.copy()).to(dev)
        gather_plan(host, hot_t, torch.from_numpy(src).to(dev), torch.from_numpy(dst).to(dev),
                    torch.from_numpy(count).to(dev), torch.tensor([num_real], dtype=torch.int32, device=dev),
                    max_blocks=max_blocks)
        ref.gather_plan_ref(host.numpy(), hot_init, src, dst, count, num_real)
        torch.cuda.synchronize()
        _diff("hot", hot_t.cpu().numpy(), hot_init)


def check_backup_newest_rows(rng: np.random.Generator, *, b: int, h: int, row_bytes: int,
                             pool_rows: int, extra_newest: int) -> None:
    """Backup with unique slots (some -1 or beyond the pool) and ``newest`` longer than the buffer."""
    import torch

    from hisparse_kernels.host_pool import HostPool
    from hisparse_kernels.ops import backup_newest_rows

    dev = torch.device("cuda")
    rs = region_stride_for(h)
    n = b + extra_newest
    newest = rng.permutation(pool_rows + 40)[:n].astype(np.int32)
    newest[rng.random(n) < 0.1] = -1
    num_real = int(rng.integers(0, n + 1))
    with HostPool(1, pool_rows, row_bytes) as pool:
        host = pool.layer(0)
        pool_init = rng.integers(0, 256, size=(pool_rows, row_bytes), dtype=np.uint8)
        host.copy_(torch.from_numpy(pool_init))
        hot = rng.integers(0, 256, size=(b * rs, row_bytes), dtype=np.uint8)
        backup_newest_rows(torch.from_numpy(hot).to(dev), host, torch.from_numpy(newest).to(dev),
                           torch.tensor([num_real], dtype=torch.int32, device=dev),
                           region_stride=rs, hot_slot=h)
        torch.cuda.synchronize()
        ref.backup_newest_rows_ref(hot, pool_init, newest, num_real, region_stride=rs, hot_slot=h)
        _diff("host_pool", host.numpy().copy(), pool_init)


def check_invalidate_slots(rng: np.random.Generator, *, b: int, h: int, num_blocks: int,
                           block_size: int, pool_blocks: int) -> None:
    import torch

    from hisparse_kernels.ops import invalidate_slots

    dev = torch.device("cuda")
    dgi = rng.integers(-1, pool_blocks * block_size, size=(b, h)).astype(np.int32)
    blocks = rng.integers(-3, pool_blocks, size=num_blocks).astype(np.int32)
    dgi_t = torch.from_numpy(dgi.copy()).to(dev)
    invalidate_slots(dgi_t, torch.from_numpy(blocks).to(dev), block_size=block_size)
    ref.invalidate_slots_ref(dgi, blocks, block_size=block_size)
    torch.cuda.synchronize()
    _diff("dgi", dgi_t.cpu().numpy(), dgi)
