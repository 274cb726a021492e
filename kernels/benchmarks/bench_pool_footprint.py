"""Swap-in from a production-sized pinned pool: what the footprint of a step's misses costs.

Probes (``--probes``): all-miss plans of 64 x 2048 rows of 656 B drawn from a window of the pool
(uniform spans 1-64 GiB), or from regions of a given size per request, copied by the plan copy
under several grids (``HISPARSE_COPY_GRID``) and orders, and the swap-in itself. Before every timed
run an untimed gather over another part of the pool evicts whatever translations the previous run
left, as the previous layer's swap-in does in a decode step.

Trace (``--trace``): the steps of a simulated decode fleet (``sim_host_placement.py``), each
request's top-k host slots under each placement, swapped in layer after layer from a pool laid out
layer-major like vLLM's host pool (``[layers, slots, row]``).

Prints a table and writes JSON (``--out``), pinned H2D memcpy measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hot_buffer import kernel_env, timed  # noqa: E402

from hisparse_kernels import HostPool, HotState, ensure_loaded  # noqa: E402
from hisparse_kernels.ops import gather_plan, swap_in  # noqa: E402

ROW = 656
MIB = 1 << 20
GIB = 1 << 30


class Bench:
    def __init__(self, pool_gib: int, layers: int, requests: int, topk: int, hot_slots: int) -> None:
        self.dev = torch.device("cuda")
        self.B, self.K, self.H = requests, topk, hot_slots
        t0 = time.perf_counter()
        slots = pool_gib * GIB // (layers * ROW)
        self.host = HostPool(layers, slots, ROW)
        self.register_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.host.tensor.view(-1).fill_(0x5A)
        self.fill_s = time.perf_counter() - t0
        self.layers, self.slots = layers, slots
        self.state = HotState.allocate(self.B, self.K, self.H, self.dev)
        self.rs = self.state.region_stride
        self.hot = torch.empty(self.B * self.rs, ROW, dtype=torch.uint8, device=self.dev)
        self.newest = torch.full((self.B,), -1, dtype=torch.int32, device=self.dev)
        self.real = torch.tensor([self.B], dtype=torch.int32, device=self.dev)
        self.rng = np.random.default_rng(0)
        # destinations of a hand-made plan: distinct hot rows, one region per request row
        self.plan_dst = (torch.arange(self.B, device=self.dev, dtype=torch.int32)[:, None] * self.rs
                         + torch.arange(self.K, device=self.dev, dtype=torch.int32)[None, :]).contiguous()
        self.plan_count = torch.full((self.B,), self.K, dtype=torch.int32, device=self.dev)
        # the flush (untimed): random rows of the last layer's span (its last 8 GiB at most), as the
        # previous step's last layer leaves the link's translations
        flush_rows = self.rows_in(max(0, slots - 8 * GIB // ROW), slots, self.B * self.K)
        self.flush_src = torch.from_numpy(flush_rows.reshape(self.B, self.K)).to(self.dev)

    def rows_in(self, lo: int, hi: int, n: int) -> np.ndarray:
        """``n`` distinct random rows of ``[lo, hi)``."""
        out = np.unique(self.rng.integers(lo, hi, size=int(n * 1.05) + 64))
        while out.size < n:
            out = np.unique(np.concatenate([out, self.rng.integers(lo, hi, size=n)]))
        return self.rng.permutation(out)[:n].astype(np.int32)

    def flush(self) -> None:
        gather_plan(self.host.layer(self.layers - 1), self.hot, self.flush_src, self.plan_dst, self.plan_count, self.real)

    def memcpy_gbps(self) -> float:
        dst = torch.empty(256 * MIB, dtype=torch.uint8, device=self.dev)
        flat = self.host.tensor.view(-1)
        t = timed(lambda: dst.copy_(flat[-256 * MIB:], non_blocking=True))
        return 256 * MIB / t / 1e6

    def gather_gbps(self, src: np.ndarray, layer: int = 0, grid: str = "") -> float:
        """The plan copy of ``src`` [B, K] (copied in the given order), cold translations."""
        plan = torch.from_numpy(np.ascontiguousarray(src, dtype=np.int32)).to(self.dev)
        pool = self.host.layer(layer)
        with kernel_env(copy_grid=grid):
            t = timed(lambda: gather_plan(pool, self.hot, plan, self.plan_dst, self.plan_count, self.real),
                      setup=self.flush, reps=10)
        return src.size * ROW / t / 1e6

    def swap_gbps(self, topk_layers: list[np.ndarray], grid: str = "",
                  pool: "torch.Tensor | None" = None) -> tuple[float, int]:
        """Swap-in of every column of each layer's ``topk`` [B, K] (-1 padding), layer after layer,
        every hot row cold; returns GB/s over the rows that missed, and that row count."""
        tks = [torch.from_numpy(np.ascontiguousarray(t, dtype=np.int32)).to(self.dev) for t in topk_layers]
        moved = sum(int((t >= 0).sum()) for t in topk_layers)
        st = self.state

        def run() -> None:
            for layer, tk in enumerate(tks):
                st.dgi.fill_(-1)
                swap_in(tk, self.newest, self.real, st.dgi, st.lru, st.hot_rows, st.plan_src, st.plan_dst,
                        st.plan_count, st.counters, st.miss_mask,
                        self.host.layer(layer) if pool is None else pool, self.hot, region_stride=self.rs)

        with kernel_env(copy_grid=grid):
            t = timed(run, setup=self.flush, reps=10)
        return moved * ROW / t / 1e6, moved

    def check(self, topk: np.ndarray, layer: int) -> bool:
        """Bit check of one swap-in: row ids written into the rows' first 8 bytes come back."""
        pool = self.host.layer(layer)
        flat = topk.reshape(-1)
        rows = torch.from_numpy(flat[flat >= 0].astype(np.int64))
        pool[rows, :8] = rows.view(-1, 1).view(torch.uint8).reshape(-1, 8)
        tk = torch.from_numpy(np.ascontiguousarray(topk, dtype=np.int32)).to(self.dev)
        st = self.state
        st.dgi.fill_(-1)
        swap_in(tk, self.newest, self.real, st.dgi, st.lru, st.hot_rows, st.plan_src, st.plan_dst, st.plan_count,
                st.counters, st.miss_mask, pool, self.hot, region_stride=self.rs)
        hot_rows = st.hot_rows.reshape(-1).long()
        want = torch.from_numpy(flat.astype(np.int64)).to(self.dev)
        ok = hot_rows >= 0
        got = self.hot[hot_rows[ok]][:, :8].contiguous().view(torch.int64).reshape(-1)
        return bool((ok == (want >= 0)).all()) and bool((got == want[ok]).all())


def probes(b: Bench, memcpy: float, rows: list, out: list) -> None:
    B, K = b.B, b.K
    span_rows = lambda gib: int(gib * GIB // ROW)  # noqa: E731
    grids = ["", "8,64", "4,64", "2,64", "1,64", "16,16", "16,8", "64,2"]

    def add(probe: str, gbps: float, **kw: object) -> None:
        out.append({"probe": probe, "gbps": gbps, "vs_memcpy": gbps / memcpy, **kw})

    # 1. uniform spans: per-request sorted plans (what resolve writes) under each grid; swap-in itself
    for gib in (1, 2, 4, 8, 16, 32, 64):
        if gib > b.slots * ROW / GIB + 0.01:
            continue
        src = b.rows_in(0, min(span_rows(gib), b.slots), B * K).reshape(B, K)
        sw, _ = b.swap_gbps([src])
        sw2, _ = b.swap_gbps([src], grid="2,64")
        add("uniform_swap_in", sw, span_gib=gib, grid="default")
        add("uniform_swap_in", sw2, span_gib=gib, grid="2,64")
        rows.append((f"uniform {gib} GiB: swap-in", f"{sw:.1f} GB/s",
                     f"{sw / memcpy:.3f} x memcpy; grid 2,64: {sw2 / memcpy:.3f}"))
        srt = np.sort(src, axis=1)
        figs = []
        for grid in grids:
            g = b.gather_gbps(srt, grid=grid)
            add("uniform_plan_copy", g, span_gib=gib, grid=grid or "default", order="sorted per request")
            figs.append(f"{grid or 'default'}={g / memcpy:.2f}")
        g = b.gather_gbps(src)
        add("uniform_plan_copy", g, span_gib=gib, grid="default", order="random")
        figs.append(f"random order={g / memcpy:.2f}")
        # one global order: all misses sorted by address, cut into the request rows in turn
        glob = np.sort(src.reshape(-1)).reshape(B, K)
        for grid in ("", "2,64", "1,16"):
            g = b.gather_gbps(glob, grid=grid)
            add("uniform_plan_copy", g, span_gib=gib, grid=grid or "default", order="global sort")
            figs.append(f"global {grid or 'default'}={g / memcpy:.2f}")
        rows.append((f"  plan copy by grid (x memcpy)", "", " ".join(figs)))

    # 2. regions: each request's rows in R regions of Z MiB, at random 2 MiB-aligned places
    for z_mib in (2, 16, 84, 512):
        for r in (1, 4, 16):
            if B * r * z_mib * MIB > b.slots * ROW:
                continue
            zr = z_mib * MIB // ROW
            starts = b.rng.integers(0, (b.slots - zr) * ROW // (2 * MIB), size=(B, r)) * (2 * MIB) // ROW
            src = np.empty((B, K), dtype=np.int32)
            for q in range(B):
                region = b.rng.integers(0, r, size=K)
                off = np.unique(region.astype(np.int64) * zr + b.rng.integers(0, zr, size=K))
                while off.size < K:
                    off = np.unique(np.concatenate([off, b.rng.integers(0, r * zr, size=K)]))
                off = b.rng.permutation(off)[:K]
                src[q] = starts[q, off // zr] + off % zr
            sw, _ = b.swap_gbps([src])
            srt = np.sort(src, axis=1)
            g_def = b.gather_gbps(srt)
            g_2 = b.gather_gbps(srt, grid="2,64")
            g_rand = b.gather_gbps(src)
            for name, g, grid, order in (("regions_swap_in", sw, "default", "sorted per request"),
                                         ("regions_plan_copy", g_def, "default", "sorted per request"),
                                         ("regions_plan_copy", g_2, "2,64", "sorted per request"),
                                         ("regions_plan_copy", g_rand, "default", "random")):
                add(name, g, region_mib=z_mib, regions_per_request=r, distinct_regions=B * r, grid=grid,
                    order=order)
            rows.append((f"{B * r} regions of {z_mib} MiB: swap-in", f"{sw:.1f} GB/s",
                         f"{sw / memcpy:.3f} x memcpy; copy sorted {g_def / memcpy:.2f}, grid 2,64 "
                         f"{g_2 / memcpy:.2f}, random order {g_rand / memcpy:.2f}"))


def uniform_reference(b: Bench, memcpy: float, rows: list, out: list, grids: list[str]) -> None:
    """Swap-in of uniformly random rows over spans of 1-64 GiB of the whole pool (read as one layer)."""
    flat = b.host.tensor.view(-1)[: (b.host.nbytes // ROW) * ROW].view(-1, ROW)
    total = flat.shape[0]
    for gib in (1, 2, 4, 8, 16, 32, 64):
        if gib > b.host.nbytes / GIB + 0.01:
            continue
        src = b.rows_in(0, min(int(gib * GIB // ROW), total), b.B * b.K).reshape(b.B, b.K)
        figs = []
        for grid in grids:
            gbps, _ = b.swap_gbps([src], grid=grid, pool=flat)
            out.append({"span_gib": gib, "grid": grid or "default", "gbps": gbps, "vs_memcpy": gbps / memcpy})
            figs.append(f"grid {grid or 'default'}: {gbps:.1f} GB/s ({gbps / memcpy:.3f} x)")
        rows.append((f"uniform random rows over {gib} GiB: swap-in", "", "; ".join(figs)))


def trace(b: Bench, path: Path, memcpy: float, rows: list, out: dict, grids: list[str]) -> None:
    data = np.load(path)
    placements = sorted({k.split("/")[0] for k in data.files if "/" in k})
    for placement in placements:
        steps = sorted({k.split("/")[1] for k in data.files if k.startswith(placement + "/")})
        for grid in grids:
            figs = []
            for step in steps:
                topk = data[f"{placement}/{step}"]  # [B, K] slots of one layer's span (-1 padding)
                topk = topk[: b.B, : b.K]
                assert int(topk.max()) < b.slots, "trace slots beyond the benchmark's layer span"
                gbps, moved = b.swap_gbps([topk] * b.layers, grid=grid)
                figs.append(gbps)
            med = float(np.median(figs))
            key = f"{placement}|{grid or 'default'}"
            out[key] = {"placement": placement, "grid": grid or "default", "steps": len(figs),
                        "gbps_median": med, "gbps_min": float(min(figs)), "gbps_max": float(max(figs)),
                        "vs_memcpy": med / memcpy}
            rows.append((f"{path.stem} {placement}, grid {grid or 'default'}", f"{med:.1f} GB/s",
                         f"{med / memcpy:.3f} x memcpy (steps {min(figs) / memcpy:.2f}-{max(figs) / memcpy:.2f})"))
    first = sorted(k for k in data.files if "/" in k)[0]
    out["bit_check"] = b.check(data[first][: b.B, : b.K], 0)
    rows.append(("trace swap-in bit check (row ids back)", str(out["bit_check"]), first))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--pool-gib", type=int, default=64)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--probes", action="store_true")
    parser.add_argument("--trace", type=Path, nargs="*", default=None)
    parser.add_argument("--uniform", action="store_true")
    parser.add_argument("--trace-grids", default="")  # ';'-separated HISPARSE_COPY_GRID values ('' = default)
    args = parser.parse_args()
    ensure_loaded()
    b = Bench(args.pool_gib, args.layers, 64, 2048, 4096)
    memcpy = b.memcpy_gbps()
    results: dict = {
        "gpu": torch.cuda.get_device_name(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "pool_gib": args.pool_gib, "layers": args.layers, "layer_span_gib": b.slots * ROW / GIB,
        "row_bytes": ROW, "requests": b.B, "topk": b.K, "hot_slots": b.H,
        "register_s": b.register_s, "fill_s": b.fill_s, "memcpy_h2d_gbps": memcpy,
        "copy_grid_env": os.environ.get("HISPARSE_COPY_GRID", ""),
    }
    rows: list[tuple[str, str, str]] = [
        (f"pinned pool {args.pool_gib} GiB, {args.layers} layer(s)", f"{b.slots * ROW / GIB:.2f} GiB/layer",
         f"register {b.register_s:.1f} s, fill {b.fill_s:.1f} s"),
        ("pinned H2D cudaMemcpy (256 MiB)", f"{memcpy:.1f} GB/s", "link"),
    ]
    if args.probes:
        results["probes"] = []
        probes(b, memcpy, rows, results["probes"])
    if args.uniform:
        results["uniform"] = []
        uniform_reference(b, memcpy, rows, results["uniform"], args.trace_grids.split(";"))
    if args.trace is not None:
        results["trace"] = {}
        for path in args.trace:
            results["trace"][path.stem] = {}
            trace(b, path, memcpy, rows, results["trace"][path.stem], args.trace_grids.split(";"))
    results["memcpy_h2d_gbps_end"] = b.memcpy_gbps()
    b.host.close()
    width = max(len(r[0]) for r in rows)
    print(f"\n{results['gpu']}  {results['date']}")
    for name, fig, lim in rows:
        print(f"{name:<{width}}  {fig:<22}  {lim}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
