"""Probe: does the host pool's page size decide how much the prefetch and a GEMM slow each other?

4 KiB, THP-advised, hugetlbfs (2 MiB) and cudaHostAlloc pools; rows spread over 131 MB per layer or
confined to 2.7 MB; the wide copy, 8 blocks. Writes $OUT/probe_tlb.json. (The committed output came
from an earlier form of this script that also swept a thread-block cluster launch of the copy grid,
since removed, hence its `cluster` column.)"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hot_buffer import kernel_env, timed  # noqa: E402
from probe_overlap import overlap_ends  # noqa: E402
from hisparse_kernels import HotState, IndexSharePrefetcher, ensure_loaded  # noqa: E402
from hisparse_kernels.ops import resolve  # noqa: E402

out: dict = {}
keep: list = []
NBYTES = 1 << 30


def pool_register(flags: int = 0, advise: bool = False) -> torch.Tensor:
    m = mmap.mmap(-1, NBYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
    if advise:
        m.madvise(mmap.MADV_HUGEPAGE)
    arr = np.frombuffer(m, dtype=np.uint8)
    t = torch.from_numpy(arr)
    t.fill_(7)
    torch.ops.hisparse.host_register(t.data_ptr(), NBYTES)
    keep.append((m, arr, t))
    return t


def main() -> None:
    ensure_loaded()
    dev = torch.device("cuda")
    for f in ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/defrag",
              "/proc/sys/vm/nr_hugepages"):
        try:
            print(f, open(f).read().strip())
        except OSError as e:
            print(f, e)
    try:
        open("/proc/sys/vm/nr_hugepages", "w").write("600")
        print("nr_hugepages now", open("/proc/sys/vm/nr_hugepages").read().strip())
    except OSError as e:
        print("cannot set nr_hugepages:", e)
    rng = np.random.default_rng(0)
    B, K, H, w = 64, 2048, 4096, 656
    shared, misses = 3, 256
    pools_by_kind = {}
    for kind, make in (("register_4k", lambda: pool_register()),
                       ("register_thp", lambda: pool_register(advise=True)),
                       ("hostalloc", lambda: torch.empty(NBYTES, dtype=torch.uint8, pin_memory=True)),
                       ("hugetlb_2m", lambda: pool_register(flags=0x40000))):
        try:
            pools_by_kind[kind] = make()
            print("made", kind)
        except Exception as e:  # noqa: BLE001
            print("cannot make", kind, e)
    try:
        print(subprocess.run(["grep", "-i", "huge", "/proc/meminfo"], capture_output=True, text=True).stdout)
    except Exception:  # noqa: BLE001
        pass
    state = HotState.allocate(B, K, H, dev)
    rs = state.region_stride
    hots = [torch.empty(B * rs, w, dtype=torch.uint8, device=dev) for _ in range(shared)]
    newest = torch.full((B,), -1, dtype=torch.int32, device=dev)
    real = torch.tensor([B], dtype=torch.int32, device=dev)
    a = torch.randn(64, 7168, device=dev, dtype=torch.bfloat16)
    b = torch.randn(7168, 7168, device=dev, dtype=torch.bfloat16)
    t_mm = timed(lambda: torch.mm(a, b))
    n_mm = max(1, int(round(1.2 * 0.8 / t_mm)))

    def compute() -> None:
        for _ in range(n_mm):
            torch.mm(a, b)

    t_c = timed(compute)
    print(f"compute alone {t_c * 1e3:.0f} us ({n_mm} GEMMs)")
    # an HBM-streaming stand-in with no GEMM: copies of a 256 MiB buffer
    big_a = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    big_b = torch.empty_like(big_a)
    t_cp1 = timed(lambda: big_b.copy_(big_a))
    n_cp = max(1, int(round(1.2 * 0.8 / t_cp1)))

    def stream_copy() -> None:
        for _ in range(n_cp):
            big_b.copy_(big_a)

    t_sc = timed(stream_copy)
    print(f"d2d copy stand-in alone {t_sc * 1e3:.0f} us ({n_cp} copies)")
    rows = []
    for kind, flat in pools_by_kind.items():
        pool = flat[: (NBYTES // w) * w].view(-1, w)
        pools = [pool[i * 200_000:(i + 1) * 200_000] for i in range(shared)]
        # copy-only random gather over the whole pool
        n = B * K
        src = torch.from_numpy(rng.choice(pool.shape[0], n, replace=False).astype(np.int32)).to(dev)
        dst = torch.from_numpy(rng.permutation(B * rs)[:n].astype(np.int32)).to(dev)
        t_flat = timed(lambda: torch.ops.hisparse.bench_flat_gather(pool, hots[0], src, dst))
        for span in (200_000, 4096):
            topk = torch.full((B, K), -1, dtype=torch.int32, device=dev)
            topk[:, :misses] = torch.from_numpy(
                np.stack([rng.choice(span, misses, replace=False) for _ in range(B)]).astype(np.int32)).to(dev)
            state.dgi.fill_(-1)
            resolve(topk, newest, real, state.dgi, state.lru, state.hot_rows, state.plan_src, state.plan_dst,
                    state.plan_count, state.counters, state.miss_mask, region_stride=rs, pool_rows=span)
            with kernel_env(prefetch_kernel="wide"):
                pf = IndexSharePrefetcher(shared, dev, max_blocks=8, priority="high")

                def g() -> None:
                    pf.issue(state, pools, hots, real)
                    for j in range(shared):
                        pf.wait(j)

                tg = timed(g)
                res = {}
                for sname, fn, talone in (("gemm", compute, t_c), ("d2d", stream_copy, t_sc)):
                    ge, ce = overlap_ends(pf, (state, pools, hots, real), fn, reps=7)
                    res[sname] = dict(both=max(ge, ce), g_end=ge, c_end=ce, alone=talone,
                                      hidden=(tg + talone - max(ge, ce)) / tg)
            row = dict(pool=kind, span=span, flat_gbps=n * w / t_flat / 1e6, gather=tg,
                       gather_gbps=shared * B * misses * w / tg / 1e6,
                       **{f"{k}_{kk}": vv for k, v in res.items() for kk, vv in v.items()})
            rows.append(row)
            print(f"{kind:13s} span={span:6d} flat {n * w / t_flat / 1e6:5.1f} GB/s | gather {tg * 1e3:5.0f} us "
                  f"({row['gather_gbps']:.1f}) | +gemm g_end {res['gemm']['g_end'] * 1e3:5.0f} c_end "
                  f"{res['gemm']['c_end'] * 1e3:5.0f} (alone {t_c * 1e3:4.0f}) hidden {res['gemm']['hidden']:.1%} | "
                  f"+d2d g_end {res['d2d']['g_end'] * 1e3:5.0f} c_end {res['d2d']['c_end'] * 1e3:5.0f} "
                  f"(alone {t_sc * 1e3:4.0f}) hidden {res['d2d']['hidden']:.1%}")
    out["rows"] = rows


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    finally:
        (Path(os.environ.get("OUT", "/tmp")) / "probe_tlb.json").write_text(json.dumps(out, indent=1, default=str))
