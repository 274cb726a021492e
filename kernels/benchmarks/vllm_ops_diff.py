"""vLLM 0.33's compiled HiSparse ops against our NumPy reference of them, and their speed (GPU).

Loads the wheel's ``_C_stable_libtorch.abi3.so`` (path in argv[1]), fuzzes its four ops over
runtime.py's calling sequences (request runs, source / resident block tables, padding, tripwires,
evictions, invalidation after writes) and checks every output tensor and the hot cache bit for bit
against :mod:`hisparse_kernels.reference.vllm_ops`. Then times the ops at production shapes beside a
pinned memcpy of the same bytes and, when our extension builds, our ``gather_plan`` on the same plan.

    python kernels/benchmarks/vllm_ops_diff.py <vllm .so> --cases 10000 --out DIR
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hisparse_kernels", "reference"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import vllm_ops as ref  # noqa: E402  (the reference needs only NumPy)

POISON = -999
MODES = ["runtime", "runtime", "resident", "global"]
OURS = None  # torch.ops.hisparse once our extension is built (--ours): its vllm_gather_compact is checked too


def load_vllm(path: str):
    lib = os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu13", "lib", "libcudart.so.13")
    if os.path.exists(lib):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    torch.ops.load_library(path)
    return torch.ops._C_cache_ops


class Case:
    """One request batch layout and its persistent state, on the GPU and in NumPy."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.k = int(rng.integers(1, 41))
        self.rpr = int(rng.choice([1, 1, 2, 3]))  # rows per request (speculative decode)
        self.nreq = int(rng.integers(1, 7))
        self.hot = self.rpr * self.k + int(rng.integers(0, self.k + 6))
        self.bs = int(rng.choice([1, 2, 4, 16, 64]))
        self.width = int(rng.choice([16, 48, 656]))
        self.mode = rng.choice(MODES)
        self.states = self.nreq + int(rng.integers(0, 3))
        rsi = rng.permutation(self.states)[: self.nreq].astype(np.int32)
        rsi[rng.random(self.nreq) < 0.15] = -1
        self.rsi = rsi
        hb = -(-self.hot // self.bs) + int(rng.integers(0, 2))
        nblocks = self.nreq * hb + int(rng.integers(1, 4))
        self.hbt = rng.permutation(nblocks)[: self.nreq * hb].reshape(self.nreq, hb).astype(np.int32)
        # The HMA slab: blocks of bs rows of two layers interleaved or one layer alone.
        self.layers = int(rng.choice([1, 2]))
        self.slab = torch.zeros((nblocks, self.layers, self.bs, self.width), dtype=torch.uint8, device="cuda")
        self.sblocks = int(rng.integers(1, 8))
        host_blocks = self.nreq * self.sblocks + 4
        self.host_rows = host_blocks * self.bs - int(rng.integers(0, self.bs + 1))
        self.host = torch.from_numpy(rng.integers(0, 256, (self.host_rows, self.width), dtype=np.uint8)).pin_memory()
        self.host2 = torch.from_numpy(rng.integers(0, 256, (self.host_rows, self.width), dtype=np.uint8)).pin_memory()
        sbt = np.stack([rng.permutation(np.arange(1, host_blocks))[: self.sblocks] for _ in range(self.nreq)])
        sbt[rng.random(sbt.shape) < 0.1] = 0  # null blocks
        self.sbt = sbt.astype(np.int32)
        # The resident table is runtime.py's residency[group]: one row per state row (a row or a
        # column short now and then: those pages are not resident), null block 0 or, rarely, another.
        rshape = (max(1, self.states + int(rng.integers(-1, 2))), max(1, self.sblocks + int(rng.integers(-1, 2))))
        rbt = rng.integers(1, 50, rshape).astype(np.int32)
        rbt[rng.random(rshape) < 0.6] = 0
        rbt[rng.random(rshape) < 0.05] = -1
        self.rbt = rbt
        self.rnull = int(rng.choice([0, 0, 0, int(rbt.flat[int(rng.integers(rbt.size))])])) if rbt.size else 0
        self.rnull = max(self.rnull, 0)
        self.dgi = np.full((self.states, self.hot), -1, np.int32)
        self.lru = np.tile(np.arange(self.hot, dtype=np.int16), (self.states, 1))
        self.stats = np.zeros(2, np.uint64)
        self.g_dgi = torch.from_numpy(self.dgi.copy()).cuda()
        self.g_lru = torch.from_numpy(self.lru.copy()).cuda()
        self.g_stats = torch.zeros(2, dtype=torch.uint64, device="cuda")

    def topk(self) -> tuple[np.ndarray, np.ndarray | None, int]:
        """(logical or global top-k [N, K], request ids or None, real rows)."""
        rng, k = self.rng, self.k
        if self.mode == "global":  # no source table: global ids, one row per request
            n = self.nreq
            t = np.full((n, k), -1, np.int32)
            for i in range(n):
                r = rng.choice(self.host_rows + 8, min(k, self.host_rows + 8), replace=False)
                t[i, : len(r)] = r
            t[rng.random(t.shape) < 0.1] = -1
            return t, None, n
        span = self.sblocks * self.bs + 3
        rows, req = [], []
        for q in range(self.nreq):
            pool = rng.choice(span, min(span, int(k * 1.5) + 1), replace=False)  # rows of q overlap
            for _ in range(self.rpr):
                rows.append(rng.choice(pool, min(k, len(pool)), replace=False))
                req.append(q)
        t = np.full((len(rows), k), -1, np.int32)
        for i, r in enumerate(rows):
            t[i, : len(r)] = r
        t[rng.random(t.shape) < 0.08] = -1
        real = len(rows)
        pad = int(rng.integers(0, 3))  # CUDA-graph padding rows: request id -1 (runtime.py)
        if pad:
            t = np.concatenate([t, rng.integers(0, span, (pad, k)).astype(np.int32)])
            req += [-1] * pad
        return t, np.array(req, np.int32), real


def dev(x: np.ndarray | None):
    return None if x is None else torch.from_numpy(np.ascontiguousarray(x)).cuda()


def run_step(ops, c: Case, checks: dict, diag: dict | None = None) -> None:
    """One resolve (then copies and an invalidation) on both sides. With ``diag``: also every
    candidate resident rule from the GPU's own pre-step state, and the state re-synced after."""
    rng = c.rng
    topk, req, _ = c.topk()
    n, k = topk.shape
    hot_view = c.slab[:, 0]
    use = {name: bool(rng.random() < p) for name, p in
           (("mm", 0.5), ("stats", 0.7), ("att", 0.8), ("res", 0.5), ("vc", 0.6), ("swap", 0.9))}
    if c.mode == "global":
        use["swap"] = True
    att_cols = k + int(rng.integers(0, 3))  # attention rows may be a slice of wider rows
    out = {
        "hot": np.full((n, k), POISON, np.int32),
        "mm": np.full((n, k), 7, np.int32) if use["mm"] else None,
        "att": np.full((n, att_cols), POISON, np.int32) if use["att"] else None,
        "res": np.full((n, k), POISON, np.int32) if use["res"] else None,
        "vc": np.full(n, POISON, np.int32) if use["vc"] else None,
        "sh": np.full((n, k), POISON, np.int32) if use["swap"] else None,
        "sd": np.full((n, k), POISON, np.int32) if use["swap"] else None,
        "sc": np.full(n, POISON, np.int32) if use["swap"] else None,
    }
    g = {name: dev(v) for name, v in out.items()}
    runtime = c.mode != "global"
    resident = c.mode == "resident"
    # Tripwire: now and then one LRU entry is corrupted out of range (both sides alike).
    if rng.random() < 0.05:
        s, i = int(rng.integers(c.states)), int(rng.integers(c.hot))
        bad = int(rng.choice([-3, c.hot, c.hot + 100, 32767]))
        c.lru[s, i] = bad
        c.g_lru[s, i] = bad
    a = ref.VllmResolveArgs(
        host_rows=c.host_rows, hot_block_size=c.bs, hot_block_table=c.hbt, global_indices=topk,
        hot_indices=out["hot"], device_global_indices=c.dgi, lru_slots=c.lru,
        request_state_indices=c.rsi if (runtime or rng.random() < 0.5) else None,
        region_stride=c.hot, max_union_rows=c.rpr * k if runtime else k, miss_mask=out["mm"],
        stats=c.stats if use["stats"] else None,
        attention_indices=out["att"][:, :k] if use["att"] else None,
        attention_block_stride=c.bs * c.layers, request_ids=req if runtime else None,
        source_block_table=c.sbt if runtime else None, source_block_size=c.bs if runtime else 0,
        resolved_global_indices=out["res"], valid_counts=out["vc"],
        swap_host_physical_rows=out["sh"], swap_device_physical_rows=out["sd"], swap_counts=out["sc"],
        resident_block_table=c.rbt if resident else None, resident_block_size=c.bs if resident else 0,
        resident_null_block=c.rnull if resident else 0,
    )
    rsi_t = dev(a.request_state_indices)
    pre = (c.g_dgi.cpu().numpy().copy(), c.g_lru.cpu().numpy().copy(), c.g_stats.cpu().numpy().copy())
    mine = None
    if OURS is not None and hasattr(OURS, "vllm_resolve_residency"):  # ours from the same state and poison
        mine = {name: dev(v) for name, v in out.items()}
        m_dgi, m_lru, m_stats = c.g_dgi.clone(), c.g_lru.clone(), c.g_stats.clone()
        OURS.vllm_resolve_residency(
            c.host, hot_view, dev(c.hbt), dev(topk), mine["hot"], m_dgi, m_lru, rsi_t, c.hot, a.max_union_rows,
            mine["mm"], m_stats if use["stats"] else None, mine["att"][:, :k] if use["att"] else None,
            a.attention_block_stride, dev(req) if runtime else None, dev(c.sbt) if runtime else None,
            a.source_block_size, mine["res"], mine["vc"], mine["sh"], mine["sd"], mine["sc"],
            dev(c.rbt) if resident else None, a.resident_block_size, a.resident_null_block,
        )
    ops.hisparse_resolve_residency(
        c.host, hot_view, dev(c.hbt), dev(topk), g["hot"], c.g_dgi, c.g_lru, rsi_t, c.hot, a.max_union_rows,
        g["mm"], c.g_stats if use["stats"] else None, g["att"][:, :k] if use["att"] else None,
        a.attention_block_stride, dev(req) if runtime else None, dev(c.sbt) if runtime else None,
        a.source_block_size, g["res"], g["vc"], g["sh"], g["sd"], g["sc"],
        dev(c.rbt) if resident else None, a.resident_block_size, a.resident_null_block,
    )
    torch.cuda.synchronize()
    names = ["hot", "mm", "att", "res", "vc", "sh", "sd", "sc"]
    if diag is not None:
        diagnose(a, out, g, pre, c, topk, req, diag)
    ref.resolve_residency_ref(a)
    diffs = [nm for nm in names if out[nm] is not None and not np.array_equal(out[nm], g[nm].cpu().numpy())]
    if not np.array_equal(c.dgi, c.g_dgi.cpu().numpy()):
        diffs.append("device_global_indices")
    if not np.array_equal(c.lru, c.g_lru.cpu().numpy()):
        diffs.append("lru_slots")
    if not np.array_equal(c.stats, c.g_stats.cpu().numpy()):
        diffs.append("stats")
    tally(checks, "resolve_residency", diffs, c)
    if mine is not None:  # every output tensor (attention's whole rows), the state and the stats, bit for bit
        d = [nm for nm in names if mine[nm] is not None and not torch.equal(mine[nm], g[nm])]
        d += [nm for nm, x, y in (("device_global_indices", m_dgi, c.g_dgi), ("lru_slots", m_lru, c.g_lru),
                                  ("stats", m_stats.view(torch.int64), c.g_stats.view(torch.int64))) if not torch.equal(x, y)]
        tally(checks, "ours_resolve_residency", d, c)

    # Copy: gather_compact on the swap lists (runtime.py's _swap_rows), hot bytes compared.
    if use["swap"]:
        slab_np = c.slab.cpu().numpy()
        mine = c.slab.clone() if OURS is not None else None
        ops.hisparse_gather_compact(c.host, hot_view, g["sh"], g["sd"], g["sc"])
        ref.gather_compact_ref(c.host.numpy(), slab_np[:, 0], out["sh"], out["sd"], out["sc"])
        torch.cuda.synchronize()
        tally(checks, "gather_compact", [] if np.array_equal(slab_np, c.slab.cpu().numpy()) else ["hot_cache"], c)
        if mine is not None:  # ours on the same plan into a copy of the slab taken before vLLM's ran
            OURS.vllm_gather_compact(c.host, mine[:, 0], g["sh"], g["sd"], g["sc"])
            torch.cuda.synchronize()
            tally(checks, "ours_gather_compact", [] if torch.equal(mine, c.slab) else ["hot_cache"], c)
    # Shared-layer replay: gather_plan of the same plan into the second layer, from another pool.
    if out["mm"] is not None and c.layers == 2:
        gids = out["res"] if out["res"] is not None else None
        if gids is not None:
            slab_np = c.slab.cpu().numpy()
            prs = None
            if runtime:  # per launch row: the request's state row, -1 for padding rows
                prs = np.where(req >= 0, c.rsi[np.clip(req, 0, None)], -1).astype(np.int32)
            att2 = np.full((n, k), POISON, np.int32) if rng.random() < 0.7 else None
            g_att2 = dev(att2)
            ours_plan = OURS is not None and hasattr(OURS, "vllm_gather_plan")
            if ours_plan:
                m_slab, m_att2 = c.slab.clone(), dev(att2)
                OURS.vllm_gather_plan(c.host2, m_slab[:, 1], g["res"], g["hot"], g["mm"], dev(prs), m_att2,
                                      c.bs * c.layers)
            ops.hisparse_gather_plan(c.host2, c.slab[:, 1], g["res"], g["hot"], g["mm"], dev(prs), g_att2,
                                     c.bs * c.layers)
            ref.gather_plan_ref(c.host2.numpy(), slab_np[:, 1], out["res"], out["hot"], out["mm"], prs, att2,
                                c.bs * c.layers)
            torch.cuda.synchronize()
            d = [] if np.array_equal(slab_np, c.slab.cpu().numpy()) else ["hot_cache"]
            if att2 is not None and not np.array_equal(att2, g_att2.cpu().numpy()):
                d.append("attention_indices")
            tally(checks, "gather_plan", d, c)
            if ours_plan:
                d = [] if torch.equal(m_slab, c.slab) else ["hot_cache"]
                if att2 is not None and not torch.equal(m_att2, g_att2):
                    d.append("attention_indices")
                tally(checks, "ours_gather_plan", d, c)

    # A write: some host rows change; invalidate their hot copies (runtime.py's invalidate_written_slots).
    held = c.dgi[c.dgi >= 0]
    ntok = int(rng.integers(1, 9))
    slots = rng.integers(-2, c.host_rows + 2, ntok).astype(np.int64)
    if held.size:
        pick = rng.random(ntok) < 0.6
        slots[pick] = rng.choice(held, int(pick.sum()))
    rid = rng.integers(-1, c.nreq + 1, ntok).astype(np.int32)
    m_dgi = c.g_dgi.clone() if OURS is not None and hasattr(OURS, "vllm_invalidate_written_slots") else None
    if m_dgi is not None:
        OURS.vllm_invalidate_written_slots(m_dgi, dev(c.rsi), dev(rid), dev(slots))
    ops.hisparse_invalidate_written_slots(c.g_dgi, dev(c.rsi), dev(rid), dev(slots))
    ref.invalidate_written_slots_ref(c.dgi, c.rsi, rid, slots)
    torch.cuda.synchronize()
    tally(checks, "invalidate_written_slots",
          [] if np.array_equal(c.dgi, c.g_dgi.cpu().numpy()) else ["device_global_indices"], c)
    if m_dgi is not None:
        tally(checks, "ours_invalidate_written_slots",
              [] if torch.equal(m_dgi, c.g_dgi) else ["device_global_indices"], c)
    if diag is not None:  # judge the next step's rule from the GPU's state, not a diverged one
        c.dgi[:] = c.g_dgi.cpu().numpy()
        c.lru[:] = c.g_lru.cpu().numpy()
        c.stats[:] = c.g_stats.cpu().numpy()


def translate_variant(by_state: bool, host_backed: bool, null_above: bool):
    """A candidate rule for the resident lookup, in the reference's ``_translate`` signature."""
    base = ORIGINAL_TRANSLATE

    def translate(a, token, q, state):
        g, _ = base(a, token, q, state)
        rbt = a.resident_block_table
        if rbt is None:
            return g, -1
        row = state if by_state else q
        rbs = a.resident_block_size
        rblock = token // rbs if token >= 0 else -1
        if not (0 <= row < rbt.shape[0] and 0 <= rblock < rbt.shape[1]):
            return g, -1
        b = int(rbt[row, rblock])
        ok = b > a.resident_null_block if null_above else (b != a.resident_null_block and b >= 0)
        if host_backed and g < 0:
            ok = False
        return g, (b * rbs + token % rbs) if ok else -1
    return translate


ORIGINAL_TRANSLATE = ref._translate
VARIANTS = {
    f"{'state' if s else 'request'}_row{'_host_backed' if h else ''}{'_null_above' if n else ''}":
        translate_variant(s, h, n)
    for s in (True, False) for h in (False, True) for n in (False, True)
}


def diagnose(a, out, g, pre, c, topk, req, diag: dict) -> None:
    """Every candidate rule from the GPU's pre-step state against the GPU's outputs; dumps misses."""
    import copy
    got = {nm: g[nm].cpu().numpy() for nm in out if out[nm] is not None}
    post = (c.g_dgi.cpu().numpy(), c.g_lru.cpu().numpy(), c.g_stats.cpu().numpy())
    for name, fn in VARIANTS.items():
        b = copy.copy(a)
        b.device_global_indices, b.lru_slots = pre[0].copy(), pre[1].copy()
        b.stats = pre[2].copy() if a.stats is not None else None
        mine = {nm: np.full_like(v, POISON) if nm != "mm" else np.full_like(v, 7) for nm, v in out.items() if v is not None}
        b.hot_indices = mine["hot"]
        b.miss_mask = mine.get("mm")
        b.attention_indices = mine["att"][:, : a.global_indices.shape[1]] if "att" in mine else None
        b.resolved_global_indices, b.valid_counts = mine.get("res"), mine.get("vc")
        b.swap_host_physical_rows, b.swap_device_physical_rows, b.swap_counts = mine.get("sh"), mine.get("sd"), mine.get("sc")
        ref._translate = fn
        try:
            ref.resolve_residency_ref(b)
        finally:
            ref._translate = ORIGINAL_TRANSLATE
        diffs = [nm for nm in mine if not np.array_equal(mine[nm], got[nm])]
        diffs += [nm for nm, x, y in (("dgi", b.device_global_indices, post[0]), ("lru", b.lru_slots, post[1]))
                  if not np.array_equal(x, y)]
        if b.stats is not None and not np.array_equal(b.stats, post[2]):
            diffs.append("stats")
        t = diag.setdefault("variants", {}).setdefault(name, [0, 0])
        t[1 if diffs else 0] += 1
        if name == "state_row" and diffs and len(diag.setdefault("dumps", [])) < 8:
            diag["dumps"].append({
                "diff": diffs, "topk": topk, "req": req, "rsi": c.rsi, "sbt": c.sbt, "rbt": c.rbt, "hbt": c.hbt,
                "null": c.rnull, "k": c.k, "hot": c.hot, "bs": c.bs, "host_rows": c.host_rows,
                "pre_dgi": pre[0], "pre_lru": pre[1], "gpu": got, "gpu_dgi": post[0], "gpu_lru": post[1],
                "ref": mine, "ref_dgi": b.device_global_indices, "ref_lru": b.lru_slots,
            })


def tally(checks: dict, op: str, diffs: list[str], c: Case) -> None:
    by_mode = checks.setdefault("by_mode", {}).setdefault(f"{c.mode}/{op}", [0, 0])
    by_mode[1 if diffs else 0] += 1
    entry = checks.setdefault(op, {"pass": 0, "fail": 0, "first_failures": []})
    if diffs:
        entry["fail"] += 1
        if len(entry["first_failures"]) < 5:
            entry["first_failures"].append({"diff": diffs, "k": c.k, "hot": c.hot, "bs": c.bs, "rpr": c.rpr,
                                            "nreq": c.nreq, "mode": str(c.mode)})
    else:
        entry["pass"] += 1


def fuzz(ops, cases: int, seed: int, diag: dict | None = None) -> dict:
    rng = np.random.default_rng(seed)
    checks: dict = {}
    steps = 0
    t0 = time.time()
    while steps < cases:
        c = Case(rng)
        for _ in range(int(rng.integers(1, 6))):
            run_step(ops, c, checks, diag)
            steps += 1
    return {"resolve_steps": steps, "seconds": round(time.time() - t0, 1), "checks": checks}


def fuzz_compact(ops, ours, cases: int, seed: int) -> dict:
    """gather_compact alone on plans resolve never writes: negative and beyond-pool sources,
    destinations outside the cache, counts below 0 and above K, more counts than rows, a strided
    HMA slab view, odd row widths. vLLM's op, ours and the reference, whole slab bit for bit."""
    rng = np.random.default_rng(seed)
    tallies = {"vllm_vs_reference": [0, 0], "ours_vs_vllm": [0, 0]}
    kinds = ("lines", "chunks", "chunks8")  # our copies (lines only serves rows of 128 B and more)
    for case in range(cases):
        kind = kinds[case % 3]
        os.environ["HISPARSE_COMPACT_KERNEL"] = kind
        n, k = int(rng.integers(1, 9)), int(rng.integers(1, 65))
        bs, layers, width = int(rng.choice([1, 4, 16, 64])), int(rng.choice([1, 2, 3])), int(rng.choice([16, 64, 656, 1168]))
        nblocks = int(rng.integers(1, 6)) + -(-n * k // bs)
        slab = torch.from_numpy(rng.integers(0, 256, (nblocks, layers, bs, width), dtype=np.uint8)).cuda()
        host_rows = int(rng.integers(1, 4 * n * k + 2))
        host = torch.from_numpy(rng.integers(0, 256, (host_rows, width), dtype=np.uint8)).pin_memory()
        hot_rows = nblocks * bs
        src = rng.integers(-3, host_rows + 5, (n, k)).astype(np.int32)
        dst = rng.permutation(hot_rows + 8)[: n * k].reshape(n, k).astype(np.int32) - 4  # distinct: no races
        if dst.size < n * k:
            continue
        counts = rng.integers(-2, k + 3, n + int(rng.integers(0, 3))).astype(np.int32)
        layer = int(rng.integers(layers))
        want = slab.cpu().numpy()
        mine = slab.clone()
        gs, gd, gc = dev(src), dev(dst), dev(counts)
        ops.hisparse_gather_compact(host, slab[:, layer], gs, gd, gc)
        ours.vllm_gather_compact(host, mine[:, layer], gs, gd, gc)
        ref.gather_compact_ref(host.numpy(), want[:, layer], src, dst, counts)
        torch.cuda.synchronize()
        tallies["vllm_vs_reference"][0 if np.array_equal(want, slab.cpu().numpy()) else 1] += 1
        same = bool(torch.equal(mine, slab))
        tallies["ours_vs_vllm"][0 if same else 1] += 1
        tallies.setdefault(f"ours_{kind}_vs_vllm", [0, 0])[0 if same else 1] += 1
    os.environ.pop("HISPARSE_COMPACT_KERNEL", None)
    return tallies


def fuzz_plan(ops, ours, cases: int, seed: int) -> dict:
    """gather_plan alone, beyond the plans resolve writes: a 2D hot cache (block size 1) or a strided paged
    view, row widths that are not multiples of 16 (and 1-byte rows), a hot dtype other than bytes,
    padding rows, masks, destinations outside the cache, sources beyond the pool, attention rows
    wider than K. vLLM's op, ours and the reference, whole slab and attention bit for bit. A source
    on the device (as runtime.py's prefill staging passes one) must be refused by both ops."""
    rng = np.random.default_rng(seed)
    tallies: dict = {"vllm_vs_reference": [0, 0], "ours_vs_vllm": [0, 0]}
    for case in range(cases):
        kind = ("lines", "chunks")[case % 2]  # our two copies (lines serves rows of 128 B and more)
        os.environ["HISPARSE_COMPACT_KERNEL"] = kind
        n, k = int(rng.integers(1, 9)), int(rng.integers(1, 65))
        width = int(rng.choice([7, 20, 16, 48, 656, 1168, 16, 48, 656, 1168]))
        paged = bool(rng.random() < 0.7)
        bs = int(rng.choice([1, 4, 16, 64])) if paged else 1
        layers = int(rng.choice([1, 2])) if paged else 1
        nblocks = int(rng.integers(1, 6)) + -(-n * k // bs)
        shape = (nblocks, layers, bs, width) if paged else (nblocks, width)
        slab = torch.from_numpy(rng.integers(0, 256, shape, dtype=np.uint8)).cuda()
        host_rows = int(rng.integers(1, 4 * n * k + 2))
        host_np = rng.integers(0, 256, (host_rows, width), dtype=np.uint8)
        on_device = bool(rng.random() < 0.1)
        host = torch.from_numpy(host_np).cuda() if on_device else torch.from_numpy(host_np).pin_memory()
        hot_rows = nblocks * bs
        src = rng.integers(-3, host_rows + 5, (n, k)).astype(np.int32)
        dst = (rng.permutation(hot_rows + 8)[: n * k] - 4)
        if dst.size < n * k:
            continue
        dst = dst.reshape(n, k).astype(np.int32)  # distinct: no two entries race for a row
        mask = (rng.random((n, k)) < float(rng.choice([0.1, 0.5, 1.0]))).astype(np.int32)
        rsi = None
        if rng.random() < 0.7:
            rsi = rng.integers(0, 8, n + int(rng.integers(0, 3))).astype(np.int32)
            rsi[rng.random(rsi.size) < 0.2] = -1
        att_cols = k + (int(rng.integers(1, 3)) if rng.random() < 0.15 else 0)  # wider rows: refused by both
        att = np.full((n, att_cols), POISON, np.int32) if rng.random() < 0.6 else None
        abs_ = int(rng.integers(0, 3)) * bs + bs
        layer = int(rng.integers(layers))
        view = (lambda t: t[:, layer]) if paged else (lambda t: t)
        # a bf16 view of the hot cache where the row width allows (vLLM's op takes any dtype)
        as_dtype = (lambda t: t.view(torch.bfloat16)) if width % 2 == 0 and rng.random() < 0.3 else (lambda t: t)
        host_t = as_dtype(host)
        want = slab.cpu().numpy()
        mine = slab.clone()
        g_att, m_att = dev(att), dev(att)
        gs, gd, gm, grsi = dev(src), dev(dst), dev(mask), dev(rsi)
        # Inputs vLLM's op refuses (a device source, rows not a multiple of 16 bytes) must be
        # refused by ours too; the rest are compared.
        outcome = []
        for op, target, a in ((ops.hisparse_gather_plan, slab, g_att), (ours.vllm_gather_plan, mine, m_att)):
            try:
                op(host_t, as_dtype(view(target)), gs, gd, gm, grsi, None if att is None else a[:, :k], abs_)
                outcome.append("ran")
            except RuntimeError as e:
                outcome.append("refused: " + str(e).splitlines()[0][-80:])
        torch.cuda.synchronize()
        if outcome != ["ran", "ran"]:
            both = outcome[0] != "ran" and outcome[1] != "ran"
            tallies.setdefault("refused_by_both", [0, 0])[0 if both else 1] += 1
            if not both:  # each distinct disagreement once
                seen = tallies.setdefault("refusal_mismatches", [])
                if outcome not in seen:
                    seen.append(outcome)
            continue
        ref.gather_plan_ref(host_np, view(want) if paged else want, src, dst, mask, rsi,
                            None if att is None else att[:, :k], abs_)
        torch.cuda.synchronize()
        ok_ref = np.array_equal(want, slab.cpu().numpy()) and (att is None or np.array_equal(att, g_att.cpu().numpy()))
        tallies["vllm_vs_reference"][0 if ok_ref else 1] += 1
        same = bool(torch.equal(mine, slab)) and (att is None or bool(torch.equal(m_att, g_att)))
        tallies["ours_vs_vllm"][0 if same else 1] += 1
        key = f"ours_{kind if width >= 128 else 'chunks'}_vs_vllm_{'paged' if paged else '2d'}"
        tallies.setdefault(key, [0, 0])[0 if same else 1] += 1
    os.environ.pop("HISPARSE_COMPACT_KERNEL", None)
    return tallies


def fuzz_invalidate(ops, ours, cases: int, seed: int) -> dict:
    """invalidate_written_slots alone: several tokens of one state, duplicates, slots beyond int32,
    request ids and states out of range, rows whose length is not a multiple of 4. vLLM's op, ours and
    the reference, the whole state bit for bit; other dtypes than vLLM's must be refused by both."""
    rng = np.random.default_rng(seed)
    tallies: dict = {"vllm_vs_reference": [0, 0], "ours_vs_vllm": [0, 0]}
    for _ in range(cases):
        states, h = int(rng.integers(1, 9)), int(rng.integers(1, 300))
        dgi = rng.integers(-1, 200, (states, h)).astype(np.int32)
        nreq = int(rng.integers(1, 9))
        rsi = rng.integers(-2, states + 2, nreq).astype(np.int32)
        ntok = int(rng.integers(1, 40))
        slots = rng.integers(-3, 210, ntok).astype(np.int64)
        slots[rng.random(ntok) < 0.05] = (1 << 32) + 5  # beyond int32: matches nothing
        rid = rng.integers(-2, nreq + 2, ntok)
        slot_dtype = np.int64 if rng.random() < 0.85 else np.int32  # vLLM's op takes int64 slots,
        rid_dtype = np.int32 if rng.random() < 0.85 else np.int64  # int32 request ids
        if slot_dtype == np.int32:
            slots = np.where(slots > np.iinfo(np.int32).max, 7, slots)
        slots, rid = slots.astype(slot_dtype), rid.astype(rid_dtype)
        g, m = dev(dgi), dev(dgi)
        outcome = []
        for op, target in ((ops.hisparse_invalidate_written_slots, g), (ours.vllm_invalidate_written_slots, m)):
            try:
                op(target, dev(rsi), dev(rid), dev(slots))
                outcome.append("ran")
            except RuntimeError as e:
                outcome.append("refused: " + str(e).splitlines()[0][-80:])
        torch.cuda.synchronize()
        if outcome != ["ran", "ran"]:  # dtypes vLLM's op refuses must be refused by ours too
            both = outcome[0] != "ran" and outcome[1] != "ran"
            tallies.setdefault("refused_by_both", [0, 0])[0 if both else 1] += 1
            seen = tallies.setdefault("refusal_mismatches", [])
            if not both and outcome not in seen:
                seen.append(outcome)
            continue
        ref.invalidate_written_slots_ref(dgi, rsi, rid, slots)
        torch.cuda.synchronize()
        tallies["vllm_vs_reference"][0 if np.array_equal(dgi, g.cpu().numpy()) else 1] += 1
        tallies["ours_vs_vllm"][0 if torch.equal(m, g) else 1] += 1
    return tallies


def diagnose_resident(ops, steps: int, seed: int, out_dir: str) -> dict:
    """Resident-mode steps only: which candidate resident rule the wheel follows, step by step."""
    saved = MODES[:]
    MODES[:] = ["resident"]
    diag: dict = {}
    try:
        result = fuzz(ops, steps, seed, diag)
    finally:
        MODES[:] = saved
    dumps = diag.pop("dumps", [])
    flat = {}
    for i, d in enumerate(dumps):
        for key, v in d.items():
            if isinstance(v, dict):
                for sub, w in v.items():
                    flat[f"c{i}_{key}_{sub}"] = w
            elif v is not None and key != "diff":
                flat[f"c{i}_{key}"] = np.asarray(v)
        flat[f"c{i}_diff"] = np.array(d["diff"])
    if flat:
        np.savez_compressed(os.path.join(out_dir, "resident_diag_cases.npz"), **flat)
    return {"steps": result["resolve_steps"], "variants": diag.get("variants", {}), "dumped": len(dumps),
            "checks_with_reference": result["checks"].get("resolve_residency")}


BENCH_ITERS = 30  # --bench-iters (1 under compute-sanitizer: the production shapes checked, not timed)


def time_it(fn, iters: int = 0) -> float:
    iters = iters or BENCH_ITERS
    for _ in range(3 if BENCH_ITERS > 1 else 1):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters  # us


def bench(ops, ours) -> dict:
    """Production shapes: 64 requests, top-k 2048, 4096 hot slots, 656 B rows, 64-row blocks."""
    n, k, hot, bs, w = 64, 2048, 4096, 64, 656
    rng = np.random.default_rng(1)
    host_rows = 1 << 20  # 656 MiB pinned
    host = torch.empty((host_rows, w), dtype=torch.uint8).pin_memory()
    hb = hot // bs
    hbt = torch.arange(n * hb, dtype=torch.int32, device="cuda").view(n, hb)
    hot_cache = torch.zeros((n * hb, bs, w), dtype=torch.uint8, device="cuda")
    rsi = torch.arange(n, dtype=torch.int32, device="cuda")
    results: dict = {}

    def plan(frac_new: float, runs: int) -> dict:
        dgi = torch.full((n, hot), -1, dtype=torch.int32, device="cuda")
        lru = torch.arange(hot, dtype=torch.int16, device="cuda").repeat(n, 1).contiguous()
        base = np.stack([rng.choice(host_rows // runs, k // runs, replace=False) * runs for _ in range(n)])
        base = (base[:, :, None] + np.arange(runs)).reshape(n, k).astype(np.int32)
        o = {nm: torch.empty((n, k), dtype=torch.int32, device="cuda") for nm in ("hot", "att", "sh", "sd")}
        sc = torch.empty(n, dtype=torch.int32, device="cuda")
        stats = torch.zeros(2, dtype=torch.uint64, device="cuda")

        def resolve(t, impl=None, oo=None, d=None, l=None, sc_=None):
            (impl or ops.hisparse_resolve_residency)(
                host, hot_cache, hbt, t, (oo or o)["hot"], dgi if d is None else d, lru if l is None else l, rsi,
                hot, k, None, stats, (oo or o)["att"], bs, None, None, 0, None, None, (oo or o)["sh"],
                (oo or o)["sd"], sc if sc_ is None else sc_, None, 0, 0)
        t0 = torch.from_numpy(base).cuda()
        resolve(t0)  # warm the state
        step = base.copy()
        m = int(k * frac_new)
        if m:
            fresh = rng.choice(host_rows // runs, (n, m // runs), replace=True) * runs
            step[:, :m] = (fresh[:, :, None] + np.arange(runs)).reshape(n, -1)[:, :m]
        t1 = torch.from_numpy(step).cuda()
        return {"resolve": resolve, "t0": t0, "t1": t1, "o": o, "sc": sc, "dgi": dgi, "lru": lru}

    for name, frac, runs in (("all_hit", 0.0, 1), ("miss_10pct_random", 0.1, 1), ("all_miss_random", 1.0, 1),
                             ("all_miss_runs4", 1.0, 4)):
        p = plan(frac, runs)
        p["resolve"](p["t0"])
        dgi0, lru0 = p["dgi"].clone(), p["lru"].clone()

        def resolve_only():
            p["dgi"].copy_(dgi0)
            p["lru"].copy_(lru0)
            p["resolve"](p["t1"])
        reset_us = time_it(lambda: (p["dgi"].copy_(dgi0), p["lru"].copy_(lru0)))
        res_us = time_it(resolve_only) - reset_us
        resolve_only()
        torch.cuda.synchronize()
        misses = int(p["sc"].sum().item())
        entry = {"misses": misses, "vllm_resolve_us": round(res_us, 2)}
        if ours is not None and hasattr(ours, "vllm_resolve_residency"):
            oo = {nm: torch.full_like(v, POISON) for nm, v in p["o"].items()}
            osc = torch.full_like(p["sc"], POISON)
            d1, l1 = dgi0.clone(), lru0.clone()
            # Both from the same state into the same poison (entries past the swap counts stay unwritten)
            for v in list(p["o"].values()) + [p["sc"]]:
                v.fill_(POISON)
            p["dgi"].copy_(dgi0)
            p["lru"].copy_(lru0)
            p["resolve"](p["t1"])
            p["resolve"](p["t1"], ours.vllm_resolve_residency, oo, d1, l1, osc)
            torch.cuda.synchronize()
            differ = [nm for nm in oo if not torch.equal(oo[nm], p["o"][nm])]
            differ += [nm for nm, x, y in (("swap_counts", osc, p["sc"]), ("device_global_indices", d1, p["dgi"]),
                                           ("lru_slots", l1, p["lru"])) if not torch.equal(x, y)]
            same = not differ
            entry["ours_resolve_differs"] = differ
            if "hot" in differ:  # where: vLLM leaves later same-row duplicates of a missed entry unwritten
                mine_h, theirs_h, top = oo["hot"].cpu().numpy(), p["o"]["hot"].cpu().numpy(), p["t1"].cpu().numpy()
                rows, cols = np.nonzero(mine_h != theirs_h)
                dup = [bool((top[r, :c] == top[r, c]).any()) for r, c in zip(rows.tolist(), cols.tolist())]
                entry["ours_resolve_hot_mismatch"] = {
                    "positions": int(rows.size), "later_duplicate_in_row": int(sum(dup)),
                    "vllm_left_poison": int((theirs_h[rows, cols] == POISON).sum()),
                    "duplicate_positions_in_plan": int(sum(int(len(r) - len(np.unique(r))) for r in top)),
                }

            def ours_only():
                d1.copy_(dgi0)
                l1.copy_(lru0)
                p["resolve"](p["t1"], ours.vllm_resolve_residency, oo, d1, l1, osc)
            ours_reset = time_it(lambda: (d1.copy_(dgi0), l1.copy_(lru0)))
            ours_us = time_it(ours_only) - ours_reset
            res2 = time_it(resolve_only) - reset_us
            entry.update(ours_resolve_us=round(ours_us, 2), ours_resolve_bit_exact=bool(same),
                         vllm_resolve_again_us=round(res2, 2),
                         ours_resolve_over_vllm_speed=round(min(res_us, res2) / ours_us, 2))
            resolve_only()
            torch.cuda.synchronize()
        if misses:
            gc_us = time_it(lambda: ops.hisparse_gather_compact(host, hot_cache, p["o"]["sh"], p["o"]["sd"], p["sc"]))
            nbytes = misses * w
            src = host[: misses].view(-1)
            dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            mc_us = time_it(lambda: dst.copy_(src, non_blocking=True))
            entry.update(vllm_gather_compact_us=round(gc_us, 2), memcpy_us=round(mc_us, 2),
                         vllm_gather_compact_x_memcpy=round(mc_us / gc_us, 3),
                         vllm_gather_compact_GBps=round(nbytes / gc_us / 1e3, 1))
            if ours is not None:
                flat = hot_cache.view(-1, w)
                nrr = torch.tensor([n], dtype=torch.int32, device="cuda")
                our_us = time_it(lambda: ours.gather_plan(host, flat, p["o"]["sh"], p["o"]["sd"], p["sc"], nrr, 0))
                entry.update(ours_gather_plan_us=round(our_us, 2),
                             ours_over_vllm_speed=round(gc_us / our_us, 3))
                # Our op under vLLM's schema, same arguments; each variant checked bit-exact against
                # vLLM's result on this plan first, then timed; vLLM's and memcpy timed again after.
                want = hot_cache.clone()
                for unroll in ("lines", "chunks", "chunks8"):
                    os.environ["HISPARSE_COMPACT_KERNEL"] = unroll
                    hot_cache.zero_()
                    ops.hisparse_gather_compact(host, hot_cache, p["o"]["sh"], p["o"]["sd"], p["sc"])
                    ref_bytes = hot_cache.clone()
                    hot_cache.zero_()
                    ours.vllm_gather_compact(host, hot_cache, p["o"]["sh"], p["o"]["sd"], p["sc"])
                    torch.cuda.synchronize()
                    same = bool(torch.equal(ref_bytes, hot_cache))
                    us = time_it(lambda: ours.vllm_gather_compact(host, hot_cache, p["o"]["sh"], p["o"]["sd"], p["sc"]))
                    entry[f"ours_compact_{unroll}_us"] = round(us, 2)
                    entry[f"ours_compact_{unroll}_bit_exact"] = same
                    entry[f"ours_compact_{unroll}_over_vllm_speed"] = round(gc_us / us, 3)
                    entry[f"ours_compact_{unroll}_x_memcpy"] = round(mc_us / us, 3)
                os.environ.pop("HISPARSE_COMPACT_KERNEL", None)
                hot_cache.copy_(want)
                gc2 = time_it(lambda: ops.hisparse_gather_compact(host, hot_cache, p["o"]["sh"], p["o"]["sd"], p["sc"]))
                mc2 = time_it(lambda: dst.copy_(src, non_blocking=True))
                entry.update(vllm_gather_compact_again_us=round(gc2, 2), memcpy_again_us=round(mc2, 2))
        results[name] = entry
        print(name, entry, flush=True)
    return results


def bench_plan_invalidate(ops, ours) -> dict:
    """gather_plan and invalidate_written_slots at production shapes, vLLM's op beside ours (each
    checked bit-exact on the timed inputs first; vLLM's timed before and again after ours)."""
    n, k, bs, w = 64, 2048, 64, 656
    rng = np.random.default_rng(2)
    host_rows = 1 << 20
    host = torch.from_numpy(rng.integers(0, 256, (host_rows, w), dtype=np.uint8)).pin_memory()
    hot_blocks = n * k // bs + 8
    hot_cache = torch.zeros((hot_blocks, bs, w), dtype=torch.uint8, device="cuda")
    rsi = torch.arange(n, dtype=torch.int32, device="cuda")
    results: dict = {}
    for name, frac, runs in (("plan_miss_10pct_random", 0.1, 1), ("plan_all_miss_random", 1.0, 1),
                             ("plan_all_miss_runs4", 1.0, 4)):
        src_cache = host
        base = np.stack([rng.choice(host_rows // runs, k // runs, replace=False) * runs for _ in range(n)])
        gids = torch.from_numpy((base[:, :, None] + np.arange(runs)).reshape(n, k).astype(np.int32)).cuda()
        dst = torch.from_numpy(rng.permutation(hot_blocks * bs)[: n * k].reshape(n, k).astype(np.int32)).cuda()
        mask = torch.from_numpy((rng.random((n, k)) < frac).astype(np.int32)).cuda()
        att_v, att_o = (torch.full((n, k), POISON, dtype=torch.int32, device="cuda") for _ in range(2))

        def vllm_plan():
            ops.hisparse_gather_plan(src_cache, hot_cache, gids, dst, mask, rsi, att_v, bs)

        def ours_plan():
            ours.vllm_gather_plan(src_cache, hot_cache, gids, dst, mask, rsi, att_o, bs)
        hot_cache.zero_()
        vllm_plan()
        want = hot_cache.clone()
        hot_cache.zero_()
        ours_plan()
        torch.cuda.synchronize()
        same = bool(torch.equal(want, hot_cache)) and bool(torch.equal(att_v, att_o))
        copies = int(mask.sum().item())
        flat_src = src_cache[:copies].view(-1)
        flat_dst = torch.empty(copies * w, dtype=torch.uint8, device="cuda")
        v1, o = time_it(vllm_plan), time_it(ours_plan)
        os.environ["HISPARSE_COMPACT_KERNEL"] = "chunks"
        hot_cache.zero_()
        ours_plan()
        torch.cuda.synchronize()
        same_chunks = bool(torch.equal(want, hot_cache))
        oc = time_it(ours_plan)
        os.environ.pop("HISPARSE_COMPACT_KERNEL", None)
        v2 = time_it(vllm_plan)
        mc = time_it(lambda: flat_dst.copy_(flat_src, non_blocking=True))
        entry = {"rows_copied": copies, "bit_exact": same, "vllm_us": round(v1, 2),
                 "vllm_again_us": round(v2, 2), "ours_us": round(o, 2), "memcpy_us": round(mc, 2),
                 "ours_over_vllm_speed": round(min(v1, v2) / o, 3), "ours_x_memcpy": round(mc / o, 3),
                 "ours_chunks_us": round(oc, 2), "ours_chunks_bit_exact": same_chunks,
                 "ours_chunks_over_vllm_speed": round(min(v1, v2) / oc, 3)}
        results[name] = entry
        print(name, entry, flush=True)
    h = 4096
    for states, tokens in ((64, 64), (512, 512), (512, 4096)):
        dgi0 = torch.from_numpy(rng.integers(0, host_rows, (states, h)).astype(np.int32)).cuda()
        rid = torch.from_numpy(rng.integers(0, states, tokens).astype(np.int32)).cuda()
        srsi = torch.arange(states, dtype=torch.int32, device="cuda")
        pick = rng.integers(0, h, tokens)
        slots = dgi0.cpu().numpy()[rid.cpu().numpy(), pick].astype(np.int64)  # each token hits its state
        slots_t = torch.from_numpy(slots).cuda()
        dv, do = dgi0.clone(), dgi0.clone()
        ops.hisparse_invalidate_written_slots(dv, srsi, rid, slots_t)
        ours.vllm_invalidate_written_slots(do, srsi, rid, slots_t)
        torch.cuda.synchronize()
        same = bool(torch.equal(dv, do)) and not torch.equal(dv, dgi0)
        # Back to back on the invalidated state: every launch scans the same rows, none writes (the
        # first call's writes are checked above), so no reset copy sits inside the reading.
        v1 = time_it(lambda: ops.hisparse_invalidate_written_slots(dv, srsi, rid, slots_t))
        o = time_it(lambda: ours.vllm_invalidate_written_slots(do, srsi, rid, slots_t))
        v2 = time_it(lambda: ops.hisparse_invalidate_written_slots(dv, srsi, rid, slots_t))
        entry = {"states": states, "hot_slots": h, "tokens": tokens, "bit_exact": same, "vllm_us": round(v1, 2),
                 "vllm_again_us": round(v2, 2), "ours_us": round(o, 2),
                 "ours_over_vllm_speed": round(min(v1, v2) / o, 3)}
        results[f"invalidate_{states}x{tokens}"] = entry
        print(f"invalidate_{states}x{tokens}", entry, flush=True)
    return results


def bench_trace(ops, ours, path: str) -> dict:
    """Decode steps of the production host-pool trace (``results/footprint/*_trace.npz``: per
    placement and step, 64 requests' top-2048 host slots of one layer, -1 padding), each from a cold
    hot buffer (every entry a miss): vLLM's resolve + gather_compact against ours, every output and
    the hot cache compared, per op and per step, beside a pinned memcpy of the same bytes."""
    data = np.load(path)
    keys = sorted(k for k in data.files if "/" in k)
    n, k = data[keys[0]].shape
    hot, bs, w = 4096, 64, 656
    host_rows = int(max(int(data[key].max()) for key in keys)) + 1
    host = torch.empty((host_rows, w), dtype=torch.uint8).pin_memory()
    host.view(-1)[:: 4096].fill_(7)  # touched: every page resident before timing
    hb = hot // bs
    hbt = torch.arange(n * hb, dtype=torch.int32, device="cuda").view(n, hb)
    rsi = torch.arange(n, dtype=torch.int32, device="cuda")
    side = {}
    for name in ("vllm", "ours"):
        side[name] = {
            "hot_cache": torch.zeros((n * hb, bs, w), dtype=torch.uint8, device="cuda"),
            "dgi": torch.full((n, hot), -1, dtype=torch.int32, device="cuda"),
            "lru": torch.arange(hot, dtype=torch.int16, device="cuda").repeat(n, 1).contiguous(),
            "stats": torch.zeros(2, dtype=torch.uint64, device="cuda"),
            **{nm: torch.full((n, k), POISON, dtype=torch.int32, device="cuda") for nm in ("hot", "att", "sh", "sd")},
            "sc": torch.full((n,), POISON, dtype=torch.int32, device="cuda"),
        }
    dgi0 = side["vllm"]["dgi"].clone()
    lru0 = side["vllm"]["lru"].clone()
    impl = {"vllm": (ops.hisparse_resolve_residency, ops.hisparse_gather_compact),
            "ours": (ours.vllm_resolve_residency, ours.vllm_gather_compact)}

    def reset(sd):
        sd["dgi"].copy_(dgi0)
        sd["lru"].copy_(lru0)

    def resolve(name, t):
        sd = side[name]
        impl[name][0](host, sd["hot_cache"], hbt, t, sd["hot"], sd["dgi"], sd["lru"], rsi, hot, k, None,
                      sd["stats"], sd["att"], bs, None, None, 0, None, None, sd["sh"], sd["sd"], sd["sc"], None, 0, 0)

    def compact(name):
        sd = side[name]
        impl[name][1](host, sd["hot_cache"], sd["sh"], sd["sd"], sd["sc"])

    results: dict = {"trace": os.path.basename(path), "host_rows": host_rows, "pool_gib": round(host_rows * w / 2**30, 2)}
    for key in keys:
        t = torch.from_numpy(np.ascontiguousarray(data[key], dtype=np.int32)).cuda()
        for name in side:
            reset(side[name])
            resolve(name, t)
            compact(name)
        torch.cuda.synchronize()
        a, b = side["vllm"], side["ours"]
        differ = [nm for nm in ("hot", "att", "sh", "sd", "sc", "dgi", "lru", "hot_cache") if not torch.equal(a[nm], b[nm])]
        misses = int(a["sc"].clamp(min=0).sum().item())
        entry = {"misses": misses, "bit_exact": not differ, "differs": differ}
        for name in side:
            r = time_it(lambda: (reset(side[name]), resolve(name, t))) - time_it(lambda: reset(side[name]))
            c = time_it(lambda: compact(name))
            entry[f"{name}_resolve_us"] = round(r, 2)
            entry[f"{name}_gather_compact_us"] = round(c, 2)
            entry[f"{name}_step_us"] = round(r + c, 2)
        entry["vllm_gather_compact_again_us"] = round(time_it(lambda: compact("vllm")), 2)
        src = host[:misses].view(-1)
        dst = torch.empty(misses * w, dtype=torch.uint8, device="cuda")
        entry["memcpy_us"] = round(time_it(lambda: dst.copy_(src, non_blocking=True)), 2)
        entry["step_speed"] = round(entry["vllm_step_us"] / entry["ours_step_us"], 3)
        entry["gather_compact_speed"] = round(min(entry["vllm_gather_compact_us"], entry["vllm_gather_compact_again_us"])
                                              / entry["ours_gather_compact_us"], 3)
        results[key] = entry
        print("trace", key, entry, flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("so")
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=".")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--compact-cases", type=int, default=3000, help="with --ours: gather_compact-only cases")
    ap.add_argument("--plan-cases", type=int, default=3000, help="with --ours: gather_plan-only cases")
    ap.add_argument("--invalidate-cases", type=int, default=3000,
                    help="with --ours: invalidate_written_slots-only cases")
    ap.add_argument("--ours-cases", type=int, default=10000,
                    help="with --ours: resolve steps of a second differential that also runs our gather_compact")
    ap.add_argument("--diagnose", type=int, default=0,
                    help="first, this many resident-mode steps judged under every candidate resident rule")
    ap.add_argument("--modes", default=",".join(MODES), help="case modes to draw from (comma list)")
    ap.add_argument("--ours", action="store_true", help="build our extension and time our gather_plan too")
    ap.add_argument("--bench-iters", type=int, default=30, help="timed iterations per benchmark reading")
    ap.add_argument("--trace", nargs="*", default=[],
                    help="with --ours: host-pool traces (results/footprint/*_trace.npz) timed step by step")
    ap.add_argument("--no-timing", action="store_true", help="with --ours: the differentials only (sanitizer runs)")
    args = ap.parse_args()
    global BENCH_ITERS
    BENCH_ITERS = args.bench_iters
    MODES[:] = args.modes.split(",")
    ops = load_vllm(args.so)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.diagnose:
        report["resident_diagnosis"] = diagnose_resident(ops, args.diagnose, args.seed + 1000, args.out)
        print(json.dumps({k: v for k, v in report["resident_diagnosis"].items() if k != "checks_with_reference"},
                         indent=1), flush=True)
    report["fuzz"] = fuzz(ops, args.cases, args.seed)
    print(json.dumps(report["fuzz"], indent=1), flush=True)
    if not args.no_bench:
        ours = None
        if args.ours:
            try:
                from hisparse_kernels.ops import _extension
                t0 = time.time()
                _extension.ensure_loaded()
                ours = torch.ops.hisparse
                report["ours_build_seconds"] = round(time.time() - t0, 1)
            except Exception as e:  # the comparison is optional; the fuzz result stands alone
                report["ours_error"] = repr(e)[-2000:]
                print("ours unavailable:", repr(e)[-4000:], flush=True)
        if ours is not None:
            global OURS
            OURS = ours
            report["compact_fuzz"] = fuzz_compact(ops, ours, args.compact_cases, args.seed + 2000)
            print("compact_fuzz", report["compact_fuzz"], flush=True)
            report["plan_fuzz"] = fuzz_plan(ops, ours, args.plan_cases, args.seed + 4000)
            print("plan_fuzz", report["plan_fuzz"], flush=True)
            report["invalidate_fuzz"] = fuzz_invalidate(ops, ours, args.invalidate_cases, args.seed + 5000)
            print("invalidate_fuzz", report["invalidate_fuzz"], flush=True)
            report["fuzz_with_ours"] = fuzz(ops, args.ours_cases, args.seed + 3000)
            print("fuzz_with_ours", json.dumps({k: v for k, v in report["fuzz_with_ours"]["checks"].items()
                                                if k != "by_mode"}), flush=True)
        if not args.no_timing:
            report["bench"] = bench(ops, ours)
            if ours is not None:
                report["bench_plan_invalidate"] = bench_plan_invalidate(ops, ours)
                for path in args.trace:
                    report.setdefault("bench_trace", []).append(bench_trace(ops, ours, path))
    with open(os.path.join(args.out, "vllm_ops_diff.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
