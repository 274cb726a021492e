"""Reference resolve / swap-in: the exact output every kernel must reproduce.

One request row ``r`` (``r < num_real_reqs``) owns hot rows
``[r * region_stride, r * region_stride + region_stride)``. Slots ``0..H-1`` are the LRU working set,
slot ``H`` holds the newest token. Per row the resolve does, in order:

1. Columns: ``g < 0`` -> -1; ``g == newest[r]`` -> hot slot ``H``; every other column wants a hot copy
   of ``g``. Only the first column holding a given ``g`` can hit; later duplicates always miss and load
   a second copy.
2. LRU walk: position ``i`` holds slot ``s = lru[i]``. The position is *valid* when ``0 <= s < H`` and it
   is the first position holding ``s`` (corrupted LRUs may repeat a slot). A valid position whose
   ``dgi[s]`` is wanted is a hit; when several valid positions hold the same ``g``, the most recent
   (largest ``i``) wins. All other positions are evictable, oldest first.
3. The m-th missing column (column order) takes the m-th evictable position. If that position is
   invalid (tripwire), the column resolves to -1 and nothing is copied. Otherwise ``dgi[s] = g`` (or -1
   when ``g`` is beyond the host pool, so the slot re-misses later) and the column gets hot row
   ``base + s`` with ``miss_mask = 1``. Misses past the evictables resolve to -1.
4. New LRU: ``[unused evictables, oldest first] + [evictables just filled, in miss order] +
   [hits, in their old order]``.
5. Plan: the ``plan_count[r]`` filled misses as ``(src=g, dst=hot row or -1)``, ordered by ``src``
   (ties in miss order) so that adjacent host rows are copied as one contiguous read; the copy
   writes ``host_pool[g]`` (or zeros when ``g`` is outside the pool) into ``hot[dst]``.

Rows at or beyond ``num_real_reqs`` are left untouched, plan entries past ``plan_count`` too.
Counters: ``counters[0] += hits``, ``counters[1] += misses`` (every column that wanted a load).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ResolveState", "gather_plan_ref", "resolve_ref", "resolve_row_ref", "swap_in_ref"]


@dataclass
class ResolveState:
    """Arrays a resolve reads and writes, shapes as the kernels take them.

    ``dgi``: int32 [B, H]; ``lru``: int16 [B, H]; ``hot_rows``, ``plan_src``, ``plan_dst``: int32 [B, K];
    ``plan_count``: int32 [B]; ``counters``: int64 [2]; ``miss_mask``: uint8 [B, K] or None.
    """

    dgi: np.ndarray
    lru: np.ndarray
    hot_rows: np.ndarray
    plan_src: np.ndarray
    plan_dst: np.ndarray
    plan_count: np.ndarray
    counters: np.ndarray
    miss_mask: np.ndarray | None = None


def resolve_row_ref(
    topk_row: np.ndarray,
    newest: int,
    dgi_row: np.ndarray,
    lru_row: np.ndarray,
    *,
    base: int,
    pool_rows: int,
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], np.ndarray, int, int]:
    """Resolve one request row. ``dgi_row`` is updated in place.

    Returns ``(hot_rows, miss_mask, plan, new_lru, hits, misses)`` where ``plan`` lists ``(src, dst)``.
    """
    hot_slot = len(dgi_row)  # H: the reserved newest slot
    k = len(topk_row)
    out = np.full(k, -1, dtype=np.int32)
    mask = np.zeros(k, dtype=np.uint8)

    first_col: dict[int, int] = {}
    for c, g in enumerate(int(x) for x in topk_row):
        if g < 0:
            continue
        if g == newest:
            out[c] = base + hot_slot
            continue
        first_col.setdefault(g, c)

    lru = [int(s) for s in lru_row]
    seen: set[int] = set()
    valid = []
    for s in lru:
        ok = 0 <= s < hot_slot and s not in seen
        if ok:
            seen.add(s)
        valid.append(ok)

    hit_pos: dict[int, int] = {}  # g -> most recent valid position holding it
    for i, s in enumerate(lru):
        if valid[i]:
            g = int(dgi_row[s])
            if g >= 0 and g in first_col:
                hit_pos[g] = i
    hit_positions = set(hit_pos.values())
    for g, i in hit_pos.items():
        out[first_col[g]] = base + lru[i]

    hits = [i for i in range(hot_slot) if i in hit_positions]
    evictable = [i for i in range(hot_slot) if i not in hit_positions]
    misses = [
        c
        for c, g in enumerate(int(x) for x in topk_row)
        if g >= 0 and g != newest and not (first_col[g] == c and g in hit_pos)
    ]

    n_fill = min(len(misses), len(evictable))
    plan: list[tuple[int, int]] = []
    for m in range(n_fill):
        c = misses[m]
        g = int(topk_row[c])
        i = evictable[m]
        if not valid[i]:
            plan.append((g, -1))
            continue
        s = lru[i]
        dgi_row[s] = g if g < pool_rows else -1
        out[c] = base + s
        mask[c] = 1
        plan.append((g, base + s))

    plan.sort(key=lambda entry: entry[0])  # stable: equal sources keep miss order
    order = evictable[n_fill:] + evictable[:n_fill] + hits
    new_lru = np.array([lru[i] for i in order], dtype=np.int16)
    return out, mask, plan, new_lru, len(hit_pos), len(misses)


def resolve_ref(
    topk: np.ndarray,
    newest: np.ndarray,
    num_real_reqs: int,
    state: ResolveState,
    *,
    region_stride: int,
    pool_rows: int,
) -> None:
    """Resolve every real row in place (the exact output of ``hisparse::resolve``)."""
    rows = min(int(num_real_reqs), topk.shape[0])
    for r in range(max(rows, 0)):
        out, mask, plan, new_lru, hits, misses = resolve_row_ref(
            topk[r], int(newest[r]), state.dgi[r], state.lru[r],
            base=r * region_stride, pool_rows=pool_rows,
        )
        state.hot_rows[r] = out
        if state.miss_mask is not None:
            state.miss_mask[r] = mask
        state.lru[r] = new_lru
        for m, (src, dst) in enumerate(plan):
            state.plan_src[r, m] = src
            state.plan_dst[r, m] = dst
        state.plan_count[r] = len(plan)
        state.counters[0] += hits
        state.counters[1] += misses


def gather_plan_ref(
    host_pool: np.ndarray,
    hot: np.ndarray,
    plan_src: np.ndarray,
    plan_dst: np.ndarray,
    plan_count: np.ndarray,
    num_real_reqs: int,
) -> None:
    """Replay a plan: ``hot[dst] = host_pool[src]`` (zeros when ``src`` is outside the pool).

    ``host_pool``: uint8 [P, W]; ``hot``: uint8 [N, W]. Entries with ``dst`` outside ``[0, N)`` are
    skipped; ``plan_count`` is clamped to ``[0, K]``; rows at or beyond ``num_real_reqs`` are skipped.
    """
    pool_rows = host_pool.shape[0]
    k = plan_src.shape[1]
    rows = min(int(num_real_reqs), plan_src.shape[0])
    for r in range(max(rows, 0)):
        n = min(max(int(plan_count[r]), 0), k)
        for m in range(n):
            dst = int(plan_dst[r, m])
            src = int(plan_src[r, m])
            if not 0 <= dst < hot.shape[0]:
                continue
            if 0 <= src < pool_rows:
                hot[dst] = host_pool[src]
            else:
                hot[dst] = 0


def swap_in_ref(
    topk: np.ndarray,
    newest: np.ndarray,
    num_real_reqs: int,
    state: ResolveState,
    host_pool: np.ndarray,
    hot: np.ndarray,
    *,
    region_stride: int,
) -> None:
    """Resolve, then copy the plan into ``hot`` (the exact output of ``hisparse::swap_in``)."""
    resolve_ref(topk, newest, num_real_reqs, state,
                region_stride=region_stride, pool_rows=host_pool.shape[0])
    gather_plan_ref(host_pool, hot, state.plan_src, state.plan_dst, state.plan_count, num_real_reqs)
