"""Merge one GPU run's bench.json, parity.json and gpu_tests.xml into summary.json."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(out: Path) -> None:
    bench = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else {}
    parity = json.loads((out / "parity.json").read_text()) if (out / "parity.json").exists() else {}
    tests: dict[str, object] = {}
    junit = out / "gpu_tests.xml"
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        assert suite is not None
        tests = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        tests["cases"] = {
            c.get("name"): ("failed" if c.find("failure") is not None or c.find("error") is not None
                            else "skipped" if c.find("skipped") is not None else "passed")
            for c in suite.iter("testcase")
        }
    keys = ["gpu", "date", "memcpy_h2d_gbps", "copy_only_random_gbps", "swap_in_random_gbps",
            "swap_in_vs_copy_ratio", "swap_in_vs_memcpy_ratio", "swap_in_runs4_vs_memcpy_ratio",
            "naive_uva_gbps", "resolve_all_hit_us", "prefetch_hidden_fraction",
            "swap_in_runs4_vs_copy_ratio", "swap_in_runs4_shuffled_vs_memcpy_ratio",
            "copy_column_order_runs4_shuffled_gbps", "resolve_all_hit_eager_us",
            "prefetch_hidden_fraction_eager", "prefetch_hidden_fraction_large_gemm",
            "prefetch_hidden_fraction_large_gemm_eager", "prefetch_hidden_fraction_expert_gemm",
            "prefetch_hidden_fraction_expert_gemm_eager", "swap_in_2048_rows_us", "launch_only_us",
            "gather_kernel", "prefetch_default", "swap_in_vs_naive_ratio",
            "swap_in_vs_naive_column_order_random_ratio", "swap_in_vs_naive_column_order_runs4_ratio",
            "swap_in_vs_naive_column_order_runs4_shuffled_ratio", "naive_uva_runs4_gbps",
            "swap_in_runs4_gbps", "swap_in_runs4_shuffled_gbps", "resolve_kernel", "resolve_all_hit_general_us",
            "launch_only_graph_resolve_shape_us", "resolve_all_miss_runs4_fast_us", "resolve_all_miss_runs4_general_us"]
    summary = {k: bench.get(k) for k in keys}
    summary.update(
        parity_pass=bool(parity.get("passed", False)),
        parity_requests=parity.get("requests"),
        parity_steps=parity.get("decode_steps"),
        parity_first_divergence=parity.get("first_divergence"),
        gpu_tests=tests,
        bench=bench,
        parity=parity,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("bench", "parity", "gpu_tests")}, indent=1))
    print("gpu tests:", {k: v for k, v in tests.items() if k != "cases"})


if __name__ == "__main__":
    main(Path(sys.argv[1]))
