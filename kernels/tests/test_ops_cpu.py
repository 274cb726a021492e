"""The op wrappers on CPU tensors (they run the reference in place), the host pool without CUDA,
the hot state and the CPU prefetcher."""

from __future__ import annotations

import numpy as np
import pytest

from hisparse_kernels import reference as ref

torch = pytest.importorskip("torch")


def test_import_without_building() -> None:
    import hisparse_kernels

    assert not hisparse_kernels.ops.is_loaded()
    assert "swap_in" in hisparse_kernels.__all__


def test_swap_in_wrapper_matches_reference_on_cpu() -> None:
    from hisparse_kernels import HostPool, HotState, swap_in

    rng = np.random.default_rng(3)
    b, k, h, w, pool_rows = 3, 5, 8, 32, 40
    state = HotState.allocate(b, k, h, "cpu")
    with HostPool(1, pool_rows, w, pin=False) as pool:
        host = pool.layer(0)
        host.copy_(torch.from_numpy(rng.integers(0, 256, size=(pool_rows, w), dtype=np.uint8)))
        hot = torch.zeros(b * state.region_stride, w, dtype=torch.uint8)
        ref_state = ref.ResolveState(*(getattr(state, n).numpy().copy() for n in
                                       ("dgi", "lru", "hot_rows", "plan_src", "plan_dst", "plan_count",
                                        "counters", "miss_mask")))
        hot_ref = hot.numpy().copy()
        for _ in range(4):
            topk = rng.integers(-1, pool_rows, size=(b, k)).astype(np.int32)
            newest = rng.integers(0, pool_rows, size=b).astype(np.int32)
            swap_in(torch.from_numpy(topk), torch.from_numpy(newest), torch.tensor([2], dtype=torch.int32),
                    state.dgi, state.lru, state.hot_rows, state.plan_src, state.plan_dst, state.plan_count,
                    state.counters, state.miss_mask, host, hot, region_stride=state.region_stride)
            ref.swap_in_ref(topk, newest, 2, ref_state, host.numpy(), hot_ref, region_stride=state.region_stride)
        assert np.array_equal(state.dgi.numpy(), ref_state.dgi)
        assert np.array_equal(state.lru.numpy(), ref_state.lru)
        assert np.array_equal(state.hot_rows.numpy(), ref_state.hot_rows)
        assert np.array_equal(state.counters.numpy(), ref_state.counters)
        assert np.array_equal(hot.numpy(), hot_ref)
        assert state.counters.sum() > 0


def test_cpu_prefetcher_replays_plan_into_each_shared_layer() -> None:
    from hisparse_kernels import HostPool, HotState, IndexSharePrefetcher, swap_in

    b, k, h, w = 2, 4, 4, 16
    state = HotState.allocate(b, k, h, "cpu")
    with HostPool(3, 20, w, pin=False) as pool:
        for layer in range(3):
            pool.layer(layer).copy_(torch.arange(20 * w).view(20, w).remainder(251).to(torch.uint8) + layer)
        hots = [torch.zeros(b * state.region_stride, w, dtype=torch.uint8) for _ in range(3)]
        topk = torch.tensor([[3, 5, -1, 7], [1, 2, 3, 4]], dtype=torch.int32)
        real = torch.tensor([2], dtype=torch.int32)
        swap_in(topk, torch.tensor([-1, -1], dtype=torch.int32), real, state.dgi, state.lru, state.hot_rows,
                state.plan_src, state.plan_dst, state.plan_count, state.counters, state.miss_mask,
                pool.layer(0), hots[0], region_stride=state.region_stride)
        pre = IndexSharePrefetcher(2, "cpu")
        pre.issue(state, [pool.layer(1), pool.layer(2)], hots[1:], real)
        pre.wait(0)
        for layer in range(3):
            for r in range(b):
                for c in range(k):
                    row = int(state.hot_rows[r, c])
                    g = int(topk[r, c])
                    if g >= 0:
                        assert torch.equal(hots[layer][row], pool.layer(layer)[g])


def test_host_pool_layout_and_close() -> None:
    from hisparse_kernels import HostPool

    pool = HostPool(2, 3, 48, pin=False)
    assert pool.tensor.shape == (2, 3, 48) and pool.tensor.data_ptr() % 4096 == 0
    assert not pool.registered
    pool.close()
    with pytest.raises(RuntimeError):
        _ = pool.tensor
    with pytest.raises(ValueError):
        HostPool(1, 1, 24, pin=False)


def test_hot_state_reset() -> None:
    from hisparse_kernels import HotState

    s = HotState.allocate(2, 3, 5, "cpu")
    assert s.region_stride == 128 and s.hot_slot == 5
    s.dgi.fill_(4)
    s.lru.fill_(1)
    s.reset_rows([1])
    assert s.dgi[1].tolist() == [-1] * 5 and s.lru[1].tolist() == [0, 1, 2, 3, 4]
    assert s.dgi[0].tolist() == [4] * 5
    with pytest.raises(ValueError):
        HotState.allocate(1, 4, 3, "cpu")
