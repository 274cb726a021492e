"""Compiled ops against the reference on the GPU: fuzzing, argument checks, CUDA-graph replay."""

from __future__ import annotations

import numpy as np
import pytest

from hisparse_kernels import fuzz, reference as ref
from hisparse_kernels.reference.layout import region_stride_for

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.fixture(scope="module", autouse=True)
def compiled_ops() -> None:
    if not _capable():
        pytest.skip("needs a CUDA GPU of compute capability >= 9.0")
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        pytest.skip("needs the CUDA toolkit (nvcc) to build the extension")
    from hisparse_kernels.ops import ensure_loaded

    ensure_loaded()  # a build failure is an error, not a skip


SHAPES = [  # (B, K, H, row bytes)
    (1, 1, 1, 16),
    (3, 4, 4, 656),
    (5, 7, 19, 1152),
    (8, 64, 128, 656),
    (4, 100, 200, 640),
    (16, 256, 512, 656),
    (2, 1500, 3001, 1152),  # more columns and slots than threads in the block
    (8, 2048, 4096, 656),  # the production row shape (K=2048, H=2K)
    (2, 300, 9000, 656),  # H beyond the fast form: the general kernel even by default
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("corrupt", [False, True], ids=["clean", "corrupt"])
@pytest.mark.parametrize("kernel", ["fast", "general"])
def test_swap_in_fuzz(shape: tuple[int, int, int, int], corrupt: bool, kernel: str,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Both resolve kernels (the fast form where it fits, and the general one) against the reference."""
    monkeypatch.setenv("HISPARSE_RESOLVE_KERNEL", kernel)
    b, k, h, w = shape
    rng = np.random.default_rng(hash((shape, corrupt, kernel)) % 2**32)
    for trial in range(6):  # fresh inputs per case: short and long sequences, padding rows
        seq_len = [None, 1, k // 2 + 1, 3 * h][trial % 4]
        case = fuzz.random_resolve_case(rng, b=b, k=k, h=h, row_bytes=w,
                                        pool_rows=int(rng.integers(max(4 * h, 8), 8 * h + 64)),
                                        corrupt=corrupt, seq_len=seq_len)
        fuzz.check_swap_in(case, rng, with_mask=trial % 2 == 0, resolve_only=trial == 5)


def test_swap_in_full_size_cold_step() -> None:
    """64 requests x K=2048 x H=4096 with 656 B rows, every wanted column a miss."""
    rng = np.random.default_rng(7)
    case = fuzz.random_resolve_case(rng, b=64, k=2048, h=4096, row_bytes=656, pool_rows=1 << 19,
                                    seq_len=20000)
    case.dgi[:] = -1
    case.num_real = 64
    wanted = int(((case.topk >= 0) & (case.topk != case.newest[:, None])).sum())
    stats = fuzz.check_swap_in(case, rng)
    assert stats == {"hits": 0, "misses": wanted}


COPIES = [  # (full-grid copy, capped-grid copy, bulk stages)
    ("lines", "deep", "4"),  # the defaults
    ("lines", "wide", "4"),
    ("chunks", "chunks", "4"),
    ("bulk", "bulk", "4"),
    ("bulk", "bulk", "2"),
    ("lines", "exclusive", "4"),
    ("async", "async", "4"),
    ("async", "async", "2"),
]


@pytest.mark.parametrize("copy", COPIES, ids=lambda c: "-".join(c))
def test_gather_plan_fuzz(copy: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan copy (full grid and capped prefetch grid) against the reference."""
    monkeypatch.setenv("HISPARSE_GATHER_KERNEL", copy[0])
    monkeypatch.setenv("HISPARSE_PREFETCH_KERNEL", copy[1])
    monkeypatch.setenv("HISPARSE_BULK_STAGES", copy[2])
    rng = np.random.default_rng(hash(copy) % 2**32)
    for b, k, w in [(1, 1, 16), (4, 33, 656), (16, 300, 1152), (64, 2048, 656)]:
        # the full grid, and a few blocks walking several rows each (1 block: 64 rows, two batches of
        # the deep copy's 32)
        for max_blocks in (0, 1, 3, 8, 32):
            fuzz.check_gather_plan(rng, b=b, k=k, row_bytes=w, pool_rows=int(rng.integers(1, 5000)),
                                   hot_rows=b * k + int(rng.integers(0, 100)), max_blocks=max_blocks)
            fuzz.check_gather_plan(rng, b=b, k=k, row_bytes=w, pool_rows=int(rng.integers(1, 4 * k + 10)),
                                   hot_rows=b * k + int(rng.integers(0, 100)), max_blocks=max_blocks, runs=True)


def test_backup_newest_rows_fuzz() -> None:
    rng = np.random.default_rng(13)
    for b, h, w in [(1, 1, 16), (7, 64, 656), (64, 4096, 1152)]:
        for extra in (0, 5):
            fuzz.check_backup_newest_rows(rng, b=b, h=h, row_bytes=w, pool_rows=b * 8 + 3, extra_newest=extra)


def test_invalidate_slots_fuzz() -> None:
    rng = np.random.default_rng(17)
    for b, h, m in [(1, 1, 1), (9, 300, 17), (64, 4096, 5000)]:  # 5000 ids take two launches
        fuzz.check_invalidate_slots(rng, b=b, h=h, num_blocks=m, block_size=int(rng.integers(1, 65)),
                                    pool_blocks=int(rng.integers(1, 4000)))


_ARGUMENT_CHECKS = """
import torch
from hisparse_kernels.ops import gather_plan
hot = torch.zeros(8, 32, dtype=torch.uint8, device="cuda")
plan = torch.zeros(1, 2, dtype=torch.int32, device="cuda")
count = torch.zeros(1, dtype=torch.int32, device="cuda")
real = torch.ones(1, dtype=torch.int32, device="cuda")
pinned = torch.zeros(4, 32, dtype=torch.uint8).pin_memory()
cases = [
    (torch.zeros(4, 32, dtype=torch.uint8), hot, plan, plan),
    (pinned, hot, plan.long(), plan),
    (torch.zeros(4, 48, dtype=torch.uint8).pin_memory(), hot, plan, plan),
    (pinned, hot.float(), plan, plan),
    (pinned, hot, plan, torch.zeros(1, 3, dtype=torch.int32, device="cuda")),
]
for pool, h, src, dst in cases:
    try:
        gather_plan(pool, h, src, dst, count, real)
        print("ACCEPTED")
    except RuntimeError as e:
        print("RAISED", str(e).splitlines()[0])
"""


def test_arguments_are_checked_before_launch() -> None:
    """Bad arguments raise before any launch (run in a child process so a crash is a failure too)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.run([sys.executable, "-c", _ARGUMENT_CHECKS], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, f"child exited {proc.returncode}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("RAISED", "ACCEPTED"))]
    assert len(lines) == 5, proc.stdout
    assert "page-locked" in lines[0]
    assert "plan_src must be Int" in lines[1]
    assert "rows are 48 bytes" in lines[2]
    assert "hot must be Byte" in lines[3]
    assert "plan_dst has shape" in lines[4]


def test_host_pool_registers_and_unregisters() -> None:
    from hisparse_kernels.host_pool import HostPool

    pool = HostPool(2, 10, 656)
    assert pool.registered and pool.tensor.data_ptr() % 4096 == 0
    assert pool.layer(1).is_pinned()
    pool.close()
    assert not pool.registered
    with pytest.raises(RuntimeError, match="closed"):
        _ = pool.tensor


def test_graph_replay_with_changing_batch() -> None:
    """Capture swap_in + index-sharing prefetch + newest backup once; replay with fresh inputs and a
    different num_real_reqs each time; every replay must match the reference step exactly."""
    from hisparse_kernels.host_pool import HostPool
    from hisparse_kernels.hot_state import HotState
    from hisparse_kernels.index_share import IndexSharePrefetcher
    from hisparse_kernels.ops import backup_newest_rows, swap_in

    rng = np.random.default_rng(23)
    b, k, h, w, pool_rows, shared = 6, 32, 64, 656, 2000, 2
    rs = region_stride_for(h)
    dev = torch.device("cuda")
    pools = HostPool(1 + shared, pool_rows, w)
    pools.tensor.copy_(torch.from_numpy(rng.integers(0, 256, size=pools.shape, dtype=np.uint8)))
    state = HotState.allocate(b, k, h, dev)
    hots = [torch.zeros(b * rs, w, dtype=torch.uint8, device=dev) for _ in range(1 + shared)]
    topk = torch.full((b, k), -1, dtype=torch.int32, device=dev)
    newest = torch.full((b,), -1, dtype=torch.int32, device=dev)
    real = torch.zeros(1, dtype=torch.int32, device=dev)
    prefetch = IndexSharePrefetcher(shared, dev)

    def step() -> None:
        swap_in(topk, newest, real, state.dgi, state.lru, state.hot_rows, state.plan_src, state.plan_dst,
                state.plan_count, state.counters, state.miss_mask, pools.layer(0), hots[0], region_stride=rs)
        prefetch.issue(state, [pools.layer(1 + j) for j in range(shared)], hots[1:], real)
        for j in range(shared):
            prefetch.wait(j)
        backup_newest_rows(hots[0], pools.layer(0), newest, real, region_stride=rs, hot_slot=h)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, as torch requires
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    state.reset_rows(range(b))
    for hot in hots:
        hot.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    rs_state = ref.ResolveState(state.dgi.cpu().numpy(), state.lru.cpu().numpy(),
                                state.hot_rows.cpu().numpy(), state.plan_src.cpu().numpy(),
                                state.plan_dst.cpu().numpy(), state.plan_count.cpu().numpy(),
                                state.counters.cpu().numpy(), state.miss_mask.cpu().numpy())
    hots_ref = [hot.cpu().numpy() for hot in hots]
    pool_ref = pools.tensor.numpy().copy()
    seen_batches = set()
    for it in range(12):
        n = int(rng.integers(0, b + 1)) if it else b
        seen_batches.add(n)
        case = fuzz.random_resolve_case(rng, b=b, k=k, h=h, row_bytes=w, pool_rows=pool_rows)
        topk.copy_(torch.from_numpy(case.topk))
        newest.copy_(torch.from_numpy(case.newest))
        real.fill_(n)
        graph.replay()
        ref.resolve_ref(case.topk, case.newest, n, rs_state, region_stride=rs, pool_rows=pool_rows)
        for j in range(1 + shared):
            ref.gather_plan_ref(pool_ref[j], hots_ref[j], rs_state.plan_src, rs_state.plan_dst,
                                rs_state.plan_count, n)
        ref.backup_newest_rows_ref(hots_ref[0], pool_ref[0], case.newest, n, region_stride=rs, hot_slot=h)
        torch.cuda.synchronize()
        for name in ("dgi", "lru", "hot_rows", "plan_count", "counters", "miss_mask"):
            np.testing.assert_array_equal(getattr(state, name).cpu().numpy(), getattr(rs_state, name),
                                          err_msg=f"{name} after replay {it} (num_real={n})")
        for j in range(1 + shared):
            np.testing.assert_array_equal(hots[j].cpu().numpy(), hots_ref[j], err_msg=f"hot[{j}] replay {it}")
        np.testing.assert_array_equal(pools.tensor.numpy(), pool_ref, err_msg=f"host pool replay {it}")
    assert len(seen_batches) >= 3
    del graph
    pools.close()
