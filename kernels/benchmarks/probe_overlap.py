"""Probe: who is slowed when the prefetch gathers overlap a cuBLAS stand-in (the end of each in one
overlapped run), eager and as CUDA-graph replays, per copy and grid cap. Prints what it sees and
writes JSON to $OUT/probe_overlap.json. (The committed output came from an earlier form of this
script that also swept a thread-block cluster launch of the copy grid, since removed, hence its
`cluster`, `backend` and `carveout` columns: see kernels/results/NOTES.md.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hot_buffer import timed  # noqa: E402
from hisparse_kernels import HostPool, HotState, IndexSharePrefetcher, ensure_loaded  # noqa: E402
from hisparse_kernels.ops import resolve  # noqa: E402

out: dict = {}


def overlap_ends(prefetch: IndexSharePrefetcher, issue_args: tuple, compute: Callable[[], None],
                 reps: int = 5) -> tuple[float, float]:
    """(gather end, compute end) in ms after the start of one overlapped run, from the run whose
    later end is the median of ``reps``: which side an overlap slows."""
    main = torch.cuda.current_stream()
    ends = []
    for _ in range(reps):
        e0, eg, ec = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record(main)
        prefetch.issue(*issue_args)
        eg.record(prefetch.stream)
        compute()
        ec.record(main)
        for j in range(prefetch.num_shared):
            prefetch.wait(j)
        torch.cuda.synchronize()
        ends.append((e0.elapsed_time(eg), e0.elapsed_time(ec)))
    return sorted(ends, key=max)[reps // 2]


def main() -> None:
    ensure_loaded()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print("SMs", props.multi_processor_count, "torch", torch.__version__)
    rng = np.random.default_rng(0)
    B, K, H, w = 64, 2048, 4096, 656
    shared, misses = 3, 256
    host = HostPool(1, (1 << 30) // 16, 16)
    flat = host.layer(0).view(-1)
    pool = flat[: ((1 << 30) // w) * w].view(-1, w)
    pools = [pool[i * 200_000:(i + 1) * 200_000] for i in range(shared)]
    state = HotState.allocate(B, K, H, dev)
    rs = state.region_stride
    hots = [torch.empty(B * rs, w, dtype=torch.uint8, device=dev) for _ in range(shared)]
    newest = torch.full((B,), -1, dtype=torch.int32, device=dev)
    real = torch.tensor([B], dtype=torch.int32, device=dev)
    topk = torch.full((B, K), -1, dtype=torch.int32, device=dev)
    topk[:, :misses] = torch.from_numpy(rng.choice(200_000, B * misses, replace=False)
                                        .astype(np.int32).reshape(B, -1)).to(dev)
    state.dgi.fill_(-1)
    resolve(topk, newest, real, state.dgi, state.lru, state.hot_rows, state.plan_src, state.plan_dst,
            state.plan_count, state.counters, state.miss_mask, region_stride=rs, pool_rows=200_000)
    torch.cuda.synchronize()

    stand_ins = {
        "decode_gemm": (torch.randn(64, 7168, device=dev, dtype=torch.bfloat16),
                        torch.randn(7168, 7168, device=dev, dtype=torch.bfloat16)),
        "large_gemm": (torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16),
                       torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)),
        "moe_like": (torch.randn(512, 7168, device=dev, dtype=torch.bfloat16),
                     torch.randn(7168, 2048, device=dev, dtype=torch.bfloat16)),
    }
    from bench_hot_buffer import graph_ms_per_call, kernel_env
    rows = []
    for name, (a, b) in stand_ins.items():
        t_mm = timed(lambda: torch.mm(a, b))
        n_mm = max(1, int(round(1.5 * 750e-3 / t_mm)))

        def compute() -> None:
            for _ in range(n_mm):
                torch.mm(a, b)

        t_best = timed(compute)
        t_best_graph = graph_ms_per_call(compute, loops=1)
        for kind in ("wide", "deep"):
            for bps in (4, 8, 16):
                with kernel_env(prefetch_kernel=kind):
                    pf = IndexSharePrefetcher(shared, dev, max_blocks=bps, priority="high")

                    def g2() -> None:
                        pf.issue(state, pools, hots, real)
                        for j in range(shared):
                            pf.wait(j)

                    def both() -> None:
                        pf.issue(state, pools, hots, real)
                        compute()
                        for j in range(shared):
                            pf.wait(j)

                    tg, tc, to = timed(g2), timed(compute), timed(both)
                    g_end, c_end = overlap_ends(pf, (state, pools, hots, real), compute)
                    tg_graph = graph_ms_per_call(g2, loops=1)
                    tc_graph = graph_ms_per_call(compute, loops=1)
                    to_graph = graph_ms_per_call(both, loops=1)
                h_own = (tg + tc - to) / tg
                h_best = (tg + t_best - to) / tg
                h_graph = (tg_graph + t_best_graph - to_graph) / tg_graph
                rows.append(dict(stand_in=name, kind=kind, bps=bps, n_mm=n_mm, t_mm=t_mm, gather=tg, compute=tc,
                                 compute_best=t_best, overlapped=to, gather_end=g_end, compute_end=c_end,
                                 hidden_own=h_own, hidden_vs_best=h_best, gather_graph=tg_graph,
                                 compute_graph=tc_graph, compute_best_graph=t_best_graph,
                                 overlapped_graph=to_graph, hidden_graph_vs_best=h_graph))
                print(f"{name:11s} {kind:5s} bps={bps:2d}: g {tg*1e3:5.0f} c {tc*1e3:5.0f} (best {t_best*1e3:5.0f}) "
                      f"both {to*1e3:5.0f} [g_end {g_end*1e3:5.0f} c_end {c_end*1e3:5.0f}] hidden {h_own:.1%} "
                      f"vs-best {h_best:.1%} | graph g {tg_graph*1e3:5.0f} c {tc_graph*1e3:5.0f} "
                      f"(best {t_best_graph*1e3:5.0f}) both {to_graph*1e3:5.0f} hidden {h_graph:.1%}")
    out["rows"] = rows



if __name__ == "__main__":
    try:
        main()
    finally:
        path = Path(os.environ.get("OUT", "/tmp")) / "probe_overlap.json"
        path.write_text(json.dumps(out, indent=1, default=str))
