"""A few all-hit resolves (64 x K=2048 x H=4096) for a profiler to look at (e.g. ncu)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hisparse_kernels import HotState, ensure_loaded  # noqa: E402
from hisparse_kernels.ops import resolve  # noqa: E402


def main() -> None:
    ensure_loaded()
    dev = torch.device("cuda")
    b, k, h = 64, 2048, 4096
    rng = np.random.default_rng(0)
    state = HotState.allocate(b, k, h, dev)
    topk = torch.from_numpy(rng.choice(1 << 20, size=(b, k), replace=False).astype(np.int32)).to(dev)
    newest = torch.full((b,), -1, dtype=torch.int32, device=dev)
    real = torch.tensor([b], dtype=torch.int32, device=dev)
    for _ in range(6):  # the first resolve misses everything, the rest hit everything
        resolve(topk, newest, real, state.dgi, state.lru, state.hot_rows, state.plan_src, state.plan_dst,
                state.plan_count, state.counters, state.miss_mask, region_stride=state.region_stride,
                pool_rows=1 << 20)
    torch.cuda.synchronize()
    print("counters", state.counters.tolist())


if __name__ == "__main__":
    main()
