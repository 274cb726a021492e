"""Token parity on the GPU through vLLM 0.33's HiSparse op sequence: vLLM's compiled ops against ours.

The tiny DSA model decodes the same requests three ways: the full KV on the device, vLLM's op
sequence on the wheel's compiled ops (``_C_stable_libtorch.abi3.so``, path in
``HISPARSE_VLLM_OPS_SO``), and the same sequence on our ops under vLLM's schemas. All three must give
the same tokens, and the two op sets the same hit and miss counts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def both_op_sets() -> None:
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
        pytest.skip("needs a CUDA GPU of compute capability >= 9.0")
    so = os.environ.get("HISPARSE_VLLM_OPS_SO", "")
    assert so and Path(so).exists(), (
        "HISPARSE_VLLM_OPS_SO must name the vLLM 0.33.0 wheel's _C_stable_libtorch.abi3.so: this test "
        "compares our ops with vLLM's and has nothing to compare without it")
    from hisparse_kernels.ops import ensure_loaded
    from hisparse_kernels.tiny_dsa.vllm_path import load_wheel_ops

    load_wheel_ops(so)

    ensure_loaded()


def test_tokens_equal_on_vllms_ops_and_ours() -> None:
    from hisparse_kernels.tiny_dsa import TinyDSA, TinyDSAConfig, first_divergence
    from hisparse_kernels.tiny_dsa import vllm_path
    from hisparse_kernels.tiny_dsa.parity import parity_requests

    config = TinyDSAConfig(index_topk=64, hot_slots=128, max_batch=32, num_blocks=4096, block_size=16)
    model = TinyDSA(config, seed=2026, device="cuda")
    requests = parity_requests(config, count=120, prompt_range=(300, 700), tokens_range=(40, 120), seed=5)
    runs = {}
    for name, ops in (("full_kv", None), ("vllm_ops", vllm_path.wheel_ops()), ("our_ops", vllm_path.our_ops())):
        t0 = time.perf_counter()
        runs[name] = model.generate_batch(requests, hisparse=ops is not None, vllm_ops=ops)
        runs[name].seconds = round(time.perf_counter() - t0, 1)  # type: ignore[attr-defined]
    full, theirs, ours = runs["full_kv"], runs["vllm_ops"], runs["our_ops"]
    report = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "requests": len(requests), "decode_steps": full.decode_steps, "max_concurrency": full.max_concurrency,
        "blocks_recycled": full.blocks_recycled, "tokens_compared": sum(len(t) for t in full.tokens),
        "max_context": max(len(p) + m for p, m in requests),
        "first_divergence_vllm_vs_full": first_divergence(full.tokens, theirs.tokens),
        "first_divergence_ours_vs_vllm": first_divergence(theirs.tokens, ours.tokens),
        "hits_misses": {"vllm_ops": [theirs.hits, theirs.misses], "our_ops": [ours.hits, ours.misses]},
        "seconds": {name: r.seconds for name, r in runs.items()},  # type: ignore[attr-defined]
    }
    out_dir = os.environ.get("HISPARSE_RESULTS_DIR")
    if out_dir:
        Path(out_dir, "vllm_ops_tokens.json").write_text(json.dumps(report, indent=1))
    print("vllm_ops_tokens:", report)
    assert full.max_concurrency >= 32 and full.decode_steps >= 256 and full.blocks_recycled > 0
    assert theirs.misses > 0 and theirs.hits > 0
    assert report["first_divergence_vllm_vs_full"] is None
    assert report["first_divergence_ours_vs_vllm"] is None
    assert (ours.hits, ours.misses) == (theirs.hits, theirs.misses)


def test_graph_captured_sequence_matches_vllms() -> None:
    """runtime.py captures decode in CUDA graphs: the op sequence (resolve, gather_compact, a shared
    layer's gather_plan, invalidate_written_slots) captured once per op set and replayed over changing
    top-k inputs gives, replay after replay, the same outputs, state and hot caches on ours as on vLLM's."""
    import numpy as np

    from hisparse_kernels.tiny_dsa import vllm_path

    n, k, hot, bs, w, host_rows = 8, 64, 128, 16, 656, 4096
    rng = np.random.default_rng(4)
    host = torch.from_numpy(rng.integers(0, 256, (host_rows, w), dtype=np.uint8)).pin_memory()
    host2 = torch.from_numpy(rng.integers(0, 256, (host_rows, w), dtype=np.uint8)).pin_memory()
    hb = hot // bs
    hbt = torch.from_numpy(rng.permutation(n * hb + 2)[: n * hb].reshape(n, hb).astype(np.int32)).cuda()
    rsi = torch.tensor([3, 0, 1, -1, 2, 5, 4, 6], dtype=torch.int32, device="cuda")  # one padding row
    topk = torch.full((n, k), -1, dtype=torch.int32, device="cuda")
    req = torch.arange(n, dtype=torch.int32, device="cuda")
    written = torch.full((n,), -1, dtype=torch.int64, device="cuda")

    def state() -> dict:
        i32 = {"dtype": torch.int32, "device": "cuda"}
        return {
            "hot_cache": torch.zeros((n * hb + 2, bs, w), dtype=torch.uint8, device="cuda"),
            "hot_cache2": torch.zeros((n * hb + 2, bs, w), dtype=torch.uint8, device="cuda"),
            "dgi": torch.full((8, hot), -1, **i32),
            "lru": torch.arange(hot, dtype=torch.int16, device="cuda").repeat(8, 1).contiguous(),
            "stats": torch.zeros(2, dtype=torch.uint64, device="cuda"),
            **{name: torch.full((n, k), -7, **i32) for name in ("hot", "mm", "att", "res", "sh", "sd", "att2")},
            "sc": torch.full((n,), -7, **i32),
        }

    def sequence(ops, s: dict) -> None:
        ops.hisparse_resolve_residency(host, s["hot_cache"], hbt, topk, s["hot"], s["dgi"], s["lru"], rsi, hot, k,
                                       s["mm"], s["stats"], s["att"], bs, None, None, 0, s["res"], None, s["sh"],
                                       s["sd"], s["sc"], None, 0, 0)
        ops.hisparse_gather_compact(host, s["hot_cache"], s["sh"], s["sd"], s["sc"])
        ops.hisparse_gather_plan(host2, s["hot_cache2"], s["res"], s["hot"], s["mm"], rsi, s["att2"], bs)
        ops.hisparse_invalidate_written_slots(s["dgi"], rsi, req, written)

    sides = {"vllm": (vllm_path.wheel_ops(), state()), "ours": (vllm_path.our_ops(), state())}
    graphs = {}
    for name, (ops, s) in sides.items():
        side_stream = torch.cuda.Stream()
        side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side_stream):  # warm-up outside capture, as torch asks
            sequence(ops, s)
        torch.cuda.current_stream().wait_stream(side_stream)
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            sequence(ops, s)
    held = np.arange(0, host_rows, 7)
    for step in range(40):
        rows = [rng.choice(held if step % 3 else host_rows + 4, k, replace=False) for _ in range(n)]
        t = np.stack(rows).astype(np.int32)
        t[rng.random(t.shape) < 0.05] = -1
        topk.copy_(torch.from_numpy(t))
        wr = rng.choice(held, n).astype(np.int64)
        wr[rng.random(n) < 0.3] = -1
        written.copy_(torch.from_numpy(wr))
        for name in sides:
            graphs[name].replay()
        torch.cuda.synchronize()
        a, b = sides["vllm"][1], sides["ours"][1]
        differ = [key for key in a if not torch.equal(a[key].view(torch.int64) if key == "stats" else a[key],
                                                      b[key].view(torch.int64) if key == "stats" else b[key])]
        assert not differ, f"replay {step}: ours differs from vLLM's in {differ}"
    hits, misses = sides["vllm"][1]["stats"].cpu().numpy().tolist()
    assert hits > 0 and misses > 0  # the replays resolved both hits and misses
