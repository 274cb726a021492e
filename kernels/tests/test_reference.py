"""The NumPy reference against hand-worked cases, and its invariants (CPU, no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hisparse_kernels.reference import (
    ResolveState,
    backup_newest_rows_ref,
    gather_plan_ref,
    invalidate_slots_ref,
    region_stride_for,
    resolve_ref,
    resolve_row_ref,
    swap_in_ref,
)

POISON = -999


def make_state(b: int, k: int, h: int, *, mask: bool = True) -> ResolveState:
    return ResolveState(
        dgi=np.full((b, h), -1, np.int32),
        lru=np.tile(np.arange(h, dtype=np.int16), (b, 1)),
        hot_rows=np.full((b, k), POISON, np.int32),
        plan_src=np.full((b, k), POISON, np.int32),
        plan_dst=np.full((b, k), POISON, np.int32),
        plan_count=np.full(b, POISON, np.int32),
        counters=np.zeros(2, np.int64),
        miss_mask=np.full((b, k), 7, np.uint8) if mask else None,
    )


def test_region_stride_rounds_h_plus_one_to_128() -> None:
    assert region_stride_for(127) == 128
    assert region_stride_for(128) == 256
    assert region_stride_for(4096) == 4224
    with pytest.raises(ValueError):
        region_stride_for(32767)


def test_hit_miss_newest_and_padding_hand_worked() -> None:
    # LRU oldest first: slot2 (empty), slot0 (g10), slot3 (g12), slot1 (g11)
    dgi = np.array([10, 11, -1, 12], np.int32)
    lru = np.array([2, 0, 3, 1], np.int16)
    out, mask, plan, new_lru, hits, misses = resolve_row_ref(
        np.array([11, 20, 50, -1], np.int32), 50, dgi, lru, base=0, pool_rows=100)
    assert out.tolist() == [1, 2, 4, -1]  # hit slot 1, miss into oldest evictable slot 2, newest -> H
    assert mask.tolist() == [0, 1, 0, 0]
    assert plan == [(20, 2)]
    assert new_lru.tolist() == [0, 3, 2, 1]  # unused evictables, just filled, hits
    assert dgi.tolist() == [10, 11, 20, 12]
    assert (hits, misses) == (1, 1)


def test_duplicates_and_out_of_pool_hand_worked() -> None:
    dgi = np.array([7, 7, -1, -1], np.int32)  # two slots hold g=7 (a second copy)
    lru = np.array([0, 1, 2, 3], np.int16)
    out, mask, plan, new_lru, hits, misses = resolve_row_ref(
        np.array([7, 7, 999, -1], np.int32), -1, dgi, lru, base=128, pool_rows=100)
    # the most recent copy (slot 1) serves the first column; the duplicate column loads again
    assert out.tolist() == [129, 128, 130, -1]
    assert mask.tolist() == [0, 1, 1, 0]
    assert plan == [(7, 128), (999, 130)]
    assert dgi.tolist() == [7, 7, -1, -1]  # g=999 is beyond the pool: the slot stays empty
    assert new_lru.tolist() == [3, 0, 2, 1]
    assert (hits, misses) == (1, 2)


def test_corrupted_lru_tripwires_hand_worked() -> None:
    dgi = np.array([3, 4, -1, -1], np.int32)
    lru = np.array([5, 1, 1, 0], np.int16)  # 5 is out of range, slot 1 repeats
    out, mask, plan, new_lru, hits, misses = resolve_row_ref(
        np.array([4, 8, 9, 3], np.int32), -1, dgi, lru, base=0, pool_rows=100)
    assert out.tolist() == [1, -1, -1, 0]  # misses land on invalid entries: -1, no copy
    assert mask.tolist() == [0, 0, 0, 0]
    assert plan == [(8, -1), (9, -1)]
    assert new_lru.tolist() == [5, 1, 1, 0]
    assert dgi.tolist() == [3, 4, -1, -1]
    assert (hits, misses) == (2, 2)


def test_padding_rows_untouched_and_plan_tail_untouched() -> None:
    st_ = make_state(3, 2, 4)
    topk = np.array([[1, 2], [3, -1], [5, 6]], np.int32)
    newest = np.array([-1, -1, -1], np.int32)
    resolve_ref(topk, newest, 2, st_, region_stride=128, pool_rows=10)
    assert st_.hot_rows[2].tolist() == [POISON, POISON]
    assert st_.plan_count[2] == POISON
    assert st_.lru[2].tolist() == [0, 1, 2, 3]
    assert st_.hot_rows[1].tolist() == [128, -1]
    assert st_.plan_count[1] == 1 and st_.plan_src[1, 1] == POISON  # past plan_count: untouched
    assert st_.counters.tolist() == [0, 3]


def test_gather_plan_copies_zeros_and_skips() -> None:
    pool = np.arange(4 * 16, dtype=np.uint8).reshape(4, 16)
    hot = np.full((6, 16), 0xAB, np.uint8)
    src = np.array([[2, 9, 1, 0], [3, 3, 3, 3]], np.int32)
    dst = np.array([[0, 1, -1, 7], [5, 4, 4, 4]], np.int32)
    count = np.array([4, 1], np.int32)
    gather_plan_ref(pool, hot, src, dst, count, 2)
    assert (hot[0] == pool[2]).all()
    assert (hot[1] == 0).all()  # source beyond the pool: zeros
    assert (hot[5] == pool[3]).all()
    assert (hot[[2, 3, 4]] == 0xAB).all()  # dst -1, dst out of range, past count


def test_backup_newest_rows_clamps_and_skips() -> None:
    rs, h = 8, 5
    hot = np.arange(4 * rs * 16, dtype=np.int64).astype(np.uint8).reshape(4 * rs, 16)
    pool = np.zeros((10, 16), np.uint8)
    newest = np.array([3, -1, 12, 7, 1, 2], np.int32)  # longer than the hot buffer's 4 rows
    backup_newest_rows_ref(hot, pool, newest, 6, region_stride=rs, hot_slot=h)
    assert (pool[3] == hot[0 * rs + h]).all()
    assert (pool[7] == hot[3 * rs + h]).all()
    assert (pool[[0, 1, 2, 4, 5, 6, 8, 9]] == 0).all()  # -1, out of pool, rows beyond the buffer


def test_invalidate_slots_all_rows() -> None:
    dgi = np.array([[0, 15, 16, 33, -1], [31, 32, 47, 48, 5]], np.int32)
    invalidate_slots_ref(dgi, np.array([0, 2, -4], np.int32), block_size=16)
    assert dgi.tolist() == [[-1, -1, 16, -1, -1], [31, -1, -1, 48, -1]]


# ----------------------------------------------------------------------------- invariants


@st.composite
def resolve_case(draw: st.DrawFn) -> tuple:
    h = draw(st.integers(1, 24))
    k = draw(st.integers(1, h))
    universe = draw(st.integers(1, 40))
    dgi = np.array(draw(st.lists(st.integers(-1, universe), min_size=h, max_size=h)), np.int32)
    corrupt = draw(st.booleans())
    if corrupt:
        lru = np.array(draw(st.lists(st.integers(-2, h + 2), min_size=h, max_size=h)), np.int16)
    else:
        lru = np.array(draw(st.permutations(list(range(h)))), np.int16)
    topk = np.array(draw(st.lists(st.integers(-1, universe + 3), min_size=k, max_size=k)), np.int32)
    newest = draw(st.integers(-1, universe + 3))
    return topk, newest, dgi, lru, universe


@settings(max_examples=300, deadline=None)
@given(resolve_case())
def test_resolve_invariants(case: tuple) -> None:
    topk, newest, dgi, lru, pool_rows = case
    h = len(dgi)
    base = 256
    dgi_before = dgi.copy()
    valid_lru = sorted(int(s) for s in lru) == list(range(h))
    out, mask, plan, new_lru, hits, misses = resolve_row_ref(
        topk, newest, dgi, lru, base=base, pool_rows=pool_rows)

    assert sorted(new_lru.tolist()) == sorted(lru.tolist())  # the LRU is permuted, never rewritten
    wanted = [(c, int(g)) for c, g in enumerate(topk) if g >= 0 and g != newest]
    assert hits + misses == len(wanted)
    assert len(plan) == misses if valid_lru else len(plan) <= misses
    assert int(mask.sum()) == sum(1 for _, dst in plan if dst >= 0)
    for c, g in enumerate(topk):
        if g < 0:
            assert out[c] == -1
        elif g == newest:
            assert out[c] == base + h
    used = [int(out[c]) - base for c, _ in wanted if out[c] >= 0]
    assert len(used) == len(set(used))  # no two columns share a hot slot
    for c, g in wanted:
        if out[c] >= 0:
            s = int(out[c]) - base
            assert 0 <= s < h
            if mask[c]:
                assert dgi[s] == (g if g < pool_rows else -1)
            else:
                assert dgi_before[s] == g == dgi[s]  # a hit serves the slot that held g
    if valid_lru:
        assert all(out[c] >= 0 for c, _ in wanted)
        # hits move to the most recent end, in their old order
        hit_slots = [int(out[c]) - base for c, _ in wanted if out[c] >= 0 and not mask[c]]
        tail = new_lru[h - hits:].tolist() if hits else []
        assert sorted(tail) == sorted(hit_slots)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_multi_step_hot_rows_always_hold_the_wanted_row(seed: int) -> None:
    """Across many steps, every resolved column points at a hot row holding exactly the host row it
    asked for (the property attention relies on), including after out-of-pool misses."""
    rng = np.random.default_rng(seed)
    b, k, h, w = 3, int(rng.integers(1, 6)), 0, 16
    h = k + int(rng.integers(0, 6))
    pool_rows = 30
    rs = region_stride_for(h)
    pool = rng.integers(0, 256, size=(pool_rows, w), dtype=np.uint8)
    hot = np.zeros((b * rs, w), np.uint8)
    st_ = make_state(b, k, h)
    for _ in range(25):
        topk = rng.integers(-1, pool_rows + 3, size=(b, k)).astype(np.int32)
        newest = rng.integers(-1, pool_rows, size=b).astype(np.int32)
        real = int(rng.integers(0, b + 1))
        for r in range(real):  # the newest row is written to slot H before attention reads it
            if newest[r] >= 0:
                hot[r * rs + h] = pool[newest[r]]
        swap_in_ref(topk, newest, real, st_, pool, hot, region_stride=rs)
        for r in range(real):
            for c in range(k):
                g = int(topk[r, c])
                row = int(st_.hot_rows[r, c])
                if g < 0:
                    assert row == -1
                    continue
                assert row >= 0
                expected = pool[g] if g < pool_rows else np.zeros(w, np.uint8)
                assert (hot[row] == expected).all()
