"""The reference of vLLM 0.33's HiSparse ops against hand-worked cases and runtime.py's use of them.

runtime.py resolves a step with ``hisparse_resolve_residency`` (request ids, source block table,
attention indices with the HMA block stride, stats, compact swap lists, resident block table), copies
with ``hisparse_gather_compact``, and drops written slots with ``hisparse_invalidate_written_slots``.
The sequence test at the end drives that loop and checks what attention would read.
"""

from __future__ import annotations

import numpy as np
import pytest

from hisparse_kernels.reference.vllm_ops import (
    UnionOverflow,
    VllmResolveArgs,
    attention_index,
    gather_compact_ref,
    gather_plan_ref,
    invalidate_written_slots_ref,
    resolve_residency_ref,
)

POISON = -999


def make_args(
    topk: np.ndarray,
    *,
    hot: int,
    bs: int = 4,
    states: int | None = None,
    host_rows: int = 1000,
    union: int | None = None,
    request_ids: np.ndarray | None = None,
    source_block_table: np.ndarray | None = None,
    source_block_size: int = 0,
    rsi: np.ndarray | None = None,
    resident_block_table: np.ndarray | None = None,
) -> VllmResolveArgs:
    n, k = topk.shape
    nreq = n if request_ids is None else int(request_ids.max()) + 1
    states = states if states is not None else max(nreq, 1)
    blocks = -(-hot // bs)
    # Request q's hot blocks: q * blocks + j + 1 (block 0 unused), so physical rows differ per request.
    hbt = (np.arange(max(nreq, 1))[:, None] * blocks + np.arange(blocks)[None, :] + 1).astype(np.int32)
    return VllmResolveArgs(
        host_rows=host_rows,
        hot_block_size=bs,
        hot_block_table=hbt,
        global_indices=topk.astype(np.int32),
        hot_indices=np.full((n, k), POISON, np.int32),
        device_global_indices=np.full((states, hot), -1, np.int32),
        lru_slots=np.tile(np.arange(hot, dtype=np.int16), (states, 1)),
        request_state_indices=rsi if rsi is not None else np.arange(states, dtype=np.int32),
        region_stride=hot,
        max_union_rows=union if union is not None else hot,
        miss_mask=np.full((n, k), 7, np.int32),
        stats=np.zeros(2, np.uint64),
        attention_indices=np.full((n, k), POISON, np.int32),
        attention_block_stride=bs * 3,
        request_ids=request_ids,
        source_block_table=source_block_table,
        source_block_size=source_block_size,
        resolved_global_indices=np.full((n, k), POISON, np.int32),
        valid_counts=np.full(n, POISON, np.int32),
        swap_host_physical_rows=np.full((n, k), POISON, np.int32),
        swap_device_physical_rows=np.full((n, k), POISON, np.int32),
        swap_counts=np.full(n, POISON, np.int32),
        resident_block_table=resident_block_table,
        resident_block_size=bs if resident_block_table is not None else 0,
    )


def phys(a: VllmResolveArgs, q: int, slot: int) -> int:
    return int(a.hot_block_table[q, slot // a.hot_block_size]) * a.hot_block_size + slot % a.hot_block_size


def test_first_step_misses_fill_oldest_slots_in_column_order() -> None:
    a = make_args(np.array([[30, -1, 10, 20]]), hot=8)
    resolve_residency_ref(a)
    assert a.hot_indices[0].tolist() == [phys(a, 0, 0), -1, phys(a, 0, 1), phys(a, 0, 2)]
    assert a.miss_mask[0].tolist() == [1, 0, 1, 1]
    assert a.device_global_indices[0, :3].tolist() == [30, 10, 20]
    assert a.swap_counts.tolist() == [3]
    assert a.swap_host_physical_rows[0, :3].tolist() == [30, 10, 20]
    assert a.swap_device_physical_rows[0, :3].tolist() == [phys(a, 0, s) for s in range(3)]
    assert a.swap_host_physical_rows[0, 3] == POISON  # past the count: not written
    assert a.valid_counts.tolist() == [3]
    assert a.stats.tolist() == [0, 3]
    # LRU: untaken evictables, then the filled slots in miss order (no hits).
    assert a.lru_slots[0].tolist() == [3, 4, 5, 6, 7, 0, 1, 2]
    assert a.attention_indices[0].tolist() == [attention_index(int(x), 4, 12) for x in a.hot_indices[0]]


def test_second_step_hits_move_to_mru_and_misses_take_oldest_evictable() -> None:
    a = make_args(np.array([[30, 10, 20, 40]]), hot=6)
    resolve_residency_ref(a)  # slots 0..3 hold 30 10 20 40; lru [4 5 0 1 2 3]
    a.global_indices[:] = [[10, 50, 40, 60]]
    a.stats[:] = 0
    resolve_residency_ref(a)
    # Hits 10 (slot 1) and 40 (slot 3); evictables in LRU order: 4 5 0 2 -> 50 takes 4, 60 takes 5.
    assert a.hot_indices[0].tolist() == [phys(a, 0, 1), phys(a, 0, 4), phys(a, 0, 3), phys(a, 0, 5)]
    assert a.miss_mask[0].tolist() == [0, 1, 0, 1]
    assert a.stats.tolist() == [2, 2]
    assert a.lru_slots[0].tolist() == [0, 2, 4, 5, 1, 3]
    assert a.device_global_indices[0].tolist() == [30, 10, 20, 40, 50, 60]


def test_speculative_rows_share_one_union_and_split_the_swap_list() -> None:
    # Two rows of request 0 (spec decode), one of request 1; 20 repeats across request 0's rows.
    topk = np.array([[10, 20, 30], [20, 40, 50], [10, 11, 12]])
    a = make_args(topk, hot=8, request_ids=np.array([0, 0, 1], np.int32))
    resolve_residency_ref(a)
    # Request 0: union 10 20 30 40 50 -> slots 0..4; the second 20 reuses slot 1 (a hit, no mask).
    assert a.hot_indices[1].tolist() == [phys(a, 0, 1), phys(a, 0, 3), phys(a, 0, 4)]
    assert a.miss_mask[:2].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert a.swap_counts.tolist() == [3, 2, 3]
    assert a.swap_host_physical_rows.reshape(-1)[:5].tolist() == [10, 20, 30, 40, 50]
    assert a.swap_host_physical_rows[1, 2] == POISON
    # Request 1 uses its own state row and hot blocks.
    assert a.hot_indices[2].tolist() == [phys(a, 1, s) for s in range(3)]
    assert a.stats.tolist() == [1, 8]


def test_padding_rows_resolve_to_minus_one_and_touch_no_state() -> None:
    rsi = np.array([0, -1], np.int32)
    a = make_args(np.array([[1, 2], [3, 4]]), hot=4, rsi=rsi, states=2)
    a.device_global_indices[1] = [9, 9, 9, 9]
    resolve_residency_ref(a)
    assert a.hot_indices[1].tolist() == [-1, -1]
    assert a.attention_indices[1].tolist() == [-1, -1]
    assert a.resolved_global_indices[1].tolist() == [-1, -1]
    assert (a.valid_counts[1], a.swap_counts[1]) == (0, 0)
    assert a.miss_mask[1].tolist() == [7, 7]  # left as it was
    assert a.device_global_indices[1].tolist() == [9, 9, 9, 9]
    # runtime.py marks padding with request id -1: same result.
    b = make_args(np.array([[1, 2], [3, 4]]), hot=4, request_ids=np.array([0, -1], np.int32))
    b.source_block_table = np.array([[0, 1]], np.int32)
    b.source_block_size = 4
    resolve_residency_ref(b)
    assert b.hot_indices[1].tolist() == [-1, -1]


def test_source_block_table_translates_and_masks_null_and_out_of_range() -> None:
    sbt = np.array([[5, 0, 7]], np.int32)  # block 1 is the null block
    topk = np.array([[1, 5, 9, 12, -1, 250]])
    a = make_args(topk, hot=8, request_ids=np.zeros(1, np.int32), source_block_table=sbt,
                  source_block_size=4, host_rows=30)
    resolve_residency_ref(a)
    # 1 -> 5*4+1 = 21; 5 -> null block -> -1; 9 -> 7*4+1 = 29; 12 -> block 3 outside -> -1;
    # -1 -> -1; 250 -> outside the table -> -1.
    assert a.resolved_global_indices[0].tolist() == [21, -1, 29, -1, -1, -1]
    assert a.valid_counts.tolist() == [2]
    a2 = make_args(topk, hot=8, request_ids=np.zeros(1, np.int32), source_block_table=sbt,
                   source_block_size=4, host_rows=29)
    resolve_residency_ref(a2)
    assert a2.resolved_global_indices[0, 2] == -1  # 29 >= host_rows


def test_without_a_source_table_negative_ids_pass_through() -> None:
    a = make_args(np.array([[-5, 3]]), hot=4)
    resolve_residency_ref(a)
    assert a.resolved_global_indices[0].tolist() == [-5, 3]
    assert a.hot_indices[0, 0] == -1


def test_resident_pages_bypass_the_lru() -> None:
    sbt = np.array([[2, 3]], np.int32)
    rbt = np.array([[0, 6]], np.int32)  # page 0 host-only (null block 0), page 1 resident in block 6
    a = make_args(np.array([[1, 5]]), hot=4, request_ids=np.zeros(1, np.int32), source_block_table=sbt,
                  source_block_size=4, resident_block_table=rbt)
    resolve_residency_ref(a)
    assert a.hot_indices[0, 1] == 6 * 4 + 1
    assert a.hot_indices[0, 0] == phys(a, 0, 0)
    assert a.miss_mask[0].tolist() == [1, 0]
    assert a.swap_counts.tolist() == [1]
    assert a.stats.tolist() == [0, 1]  # resident references are not counted


def test_all_resident_leaves_lru_and_stats_alone() -> None:
    sbt = np.array([[2]], np.int32)
    rbt = np.array([[6]], np.int32)
    a = make_args(np.array([[1, 2]]), hot=4, request_ids=np.zeros(1, np.int32), source_block_table=sbt,
                  source_block_size=4, resident_block_table=rbt)
    a.lru_slots[0] = [3, 2, 1, 0]
    resolve_residency_ref(a)
    assert a.swap_counts.tolist() == [0]
    assert a.lru_slots[0].tolist() == [3, 2, 1, 0]
    assert a.stats.tolist() == [0, 0]


def test_resident_table_is_read_at_the_state_row() -> None:
    """runtime.py passes ``residency[group]``, one row per state row (apply_residency_updates writes
    ``residency[:, request_state_indices[row], page]``): request 0 lives in state row 2, so its
    resident pages are row 2's, whatever rows 0 and 1 hold (the wheel reads it so: run 3)."""
    sbt = np.array([[2, 3], [4, 5]], np.int32)
    rbt = np.array([[7, 7], [8, 8], [0, 6]], np.int32)  # state rows 0, 1, 2
    rsi = np.array([2, 0], np.int32)  # request 0 -> state 2, request 1 -> state 0
    a = make_args(np.array([[1, 5], [1, 5]]), hot=4, states=3, rsi=rsi, request_ids=np.array([0, 1], np.int32),
                  source_block_table=sbt, source_block_size=4, resident_block_table=rbt)
    resolve_residency_ref(a)
    # Request 0 (state 2): page 0 null -> host row 2 * 4 + 1 through the LRU; page 1 in block 6.
    assert a.hot_indices[0].tolist() == [phys(a, 0, 0), 6 * 4 + 1]
    assert a.swap_host_physical_rows[0, 0] == 2 * 4 + 1
    assert a.swap_counts.tolist() == [1, 0]
    # Request 1 (state 0): both pages resident in block 7; a request-row rule would give block 8.
    assert a.hot_indices[1].tolist() == [7 * 4 + 1, 7 * 4 + 1]
    assert a.device_global_indices[0].tolist() == [-1] * 4  # state 0 untouched: nothing to load
    assert a.device_global_indices[2, 0] == 2 * 4 + 1


def test_state_row_or_page_outside_the_resident_table_is_not_resident() -> None:
    sbt = np.array([[2, 3, 4]], np.int32)
    rbt = np.array([[6, 9]], np.int32)  # one state row, two pages
    # State row 1 lies beyond the table: nothing is resident, both positions load from the host.
    a = make_args(np.array([[1, 5]]), hot=4, states=2, rsi=np.array([1], np.int32),
                  request_ids=np.zeros(1, np.int32), source_block_table=sbt, source_block_size=4,
                  resident_block_table=rbt)
    resolve_residency_ref(a)
    assert a.swap_counts.tolist() == [2]
    assert a.swap_host_physical_rows[0, :2].tolist() == [2 * 4 + 1, 3 * 4 + 1]
    # State row 0: page 2 (position 9) is beyond the table's two columns and loads from the host.
    b = make_args(np.array([[1, 9]]), hot=4, states=1, rsi=np.array([0], np.int32),
                  request_ids=np.zeros(1, np.int32), source_block_table=sbt, source_block_size=4,
                  resident_block_table=rbt)
    resolve_residency_ref(b)
    assert b.hot_indices[0, 0] == 6 * 4 + 1
    assert b.swap_host_physical_rows[0, 0] == 4 * 4 + 1 and b.swap_counts.tolist() == [1]


def test_resident_null_block_and_negative_blocks_are_host_pages() -> None:
    sbt = np.array([[2, 3, 4]], np.int32)
    rbt = np.array([[5, 6, -1]], np.int32)
    a = make_args(np.array([[1, 5, 9]]), hot=4, rsi=np.array([0], np.int32), request_ids=np.zeros(1, np.int32),
                  source_block_table=sbt, source_block_size=4, resident_block_table=rbt)
    a.resident_null_block = 5  # block 5 is the null block; 0 is then an ordinary block
    resolve_residency_ref(a)
    assert a.hot_indices[0, 1] == 6 * 4 + 1
    assert a.swap_host_physical_rows[0, :2].tolist() == [2 * 4 + 1, 4 * 4 + 1]  # page 0 (null), page 2 (-1)
    assert a.valid_counts.tolist() == [3]


def test_resident_page_without_a_host_row_is_still_resident() -> None:
    """A null source block (no host row) does not stop a resident page from serving it."""
    sbt = np.array([[0, 3]], np.int32)
    rbt = np.array([[6, 0]], np.int32)
    a = make_args(np.array([[1, 5]]), hot=4, rsi=np.array([0], np.int32), request_ids=np.zeros(1, np.int32),
                  source_block_table=sbt, source_block_size=4, resident_block_table=rbt)
    resolve_residency_ref(a)
    assert a.resolved_global_indices[0].tolist() == [-1, 3 * 4 + 1]
    assert a.hot_indices[0, 0] == 6 * 4 + 1
    assert a.valid_counts.tolist() == [2]


def test_out_of_range_lru_slot_is_a_tripwire() -> None:
    a = make_args(np.array([[10, 20]]), hot=4)
    a.lru_slots[0] = [300, 1, 2, 3]
    resolve_residency_ref(a)
    # 10 takes position 0 (slot 300, out of range): -1, no dgi write, device row -1, still counted.
    assert a.hot_indices[0].tolist() == [-1, phys(a, 0, 1)]
    assert a.swap_device_physical_rows[0].tolist() == [-1, phys(a, 0, 1)]
    assert a.swap_host_physical_rows[0].tolist() == [10, 20]
    assert a.swap_counts.tolist() == [2]
    assert a.miss_mask[0].tolist() == [0, 1]
    assert a.stats.tolist() == [0, 1]
    assert a.lru_slots[0].tolist() == [2, 3, 300, 1]


def test_union_above_bound_traps() -> None:
    a = make_args(np.array([[1, 2, 3]]), hot=4, union=2)
    with pytest.raises(UnionOverflow, match="3 host rows"):
        resolve_residency_ref(a)


def _host(rows: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 255, (rows, width), dtype=np.uint8)


def test_gather_compact_copies_counts_zeroes_beyond_host_and_skips_invalid() -> None:
    host = _host(10, 16)
    backing = np.full((4, 2, 2, 16), 0xAB, np.uint8)  # blocks of 2 rows, another layer interleaved
    hot = backing[:, 0]
    g = np.array([[3, 12, -1, 4], [5, 6, 7, 8]], np.int32)
    d = np.array([[0, 1, 2, 7], [3, 8, 5, 6]], np.int32)
    gather_compact_ref(host, hot, g, d, np.array([3, 2], np.int32))
    assert (hot[0, 0] == host[3]).all()
    assert (hot[0, 1] == 0).all()  # 12 >= host_rows: zeroed
    assert (hot[1, 0] == 0xAB).all()  # g < 0: skipped
    assert (hot[3, 1] == 0xAB).all()  # past the count
    assert (hot[1, 1] == host[5]).all()
    assert (backing[:, 1] == 0xAB).all()  # the other layer untouched


def test_gather_plan_masks_padding_and_writes_attention() -> None:
    host = _host(10, 16)
    hot = np.zeros((4, 2, 16), np.uint8)
    g = np.array([[1, 2], [3, 4]], np.int32)
    d = np.array([[0, 3], [5, -1]], np.int32)
    mm = np.array([[1, 0], [1, 1]], np.int32)
    att = np.full((2, 2), POISON, np.int32)
    gather_plan_ref(host, hot, g, d, mm, np.array([0, -1], np.int32), att, 5)
    assert (hot[0, 0] == host[1]).all() and (hot[1, 1] == 0).all()
    assert (hot[2, 1] == 0).all()  # padding row copies nothing
    assert att.tolist() == [[0, 5 + 1], [-1, -1]]
    staged = np.zeros((3, 16), np.uint8)  # 2D staging buffer: block size 1
    gather_plan_ref(host, staged, np.array([[7, 8, 9]], np.int32), np.array([[2, 0, 1]], np.int32),
                    np.array([[1, 1, 0]], np.int32), None)
    assert (staged[2] == host[7]).all() and (staged[0] == host[8]).all() and (staged[1] == 0).all()


def test_invalidate_written_slots() -> None:
    dgi = np.array([[5, 6, 5], [5, 7, 8]], np.int32)
    rsi = np.array([1, 0, -1], np.int32)
    invalidate_written_slots_ref(dgi, rsi, np.array([0, 1, 2, 9], np.int32), np.array([5, 5, 7, 8], np.int64))
    # token 0: request 0 -> state 1 drops 5; token 1: request 1 -> state 0 drops both 5s;
    # token 2: state -1 ignored; token 3: request 9 out of range ignored.
    assert dgi.tolist() == [[-1, 6, -1], [-1, 7, 8]]
    with pytest.raises(ValueError, match="equal length"):
        invalidate_written_slots_ref(dgi, rsi, np.zeros(2, np.int32), np.zeros(1, np.int64))


@pytest.mark.parametrize("seed", range(6))
def test_runtime_loop_serves_the_selected_rows(seed: int) -> None:
    """runtime.py's decode loop: resolve, gather_compact, attention reads; writes invalidate.

    Every selected, non-resident position must read its host row through the attention view after
    the copy, however the LRU churns; resident positions read the resident cache.
    """
    rng = np.random.default_rng(seed)
    k, hot_size, bs, width, nreq, host_blocks = 8, 24, 4, 16, 3, 40
    host = rng.integers(0, 255, (host_blocks * bs, width), dtype=np.uint8)
    # One HMA slab: blocks of bs rows, two layers interleaved (block stride 2 * bs rows).
    blocks = nreq * (-(-hot_size // bs)) + 1
    slab = np.zeros((blocks, 2, bs, width), np.uint8)
    hot = slab[:, 0]
    attention = slab.reshape(-1, bs, width)  # attention view, attention_block_stride = 2 * bs
    sbt = rng.permutation(np.arange(1, host_blocks))[: nreq * 6].reshape(nreq, 6).astype(np.int32)
    dgi = np.full((nreq, hot_size), -1, np.int32)
    lru = np.tile(np.arange(hot_size, dtype=np.int16), (nreq, 1))
    rsi = rng.permutation(nreq).astype(np.int32)
    stats = np.zeros(2, np.uint64)
    hbt = (np.arange(nreq)[:, None] * (-(-hot_size // bs)) + np.arange(-(-hot_size // bs)) + 1).astype(np.int32)
    for _step in range(12):
        rows_per_req = int(rng.integers(1, 3))
        req = np.repeat(np.arange(nreq, dtype=np.int32), rows_per_req)
        n = len(req)
        topk = np.stack([rng.choice(6 * bs, k, replace=False) for _ in range(n)]).astype(np.int32)
        topk[rng.random((n, k)) < 0.1] = -1
        out = {name: np.full((n, k), POISON, np.int32) for name in ("hot", "att", "sh", "sd", "mm")}
        counts = np.full(n, POISON, np.int32)
        a = VllmResolveArgs(
            host_rows=host.shape[0], hot_block_size=bs, hot_block_table=hbt, global_indices=topk,
            hot_indices=out["hot"], device_global_indices=dgi, lru_slots=lru, request_state_indices=rsi,
            region_stride=hot_size, max_union_rows=rows_per_req * k, stats=stats,
            attention_indices=out["att"], attention_block_stride=2 * bs, request_ids=req,
            source_block_table=sbt, source_block_size=bs, swap_host_physical_rows=out["sh"],
            swap_device_physical_rows=out["sd"], swap_counts=counts,
        )
        resolve_residency_ref(a)
        gather_compact_ref(host, hot, out["sh"], out["sd"], counts)
        for row in range(n):
            for col in range(k):
                t = int(topk[row, col])
                idx = int(out["att"][row, col])
                if t < 0:
                    assert idx == -1
                    continue
                g = int(sbt[req[row], t // bs]) * bs + t % bs
                assert (attention[idx // bs, idx % bs] == host[g]).all()
        # A write lands in some host rows: their hot copies must drop.
        written = rng.choice(host.shape[0], 4, replace=False).astype(np.int64)
        host[written] = rng.integers(0, 255, (4, width), dtype=np.uint8)
        for q in range(nreq):  # every request's written rows (req_id_per_token = q)
            invalidate_written_slots_ref(dgi, rsi, np.full(4, q, np.int32), written)
    assert stats[0] > 0 and stats[1] > 0
