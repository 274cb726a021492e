"""Small fuzz cases of every op, sized to run under compute-sanitizer (memcheck, racecheck).
Each case is still checked against the reference; exits non-zero on any mismatch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hisparse_kernels import fuzz  # noqa: E402
from hisparse_kernels.ops import ensure_loaded  # noqa: E402


def main() -> None:
    ensure_loaded()
    rng = np.random.default_rng(99)
    cases = 0
    for resolve_kernel in ("fast", "general"):
        os.environ["HISPARSE_RESOLVE_KERNEL"] = resolve_kernel
        for b, k, h, w in [(3, 4, 4, 656), (4, 70, 150, 1152), (2, 1100, 2200, 656)]:
            for corrupt in (False, True):
                case = fuzz.random_resolve_case(rng, b=b, k=k, h=h, row_bytes=w, pool_rows=6 * h + 10,
                                                corrupt=corrupt)
                fuzz.check_swap_in(case, rng)
                fuzz.check_swap_in(case, rng, with_mask=False, resolve_only=True)
                cases += 2
    for copy in ("lines", "bulk", "async"):
        os.environ["HISPARSE_GATHER_KERNEL"] = copy
        os.environ["HISPARSE_PREFETCH_KERNEL"] = "deep" if copy == "lines" else copy
        # 40 rows on one block: the deep copy's second batch of rows (it flattens 32 at a time)
        for b, k, w in [(2, 5, 656), (5, 300, 1152), (40, 20, 656)]:
            for max_blocks in (0, 1, 2):
                fuzz.check_gather_plan(rng, b=b, k=k, row_bytes=w, pool_rows=500, hot_rows=b * k + 7,
                                       max_blocks=max_blocks)
                fuzz.check_gather_plan(rng, b=b, k=k, row_bytes=w, pool_rows=4 * k + 3, hot_rows=b * k + 7,
                                       max_blocks=max_blocks, runs=True)
                cases += 2
    for name in ("HISPARSE_RESOLVE_KERNEL", "HISPARSE_GATHER_KERNEL", "HISPARSE_PREFETCH_KERNEL"):
        os.environ.pop(name)
    fuzz.check_backup_newest_rows(rng, b=9, h=64, row_bytes=656, pool_rows=80, extra_newest=3)
    fuzz.check_invalidate_slots(rng, b=5, h=300, num_blocks=4200, block_size=16, pool_blocks=900)
    cases += 2
    print(f"sanitize cases: {cases} passed")


if __name__ == "__main__":
    main()
