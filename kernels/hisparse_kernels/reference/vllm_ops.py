"""Reference of vLLM 0.33's own HiSparse ops (``torch.ops._C_cache_ops.hisparse_*``).

vLLM 0.33 serves HiSparse decode through four compiled ops registered by its wheel's
``vllm/_C_stable_libtorch.abi3.so``; ``vllm/v1/hisparse/runtime.py`` calls them. This module states
what they compute, sequentially, so that our kernels can serve the same schemas bit for bit. The
rules come from four places, named per rule below as [schema], [runtime], [kernel] and [wheel]:

- [schema]: the op schemas the wheel registers (read from the ``.so``'s strings);
- [runtime]: how ``runtime.py`` calls them (which optional arguments, which shapes);
- [kernel]: vLLM's public kernel source (``csrc/hisparse_kernels.cu``), read to learn the rules;
- [wheel]: the wheel's compiled op where it differs from that source, found by the differential run
  (``benchmarks/vllm_ops_diff.py``, results in ``results/vllm_ops/``).

Where vLLM's kernel races (its parallel order decides) the wheel's output is undefined; the reference
then picks one answer and says so, and the differential test generates no such input.

Layout differences from our own ops (``reference/swap_in.py``):

- ``region_stride == hot_size`` (``device_buffer_size``): there is no reserved newest slot [kernel].
- Hot rows are *physical* rows of a paged cache: slot ``s`` of request row ``q`` lives at
  ``hot_block_table[q, s // bs] * bs + s % bs``; the bytes of physical row ``p`` are at
  ``hot_cache[p // bs, p % bs]`` whatever the block stride [kernel, runtime ``PagedCacheView``].
- State (``device_global_indices``, ``lru_slots``) and the resident block table are indexed by the
  *state row* ``request_state_indices[request_row]`` [kernel, wheel]; the hot and source block
  tables by the request row [kernel].
- Rows of one request (speculative decode) are contiguous; the first row of a run of equal
  ``request_ids`` resolves the union of the run's top-k once [kernel]. Misses are planned in
  (row, column) order of first reference, not sorted by source [kernel].

resolve_residency, per run of rows ``[first, end)`` of one request row ``q`` [kernel]:

0. ``state = rsi[q]`` if ``0 <= q < len(rsi)`` else -1 (no ``rsi``: ``state = q``). ``state < 0``
   (CUDA-graph padding, runtime.py sets ``request_ids`` to -1 past ``num_valid_rows``): every row of
   the run gets ``hot_indices = attention = resolved = -1``, ``valid_counts = swap_counts = 0``;
   ``miss_mask`` and the swap lists are left as they were, the state is not touched.
1. Translate each position ``t`` (logical top-k entry): with ``source_block_table``,
   ``g = sbt[q, t // sbs] * sbs + t % sbs`` when ``t >= 0``, ``q`` and the block are inside the table
   and the block is ``> 0`` (block 0 is vLLM's null block), else -1; without it ``g = t`` (negative
   values pass through). ``g >= host_rows`` -> -1. With ``resident_block_table`` (only together with
   the source table), a block ``b = rbt[state, t // rbs]`` that is ``>= 0`` and not
   ``resident_null_block`` makes the position *resident*: hot index ``b * rbs + t % rbs``, no LRU
   work, whether or not ``g >= 0``. The resident table is read at the *state row*, not the
   request row: runtime.py passes ``residency[group]``, a persistent table by state row (binding.py;
   ``apply_residency_updates`` writes ``residency[:, request_state_indices[row], page]``), and the
   wheel reads it so [wheel, run 3 of ``results/vllm_ops``], where the public source we read uses the
   request row. A state row outside the table, or a page beyond its columns, is not resident.
   ``resolved_global_indices = g``; ``valid_counts[row]`` counts positions that are resident or
   have ``g >= 0``; ``miss_mask = 0``. ``g < 0`` and not resident -> hot index -1. The remaining
   positions form the union of distinct ``g``; more than ``max_union_rows`` traps the kernel (here:
   ``UnionOverflow``). An empty union ends the run: ``swap_counts = 0``, LRU and stats untouched.
2. LRU walk, oldest first: position ``i`` holds slot ``s = lru[state, i]``; ``cached = dgi[state, s]``
   if ``0 <= s < region_stride`` else -1 (tripwire). ``cached`` in the union: a hit (the entry now
   lives in ``s``); every other position is evictable, in LRU order. (Two positions caching the same
   ``g`` race in vLLM; here the later one wins. The differential test never builds such a state.)
3. References in (row, column) order: the first reference of an entry no slot holds is the m-th miss
   and takes the m-th evictable slot ``s``: ``swap_host.flat[first * K + m] = g``; if ``s`` is out of
   range the entry is invalid (hot index -1, ``swap_device = -1``, ``dgi`` untouched, not counted),
   else ``swap_device = physical(s)``, ``dgi[state, s] = g``, and its first reference gets
   ``miss_mask = 1``. Every reference of a valid entry gets hot index ``physical(slot)``; the first
   reference of a missed entry counts a miss, every other reference a hit: ``stats += [hits, misses]``.
   (vLLM defines this only for ids unique within each row: a later duplicate of a missed entry in the
   same row can be left unwritten by its kernel. Across the rows of one request duplicates are legal.
   The reference treats every later reference alike.)
4. ``swap_counts[row] = clamp(misses_incl_invalid - (row - first) * K, 0, K)``.
5. New LRU: ``[evictables not taken, oldest first] + [evictables just taken, in miss order] +
   [hits, in LRU order]``.

``attention_indices`` (when given) hold ``p // bs * attention_block_stride + p % bs`` for every hot
index ``p >= 0``, else -1: the row index into runtime.py's ``attention_cache`` view [kernel, runtime].

gather_compact [kernel]: per row, entries ``[0, clamp(count, 0, K))``: skip ``g < 0`` or a destination
outside the cache; copy ``host[g]`` into physical row ``dst``, or zeros when ``g >= host_rows``.

gather_plan [kernel]: per row, column: ``attention`` (when given) is -1 for a padding row
(``rsi[row] < 0``, indexed by launch row) or ``dst < 0``, else the attention index of ``dst``;
padding rows and ``miss_mask == 0`` copy nothing; otherwise as gather_compact. A 2D ``hot_cache``
(prefill staging) has block size 1.

invalidate_written_slots [kernel]: per token ``t``: ``q = req_id_per_token[t]`` in range, ``state =
rsi[q]`` in range, ``written_slots[t] >= 0`` -> every entry of ``dgi[state]`` equal to it becomes -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "UnionOverflow",
    "VllmResolveArgs",
    "attention_index",
    "gather_compact_ref",
    "gather_plan_ref",
    "invalidate_written_slots_ref",
    "physical_hot_row",
    "resolve_residency_ref",
]


class UnionOverflow(ValueError):
    """A request resolves more host rows than ``max_union_rows``: vLLM's kernel traps (``__trap``)."""


@dataclass
class VllmResolveArgs:
    """The arguments of ``hisparse_resolve_residency``, named as in its schema.

    Arrays are NumPy views; outputs are written in place. ``host_rows`` and ``hot_block_size`` stand
    for ``host_cache`` and ``hot_cache``, of which the resolve reads only the shapes.
    """

    host_rows: int
    hot_block_size: int
    hot_block_table: np.ndarray  # int32 [rows, blocks]
    global_indices: np.ndarray  # int32 [N, K]
    hot_indices: np.ndarray  # int32 [N, K], out
    device_global_indices: np.ndarray  # int32 [S, region_stride], in/out
    lru_slots: np.ndarray  # int16 [S, region_stride], in/out
    request_state_indices: np.ndarray | None
    region_stride: int
    max_union_rows: int
    miss_mask: np.ndarray | None = None  # int32 [N, K], out
    stats: np.ndarray | None = None  # uint64 [2], accumulated
    attention_indices: np.ndarray | None = None  # int32 [N, K] (any row stride), out
    attention_block_stride: int = 0
    request_ids: np.ndarray | None = None  # int32 [>= N]
    source_block_table: np.ndarray | None = None  # int32 [R, blocks]
    source_block_size: int = 0
    resolved_global_indices: np.ndarray | None = None  # int32 [N, K], out
    valid_counts: np.ndarray | None = None  # int32 [N], out
    swap_host_physical_rows: np.ndarray | None = None  # int32 [N, K] contiguous, out
    swap_device_physical_rows: np.ndarray | None = None  # int32 [N, K] contiguous, out
    swap_counts: np.ndarray | None = None  # int32 [>= N], out
    resident_block_table: np.ndarray | None = None  # int32 [R, blocks]
    resident_block_size: int = 0
    resident_null_block: int = 0


def physical_hot_row(hot_block_table: np.ndarray, request_row: int, slot: int, block_size: int) -> int:
    """Physical row of hot slot ``slot`` of ``request_row`` in the paged hot cache."""
    return int(hot_block_table[request_row, slot // block_size]) * block_size + slot % block_size


def attention_index(row: int, block_size: int, attention_block_stride: int) -> int:
    """Row index into the attention view for physical row ``row`` (-1 stays -1)."""
    if row < 0:
        return -1
    return (row // block_size) * attention_block_stride + row % block_size


def _translate(a: VllmResolveArgs, token: int, q: int, state: int) -> tuple[int, int]:
    """(host row g or negative, resident row or -1) of position ``token`` of request row ``q``.

    The source table is read at the request row ``q``, the resident table at the state row ``state``.
    """
    g = token
    resident = -1
    sbt = a.source_block_table
    if sbt is not None:
        sbs = a.source_block_size
        block = token // sbs if token >= 0 else -1
        if 0 <= q < sbt.shape[0] and 0 <= block < sbt.shape[1]:
            physical = int(sbt[q, block])
            g = physical * sbs + token % sbs if physical > 0 else -1
        else:
            g = -1
        rbt = a.resident_block_table
        if rbt is not None:
            rbs = a.resident_block_size
            rblock = token // rbs if token >= 0 else -1
            if 0 <= state < rbt.shape[0] and 0 <= rblock < rbt.shape[1]:
                physical = int(rbt[state, rblock])
                if physical != a.resident_null_block and physical >= 0:
                    resident = physical * rbs + token % rbs
    return (-1 if g >= a.host_rows else g), resident


def _store(a: VllmResolveArgs, row: int, col: int, value: int) -> None:
    a.hot_indices[row, col] = value
    if a.attention_indices is not None:
        a.attention_indices[row, col] = attention_index(value, a.hot_block_size, a.attention_block_stride)


def _runs(a: VllmResolveArgs, n: int) -> list[tuple[int, int, int]]:
    """(first, end, request_row) of each contiguous run of one request's rows."""
    runs: list[tuple[int, int, int]] = []
    first = 0
    while first < n:
        q = int(a.request_ids[first]) if a.request_ids is not None else first
        end = first + 1
        if a.request_ids is not None:
            while end < n and int(a.request_ids[end]) == q:
                end += 1
        runs.append((first, end, q))
        first = end
    return runs


def resolve_residency_ref(a: VllmResolveArgs) -> None:
    """``hisparse_resolve_residency``: see the module docstring for every rule."""
    n, k = a.global_indices.shape
    if n == 0 or k == 0:
        return
    hot_size = a.lru_slots.shape[1]
    if a.region_stride != hot_size:
        raise ValueError("region_stride must match the LRU size")
    if not 0 < a.max_union_rows <= hot_size:
        raise ValueError(f"max_union_rows must be in [1, hot_size], got {a.max_union_rows}")
    for first, end, q in _runs(a, n):
        _resolve_run(a, first, end, q, k, hot_size)


def _resolve_run(a: VllmResolveArgs, first: int, end: int, q: int, k: int, hot_size: int) -> None:
    rsi = a.request_state_indices
    if rsi is not None:
        state = int(rsi[q]) if 0 <= q < len(rsi) else -1
    else:
        state = q
    rows = range(first, end)
    if state < 0:
        for row in rows:
            a.hot_indices[row] = -1
            if a.attention_indices is not None:
                a.attention_indices[row] = -1
            if a.resolved_global_indices is not None:
                a.resolved_global_indices[row] = -1
            if a.valid_counts is not None:
                a.valid_counts[row] = 0
            if a.swap_counts is not None:
                a.swap_counts[row] = 0
        return

    # Phase 1: translate; resident and invalid positions resolve now; the rest form the union.
    refs: list[tuple[int, int, int]] = []  # (row, col, g) in (row, column) order
    union: dict[int, int] = {}  # g -> position of its first reference
    for row in rows:
        valid = 0
        for col in range(k):
            g, resident = _translate(a, int(a.global_indices[row, col]), q, state)
            if a.resolved_global_indices is not None:
                a.resolved_global_indices[row, col] = g
            if resident >= 0 or g >= 0:
                valid += 1
            if a.miss_mask is not None:
                a.miss_mask[row, col] = 0
            if resident >= 0:
                _store(a, row, col, resident)
            elif g < 0:
                _store(a, row, col, -1)
            else:
                refs.append((row, col, g))
                union.setdefault(g, (row - first) * k + col)
        if a.valid_counts is not None:
            a.valid_counts[row] = valid
    if len(union) > a.max_union_rows:
        raise UnionOverflow(
            f"request {q} resolves {len(union)} host rows, above the configured bound of {a.max_union_rows}"
        )
    if not union:
        if a.swap_counts is not None:
            a.swap_counts[first:end] = 0
        return

    # Phase 2: LRU walk.
    dgi = a.device_global_indices[state]
    lru = a.lru_slots[state]
    slot_of: dict[int, int] = {}
    hits: list[int] = []
    evictable: list[int] = []
    for i in range(hot_size):
        s = int(lru[i])
        cached = int(dgi[s]) if 0 <= s < a.region_stride else -1
        if cached >= 0 and cached in union:
            slot_of[cached] = s
            hits.append(s)
        else:
            evictable.append(s)

    hit_entries = set(slot_of)

    # Phase 3: misses take evictables in order of first reference.
    invalid: set[int] = set()
    misses = 0
    for g in sorted((g for g in union if g not in slot_of), key=union.__getitem__):
        s = evictable[misses]
        flat = first * k + misses
        if a.swap_host_physical_rows is not None:
            a.swap_host_physical_rows.reshape(-1)[flat] = g
        if 0 <= s < a.region_stride:
            slot_of[g] = s
            dgi[s] = g
            if a.swap_device_physical_rows is not None:
                a.swap_device_physical_rows.reshape(-1)[flat] = physical_hot_row(
                    a.hot_block_table, q, s, a.hot_block_size
                )
        else:
            invalid.add(g)
            if a.swap_device_physical_rows is not None:
                a.swap_device_physical_rows.reshape(-1)[flat] = -1
        misses += 1
    entry_hits = entry_misses = 0
    for row, col, g in refs:
        if g in invalid:
            _store(a, row, col, -1)
            continue
        _store(a, row, col, physical_hot_row(a.hot_block_table, q, slot_of[g], a.hot_block_size))
        position = (row - first) * k + col
        if g not in hit_entries and union[g] == position:
            if a.miss_mask is not None:
                a.miss_mask[row, col] = 1
            entry_misses += 1
        else:
            entry_hits += 1
    if a.stats is not None:
        a.stats[0] += np.uint64(entry_hits)
        a.stats[1] += np.uint64(entry_misses)

    # Phase 4: swap counts split over the run's rows.
    if a.swap_counts is not None:
        for row in rows:
            a.swap_counts[row] = max(0, min(k, misses - (row - first) * k))

    # Phase 5: new LRU order.
    lru[:] = evictable[misses:] + evictable[:misses] + hits


def _row_bytes_view(hot_cache: np.ndarray) -> tuple[np.ndarray, int]:
    """``hot_cache`` as [blocks, block_size, row_bytes] uint8 and its block size (2D: block size 1)."""
    if hot_cache.ndim == 2:
        return hot_cache[:, None, :], 1
    return hot_cache, hot_cache.shape[1]


def _copy_row(host_cache: np.ndarray, hot: np.ndarray, bs: int, g: int, dst: int) -> None:
    if g < host_cache.shape[0]:
        hot[dst // bs, dst % bs] = host_cache[g]
    else:
        hot[dst // bs, dst % bs] = 0


def gather_compact_ref(
    host_cache: np.ndarray,
    hot_cache: np.ndarray,
    miss_global_indices: np.ndarray,
    miss_hot_indices: np.ndarray,
    miss_counts: np.ndarray,
) -> None:
    """``hisparse_gather_compact``: host rows ``[host_rows, W]``, paged ``hot_cache`` written in place."""
    hot, bs = _row_bytes_view(hot_cache)
    hot_rows = hot.shape[0] * bs
    n, k = miss_global_indices.shape
    for row in range(n):
        count = min(max(int(miss_counts[row]), 0), k)
        for col in range(count):
            g = int(miss_global_indices[row, col])
            dst = int(miss_hot_indices[row, col])
            if g < 0 or dst < 0 or dst >= hot_rows:
                continue
            _copy_row(host_cache, hot, bs, g, dst)


def gather_plan_ref(
    host_cache: np.ndarray,
    hot_cache: np.ndarray,
    global_indices: np.ndarray,
    hot_indices: np.ndarray,
    miss_mask: np.ndarray,
    request_state_indices: np.ndarray | None,
    attention_indices: np.ndarray | None = None,
    attention_block_stride: int = 0,
) -> None:
    """``hisparse_gather_plan``: replay a plan (shared layers, prefill staging)."""
    hot, bs = _row_bytes_view(hot_cache)
    hot_rows = hot.shape[0] * bs
    n, k = global_indices.shape
    for row in range(n):
        padding = request_state_indices is not None and int(request_state_indices[row]) < 0
        for col in range(k):
            dst = int(hot_indices[row, col])
            if attention_indices is not None:
                attention_indices[row, col] = -1 if padding else attention_index(dst, bs, attention_block_stride)
            if padding or int(miss_mask[row, col]) == 0:
                continue
            g = int(global_indices[row, col])
            if g < 0 or dst < 0 or dst >= hot_rows:
                continue
            _copy_row(host_cache, hot, bs, g, dst)


def invalidate_written_slots_ref(
    device_global_indices: np.ndarray,
    request_state_indices: np.ndarray,
    req_id_per_token: np.ndarray,
    written_slots: np.ndarray,
) -> None:
    """``hisparse_invalidate_written_slots``: drop hot copies of slots this step wrote."""
    if len(req_id_per_token) != len(written_slots):
        raise ValueError("req_id_per_token and written_slots must have equal length")
    num_states = device_global_indices.shape[0]
    for q, slot in zip(req_id_per_token.tolist(), written_slots.tolist(), strict=True):
        if not 0 <= q < len(request_state_indices):
            continue
        state = int(request_state_indices[q])
        if not 0 <= state < num_states or slot < 0:
            continue
        row = device_global_indices[state]
        row[row.astype(np.int64) == slot] = -1
