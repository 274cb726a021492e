"""Hot-buffer kernel benchmarks on the GPU, each figure beside its limit measured in the same run.

Prints a table and writes JSON (``--out``). Times are CUDA-event medians after warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hisparse_kernels import HostPool, HotState, IndexSharePrefetcher, ensure_loaded  # noqa: E402
from hisparse_kernels.ops import gather_plan, resolve, swap_in  # noqa: E402



def timed(fn: Callable[[], None], *, setup: Callable[[], None] | None = None, reps: int = 20,
          warmup: int = 3, stream: torch.cuda.Stream | None = None) -> float:
    """Median milliseconds of ``fn`` between two events (``setup`` runs before each, untimed)."""
    stream = stream or torch.cuda.current_stream()
    times = []
    for i in range(warmup + reps):
        if setup is not None:
            setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_ms_per_call(fn: Callable[[], None], loops: int = 50) -> float:
    """Milliseconds per call of ``fn`` replayed from one captured graph of ``loops`` back-to-back calls
    (no host launch cost); a warm-up call runs on a side stream first, as capture requires."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(loops):
            fn()
    t = timed(graph.replay, reps=20) / loops
    del graph
    return t


# The capped-grid copy the prefetch uses: HISPARSE_PREFETCH_KERNEL, or the ops' default
# (prefetch_copy_kind in csrc/hot_buffer_ops.cu).
PREFETCH_KERNEL = os.environ.get("HISPARSE_PREFETCH_KERNEL", "deep")

# The resolve forms other than the default (the fast kernel), timed beside it.
RESOLVE_VARIANTS = (("general", {"resolve_kernel": "general"}),)


@contextlib.contextmanager
def kernel_env(**switches: str):  # noqa: ANN201 - a context manager
    """Set the ops' kernel switches (HISPARSE_<NAME>=value, read at every launch) for a block."""
    saved = {k: os.environ.get(f"HISPARSE_{k.upper()}") for k in switches}
    os.environ.update({f"HISPARSE_{k.upper()}": v for k, v in switches.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(f"HISPARSE_{k.upper()}", None)
            else:
                os.environ[f"HISPARSE_{k.upper()}"] = v


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--hot-slots", type=int, default=4096)
    args = parser.parse_args()
    ensure_loaded()
    ops = torch.ops.hisparse
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    B, K, H = args.requests, args.topk, args.hot_slots
    results: dict[str, float | str | int] = {
        "gpu": torch.cuda.get_device_name(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "requests": B, "topk": K, "hot_slots": H,
        # plan copy for rows >= 128 B: "lines" (line-aligned, adjacent rows merged), "chunks" or "bulk"
        "gather_kernel": os.environ.get("HISPARSE_GATHER_KERNEL", "lines"),
        # copy of a capped prefetch grid: "deep", "wide", "async", "exclusive", "bulk", "lines", "chunks"
        "prefetch_kernel": PREFETCH_KERNEL,
        "resolve_kernel": os.environ.get("HISPARSE_RESOLVE_KERNEL", "fast"),
    }
    rows: list[tuple[str, str, str]] = []

    pool_bytes = 1 << 30
    host = HostPool(1, pool_bytes // 16, 16)
    host.tensor.view(-1).view(torch.int32).copy_(
        torch.randint(-2**31, 2**31 - 1, (pool_bytes // 4,), dtype=torch.int32))
    flat = host.layer(0).view(-1)

    def pool_view(w: int) -> torch.Tensor:
        return flat[: (pool_bytes // w) * w].view(-1, w)

    # --- the link: pinned H2D memcpy
    dst_big = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    t = timed(lambda: dst_big.copy_(flat[: 256 << 20], non_blocking=True))
    memcpy = (256 << 20) / t / 1e6
    results["memcpy_h2d_gbps"] = memcpy
    rows.append(("pinned H2D cudaMemcpy (256 MiB)", f"{memcpy:.1f} GB/s", "link"))

    def unique_rows(n_pool: int, n: int) -> np.ndarray:
        return rng.choice(n_pool, size=n, replace=False).astype(np.int32)

    def runs_rows(n_pool: int, n: int, run: int) -> np.ndarray:
        starts = rng.choice(n_pool // run, size=n // run, replace=False) * run
        return (starts[:, None] + np.arange(run)[None, :]).reshape(-1).astype(np.int32)

    n = B * K
    # --- copy ceilings of the layout: copy-only flat gathers
    hot_rows_n = B * ((H + 1 + 127) // 128 * 128)
    for w in (656, 640, 1152):
        pool = pool_view(w)
        hot = torch.empty(hot_rows_n, w, dtype=torch.uint8, device=dev)
        for label, src_np in (("random", unique_rows(pool.shape[0], n)), ("runs4", runs_rows(pool.shape[0], n, 4))):
            if w != 656 and label == "runs4":
                continue
            src = torch.from_numpy(src_np).to(dev)
            dst = torch.from_numpy(rng.permutation(hot_rows_n)[:n].astype(np.int32)).to(dev)
            t = timed(lambda: ops.bench_flat_gather(pool, hot, src, dst))
            gbps = n * w / t / 1e6
            results[f"copy_only_{label}_{w}B_gbps"] = gbps
            rows.append((f"copy-only gather {label} {w} B x {n}", f"{gbps:.1f} GB/s", f"{gbps / memcpy:.3f} x memcpy"))
        del hot
    results["copy_only_random_gbps"] = results["copy_only_random_656B_gbps"]
    results["copy_only_runs4_gbps"] = results["copy_only_runs4_656B_gbps"]

    # --- swap-in (resolve + copy), every column a miss, 656 B rows
    w = 656
    pool = pool_view(w)
    state = HotState.allocate(B, K, H, dev)
    rs = state.region_stride
    hot = torch.empty(B * rs, w, dtype=torch.uint8, device=dev)
    newest = torch.full((B,), -1, dtype=torch.int32, device=dev)
    real = torch.tensor([B], dtype=torch.int32, device=dev)

    def cold() -> None:
        state.dgi.fill_(-1)

    def do_swap(topk: torch.Tensor) -> None:
        swap_in(topk, newest, real, state.dgi, state.lru, state.hot_rows, state.plan_src, state.plan_dst,
                state.plan_count, state.counters, state.miss_mask, pool, hot, region_stride=rs)

    for label in ("random", "runs4", "runs4_shuffled"):
        if label == "random":
            src_np = unique_rows(pool.shape[0], n)
        else:
            src_np = runs_rows(pool.shape[0], n, 4).reshape(B, K)
            if label == "runs4_shuffled":  # adjacent slots, but scattered over the top-k columns
                src_np = np.stack([rng.permutation(row) for row in src_np])
        topk = torch.from_numpy(np.ascontiguousarray(src_np).reshape(B, K)).to(dev)
        t = timed(lambda: do_swap(topk), setup=cold)
        gbps = n * w / t / 1e6
        results[f"swap_in_{label}_gbps"] = gbps
        results[f"swap_in_{label}_us"] = t * 1e3
        # the copy-only ceiling for exactly these miss rows (same sources and destinations)
        cold()
        do_swap(topk)
        src_flat = state.plan_src.reshape(-1).clone()
        dst_flat = state.plan_dst.reshape(-1).clone()
        t_copy = timed(lambda: ops.bench_flat_gather(pool, hot, src_flat, dst_flat))
        t_plan = timed(lambda: gather_plan(pool, hot, state.plan_src, state.plan_dst, state.plan_count, real))
        copy_gbps = n * w / t_copy / 1e6
        results[f"copy_only_same_rows_{label}_gbps"] = copy_gbps
        results[f"gather_plan_{label}_gbps"] = n * w / t_plan / 1e6
        rows.append((f"swap-in {label} all-miss {B}x{K}", f"{gbps:.1f} GB/s ({t * 1e3:.0f} us)",
                     f"{gbps / copy_gbps:.3f} x copy-only ({copy_gbps:.1f}); {gbps / memcpy:.3f} x memcpy"))
        rows.append((f"  gather_plan only ({label})", f"{n * w / t_plan / 1e6:.1f} GB/s", ""))
        # the variants, same rows, same run: the other plan copies and the other resolve kernel
        for variant, switches in (("bulk", {"gather_kernel": "bulk"}), ("async", {"gather_kernel": "async"}),
                                  ("lines", {"gather_kernel": "lines"}),
                                  ("general_resolve", {"resolve_kernel": "general"})):
            with kernel_env(**switches):
                t_v = timed(lambda: do_swap(topk), setup=cold)
                t_pv = timed(lambda: gather_plan(pool, hot, state.plan_src, state.plan_dst, state.plan_count,
                                                 real))
            results[f"swap_in_{label}_{variant}_gbps"] = n * w / t_v / 1e6
            results[f"gather_plan_{label}_{variant}_gbps"] = n * w / t_pv / 1e6
            rows.append((f"  variant {variant}: swap-in / gather_plan", f"{n * w / t_v / 1e6:.1f} / "
                         f"{n * w / t_pv / 1e6:.1f} GB/s", f"{n * w / t_v / 1e6 / memcpy:.3f} x memcpy"))
        # resolve alone, every column a miss (the part of swap-in that is not the copy)
        for variant, switches in (("fast", {}), *RESOLVE_VARIANTS):
            with kernel_env(**switches):
                t_r = timed(lambda: resolve(topk, newest, real, state.dgi, state.lru, state.hot_rows,
                                            state.plan_src, state.plan_dst, state.plan_count, state.counters,
                                            state.miss_mask, region_stride=rs, pool_rows=pool.shape[0]),
                            setup=cold)
            results[f"resolve_all_miss_{label}_{variant}_us"] = t_r * 1e3
            rows.append((f"  resolve only, all miss ({variant})", f"{t_r * 1e3:.1f} us", ""))
        # the same rows in column (top-k) order, as a gather without the plan's source order would see them
        col_src = topk.reshape(-1).clone()
        sorted_dst = dst_flat[torch.argsort(src_flat.long())]  # sources are unique: src -> dst
        col_dst = sorted_dst[torch.argsort(torch.argsort(col_src.long()))].contiguous()
        # naive baseline: one warp per miss row, in column order (no plan, no merge)
        naive_col_t = timed(lambda: ops.bench_warp_gather(pool, hot, col_src, col_dst))
        naive_col = n * w / naive_col_t / 1e6
        results[f"naive_uva_column_order_{label}_gbps"] = naive_col
        results[f"swap_in_vs_naive_column_order_{label}_ratio"] = gbps / naive_col
        rows.append((f"  naive warp-per-row UVA gather, column order ({label})", f"{naive_col:.1f} GB/s",
                     f"swap-in is {gbps / naive_col:.2f} x faster"))
        if label == "runs4_shuffled":
            # the same rows copied in column order, as a plan without the source-order merge would
            t_cols = timed(lambda: ops.bench_flat_gather(pool, hot, col_src, col_dst))
            col_gbps = n * w / t_cols / 1e6
            results["copy_column_order_runs4_shuffled_gbps"] = col_gbps
            results["swap_in_runs4_shuffled_vs_memcpy_ratio"] = gbps / memcpy
            rows.append(("  same rows copied in column order (no merge)", f"{col_gbps:.1f} GB/s",
                         f"{col_gbps / memcpy:.3f} x memcpy; merged swap-in {gbps / col_gbps:.2f} x faster"))
        elif label == "random":
            results["swap_in_vs_copy_ratio"] = gbps / copy_gbps
            results["swap_in_vs_memcpy_ratio"] = gbps / memcpy
            naive_t = timed(lambda: ops.bench_warp_gather(pool, hot, src_flat, dst_flat))
            naive = n * w / naive_t / 1e6
            results["naive_uva_gbps"] = naive
            results["swap_in_vs_naive_ratio"] = gbps / naive
            rows.append(("  naive warp-per-row UVA gather, plan order (random)", f"{naive:.1f} GB/s",
                         f"swap-in is {gbps / naive:.2f} x faster"))
        else:
            results["swap_in_runs4_vs_memcpy_ratio"] = gbps / memcpy
            results["swap_in_runs4_vs_copy_ratio"] = gbps / copy_gbps
            naive_t = timed(lambda: ops.bench_warp_gather(pool, hot, src_flat, dst_flat))
            results["naive_uva_runs4_gbps"] = n * w / naive_t / 1e6
            rows.append(("  naive warp-per-row UVA gather, plan order (runs4)", f"{n * w / naive_t / 1e6:.1f} GB/s",
                         f"swap-in is {gbps / (n * w / naive_t / 1e6):.2f} x faster"))

    # --- resolve only, all hits
    topk = torch.from_numpy(unique_rows(pool.shape[0], n).reshape(B, K)).to(dev)
    cold()
    do_swap(topk)  # load everything once; from now on every column hits

    def resolve_once() -> None:
        resolve(topk, newest, real, state.dgi, state.lru, state.hot_rows, state.plan_src, state.plan_dst,
                state.plan_count, state.counters, state.miss_mask, region_stride=rs, pool_rows=pool.shape[0])

    loops = 50
    for variant, switches in RESOLVE_VARIANTS:  # the other forms first, then the default below
        with kernel_env(**switches):
            t_v = graph_ms_per_call(resolve_once, loops)
        results[f"resolve_all_hit_{variant}_us"] = t_v * 1e3
        rows.append((f"  resolve only, all hits ({variant})", f"{t_v * 1e3:.2f} us / launch (graph)", ""))
    before = state.counters.clone()
    t_eager = timed(lambda: [resolve_once() for _ in range(loops)], reps=10) / loops
    t = graph_ms_per_call(resolve_once, loops)  # GPU time per resolve, no host launch cost
    gained = (state.counters - before).tolist()
    results["resolve_all_hit_us"] = t * 1e3
    results["resolve_all_hit_eager_us"] = t_eager * 1e3
    results["resolve_all_hit_misses_seen"] = int(gained[1])
    rows.append((f"resolve only, all hits {B}x{K}, H={H}", f"{t * 1e3:.2f} us / launch (graph)",
                 f"target <= 10 us; eager call {t_eager * 1e3:.1f} us; misses seen {int(gained[1])}"))

    # the per-launch floor on this GPU: graphs of empty kernels, one shaped like the resolve (B blocks of
    # 1024 threads with its shared memory), one like a plan copy; the same replay timing as above
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    resolve_smem = int(ops.bench_resolve_smem(K, H))
    for label, blocks, threads, smem in (("resolve_shape", B, 1024, resolve_smem), ("copy_shape", 82, 256, 0)):
        t_e = graph_ms_per_call(lambda: ops.bench_launch_only(real, sink, blocks, threads, smem), loops)
        results[f"launch_only_graph_{label}_us"] = t_e * 1e3
        rows.append((f"  empty kernel, {blocks} x {threads} threads, {smem} B shared", f"{t_e * 1e3:.2f} us / launch (graph)",
                     "the floor of one launch"))

    # how the all-hit resolve scales with K and H (graph replays, 64 requests)
    for k_s, h_s in ((256, 512), (1024, 2048)):
        st_s = HotState.allocate(B, k_s, h_s, dev)
        topk_s = torch.from_numpy(unique_rows(pool.shape[0], B * k_s).reshape(B, k_s)).to(dev)

        def resolve_small() -> None:
            resolve(topk_s, newest, real, st_s.dgi, st_s.lru, st_s.hot_rows, st_s.plan_src, st_s.plan_dst,
                    st_s.plan_count, st_s.counters, st_s.miss_mask, region_stride=st_s.region_stride,
                    pool_rows=pool.shape[0])

        resolve_small()  # the first call misses everything; the graph's calls all hit
        t_s = graph_ms_per_call(resolve_small, loops)
        results[f"resolve_all_hit_k{k_s}_h{h_s}_us"] = t_s * 1e3
        rows.append((f"  resolve only, all hits {B}x{k_s}, H={h_s}", f"{t_s * 1e3:.2f} us / launch (graph)", ""))

    # --- 2048 miss rows vs a launch-only kernel
    st1 = HotState.allocate(1, 2048, 4096, dev)
    hot1 = torch.empty(st1.region_stride, w, dtype=torch.uint8, device=dev)
    topk1 = torch.from_numpy(unique_rows(pool.shape[0], 2048).reshape(1, 2048)).to(dev)
    one = torch.ones(1, dtype=torch.int32, device=dev)
    newest1 = torch.full((1,), -1, dtype=torch.int32, device=dev)
    t_small = timed(lambda: swap_in(topk1, newest1, one, st1.dgi, st1.lru, st1.hot_rows, st1.plan_src,
                                    st1.plan_dst, st1.plan_count, st1.counters, st1.miss_mask, pool, hot1,
                                    region_stride=st1.region_stride), setup=lambda: st1.dgi.fill_(-1))
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    t_launch = timed(lambda: ops.bench_launch_only(one, sink, 82))
    st1.dgi.fill_(-1)
    swap_in(topk1, newest1, one, st1.dgi, st1.lru, st1.hot_rows, st1.plan_src, st1.plan_dst, st1.plan_count,
            st1.counters, st1.miss_mask, pool, hot1, region_stride=st1.region_stride)
    src1, dst1 = st1.plan_src.reshape(-1).clone(), st1.plan_dst.reshape(-1).clone()
    t_copy1 = timed(lambda: ops.bench_flat_gather(pool, hot1, src1, dst1))
    t_naive1 = timed(lambda: ops.bench_warp_gather(pool, hot1, src1, dst1))
    results["swap_in_2048_rows_us"] = t_small * 1e3
    results["launch_only_us"] = t_launch * 1e3
    results["swap_in_2048_rows_gbps"] = 2048 * w / t_small / 1e6
    results["copy_only_2048_rows_us"] = t_copy1 * 1e3
    results["naive_uva_2048_rows_us"] = t_naive1 * 1e3
    rows.append(("swap-in 2048 miss rows (1 request)", f"{t_small * 1e3:.1f} us ({2048 * w / t_small / 1e6:.1f} GB/s)",
                 f"launch-only kernel {t_launch * 1e3:.1f} us; copy-only {t_copy1 * 1e3:.1f} us; "
                 f"naive warp/row {t_naive1 * 1e3:.1f} us"))

    # --- index-sharing prefetch hidden behind compute
    shared = 3
    misses_per_row = 256
    pools = [pool_view(w)[i * 200_000: (i + 1) * 200_000] for i in range(shared)]
    hots = [torch.empty(B * rs, w, dtype=torch.uint8, device=dev) for _ in range(shared)]
    topk_p = torch.full((B, K), -1, dtype=torch.int32, device=dev)
    topk_p[:, :misses_per_row] = torch.from_numpy(unique_rows(200_000, B * misses_per_row).reshape(B, -1)).to(dev)
    cold()
    resolve(topk_p, newest, real, state.dgi, state.lru, state.hot_rows, state.plan_src, state.plan_dst,
            state.plan_count, state.counters, state.miss_mask, region_stride=rs, pool_rows=200_000)
    stand_ins = {
        # decode-shaped: batch-64 activations through a 7168 x 7168 bf16 weight (memory-bound)
        "decode_gemm": (torch.randn(64, 7168, device=dev, dtype=torch.bfloat16),
                        torch.randn(7168, 7168, device=dev, dtype=torch.bfloat16)),
        # compute-bound, every SM's register file taken
        "large_gemm": (torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16),
                       torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)),
        # an expert-shaped GEMM: 512 routed tokens x 7168 -> 2048
        "expert_gemm": (torch.randn(512, 7168, device=dev, dtype=torch.bfloat16),
                        torch.randn(7168, 2048, device=dev, dtype=torch.bfloat16)),
    }
    rows_moved = shared * B * misses_per_row
    default_prefetch = IndexSharePrefetcher(shared, dev)
    default_kind = PREFETCH_KERNEL
    default_key = f"{default_kind}_{default_prefetch.priority_name}_bps{default_prefetch.max_blocks}"
    # the sweep: copies x priorities x grid caps (HISPARSE_BENCH_PREFETCH_KINDS / _PRIO / _BPS override it)
    prios = os.environ.get("HISPARSE_BENCH_PREFETCH_PRIO", "high").split(",")
    caps = [int(x) for x in os.environ.get("HISPARSE_BENCH_PREFETCH_BPS", "4,8,16,32").split(",")]
    kinds = os.environ.get("HISPARSE_BENCH_PREFETCH_KINDS", "deep,wide,exclusive,bulk").split(",")
    configs = [(kd, pr, bps) for kd in kinds for pr in prios for bps in caps]
    if (default_kind, default_prefetch.priority_name, default_prefetch.max_blocks) not in configs:
        configs.append((default_kind, default_prefetch.priority_name, default_prefetch.max_blocks))
    # Each stand-in runs long enough to cover the gathers 1.5 times over. Decode runs as CUDA-graph
    # replays, so the headline is measured that way; eager launches (host gaps included) beside it.
    # hidden = (gather alone + compute alone - both) / gather alone, each alone in the same mode.
    t_mm = {name: timed(lambda: torch.mm(xa, xb)) for name, (xa, xb) in stand_ins.items()}

    def compute_for(name: str, ms: float) -> Callable[[], None]:
        xa, xb = stand_ins[name]
        n_mm = max(1, int(round(1.5 * ms / t_mm[name])))

        def compute() -> None:
            for _ in range(n_mm):
                torch.mm(xa, xb)

        return compute

    def measure(prefetch: IndexSharePrefetcher, key: str, label: str, computes: dict | None = None,
                compute_ms: dict | None = None) -> dict:
        """Time the gathers alone, each stand-in alone and both together; returns the stand-ins used."""
        def gathers() -> None:
            prefetch.issue(state, pools, hots, real)
            for j in range(shared):
                prefetch.wait(j)

        t_g = timed(gathers)
        t_gg = graph_ms_per_call(gathers, loops=1)
        results[f"{key}_gather_gbps"] = rows_moved * w / t_g / 1e6
        results[f"{key}_gather_graph_gbps"] = rows_moved * w / t_gg / 1e6
        computes = computes or {name: compute_for(name, t_g) for name in stand_ins}
        for name, compute in computes.items():

            def overlapped() -> None:
                prefetch.issue(state, pools, hots, real)
                compute()
                for j in range(shared):
                    prefetch.wait(j)

            t_c, t_o = timed(compute), timed(overlapped)
            t_cg, t_og = graph_ms_per_call(compute, loops=1), graph_ms_per_call(overlapped, loops=1)
            if compute_ms is not None:  # judged against the compute at its best (no carveout)
                t_cg = compute_ms[name]
            hidden = max(0.0, min(1.0, (t_g + t_c - t_o) / t_g))
            hidden_g = max(0.0, min(1.0, (t_gg + t_cg - t_og) / t_gg))
            k = f"{key}_{name}"
            results.update({f"{k}_gather_ms": t_g, f"{k}_compute_ms": t_c, f"{k}_overlapped_ms": t_o,
                            f"{k}_hidden_fraction_eager": hidden, f"{k}_gather_graph_ms": t_gg,
                            f"{k}_compute_graph_ms": t_cg, f"{k}_overlapped_graph_ms": t_og,
                            f"{k}_hidden_fraction": hidden_g})
            rows.append((f"prefetch {label}, {name}",
                         f"graph: hidden {hidden_g:.1%}",
                         f"gather {t_gg * 1e3:.0f} us ({rows_moved * w / t_gg / 1e6:.1f} GB/s), compute "
                         f"{t_cg * 1e3:.0f}, both {t_og * 1e3:.0f}; eager: {hidden:.1%} ({t_g * 1e3:.0f}/"
                         f"{t_c * 1e3:.0f}/{t_o * 1e3:.0f} us)"))
        return computes

    default_computes: dict = {}
    for kd, pr, bps in configs:
        kind, _, excl_smem = kd.partition("@")  # "exclusive@131072": the shared memory it holds
        with kernel_env(prefetch_kernel=kind, exclusive_smem=excl_smem or "0"):
            used = measure(IndexSharePrefetcher(shared, dev, max_blocks=bps, priority=pr),
                           f"prefetch_{kd}_{pr}_bps{bps}",
                           f"{shared}x{B}x{misses_per_row} rows, {kd}, {pr} prio, {bps or 'all'} blocks")
        if f"{kd}_{pr}_bps{bps}" == default_key:
            default_computes = used
    # The default prefetch beside GEMMs told to leave its SMs alone: cuBLASLt with an SM carveout of
    # the prefetch's block count, as comm/compute overlap does (judged against the GEMMs without it).
    if hasattr(torch._C, "_set_sm_carveout_experimental"):
        best = {name: results[f"prefetch_{default_key}_{name}_compute_graph_ms"] for name in stand_ins}
        backend = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        torch._C._set_sm_carveout_experimental(default_prefetch.max_blocks)
        try:
            with kernel_env(prefetch_kernel=default_kind):
                measure(default_prefetch, f"prefetch_{default_key}_carveout",
                        f"default + cuBLASLt carveout {default_prefetch.max_blocks} SMs", computes=default_computes,
                        compute_ms=best)
        finally:
            torch._C._set_sm_carveout_experimental(None)
            torch.backends.cuda.preferred_blas_library(backend)
    # Does issuing the prefetch block the host while the GPU is busy? (it must not)
    import time

    prefetch = IndexSharePrefetcher(shared, dev)
    xa, xb = stand_ins["large_gemm"]
    for _ in range(20):
        torch.mm(xa, xb)
    t0 = time.perf_counter()
    prefetch.issue(state, pools, hots, real)
    issue_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    results["prefetch_issue_host_us_while_busy"] = issue_us
    rows.append(("prefetch issue, host time while the GPU is busy", f"{issue_us:.0f} us", "non-blocking if small"))
    results["prefetch_rows"] = rows_moved
    # the headline: the prefetcher's default configuration, graph replays, decode-shaped stand-in
    results["prefetch_default"] = default_key
    for name in stand_ins:
        results[f"prefetch_hidden_fraction_{name}"] = results[f"prefetch_{default_key}_{name}_hidden_fraction"]
        results[f"prefetch_hidden_fraction_{name}_eager"] = \
            results[f"prefetch_{default_key}_{name}_hidden_fraction_eager"]
    results["prefetch_hidden_fraction"] = results["prefetch_hidden_fraction_decode_gemm"]
    results["prefetch_hidden_fraction_eager"] = results["prefetch_hidden_fraction_decode_gemm_eager"]
    rows.append(("prefetch hidden, default configuration", f"{results['prefetch_hidden_fraction']:.1%}",
                 f"{default_key}, decode GEMM, graph replays; target >= 85%; eager "
                 f"{results['prefetch_hidden_fraction_eager']:.1%}; large GEMM "
                 f"{results['prefetch_hidden_fraction_large_gemm']:.1%}"))

    host.close()
    width = max(len(r[0]) for r in rows)
    print(f"\n{results['gpu']}  {results['date']}")
    for name, fig, lim in rows:
        print(f"{name:<{width}}  {fig:<28}  {lim}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
