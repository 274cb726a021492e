#!/usr/bin/env python3
"""Wall time of `hisparse render examples/hisparse-deployment.yaml`, CLI start-up and imports included.

Prints a table and writes results/render.json. Beside the command it times, in the same run, a bare
interpreter start (`python -c pass`, the floor) and the CLI's imports alone (`import hisparse_operator.cli`),
so the render's own share is visible. Limit: 1 s for the whole command.

    .venv/bin/python operator/benchmarks/render_bench.py [--runs 20]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT_SECONDS = 1.0


def _time(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)  # warm the page cache and .pyc files
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
        out.append(time.perf_counter() - start)
    return out


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "render.json")
    args = parser.parse_args()
    hisparse = shutil.which("hisparse", path=str(Path(sys.executable).parent)) or "hisparse"
    cases = {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "import hisparse_operator.cli": [sys.executable, "-c", "import hisparse_operator.cli"],
        "hisparse render example": [hisparse, "render", "examples/hisparse-deployment.yaml"],
    }
    rows = {}
    for name, cmd in cases.items():
        samples = _time(cmd, args.runs)
        rows[name] = {
            "min_s": min(samples),
            "median_s": statistics.median(samples),
            "p90_s": sorted(samples)[int(0.9 * (len(samples) - 1))],
            "runs": len(samples),
        }
    render = rows["hisparse render example"]
    result = {
        "benchmark": "hisparse render examples/hisparse-deployment.yaml",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version()},
        "limit_s": LIMIT_SECONDS,
        "median_vs_limit": render["median_s"] / LIMIT_SECONDS,
        "cases": rows,
    }
    print(f"{'case':34} {'min':>8} {'median':>8} {'p90':>8}")
    for name, row in rows.items():
        print(f"{name:34} {row['min_s']:8.3f} {row['median_s']:8.3f} {row['p90_s']:8.3f}")
    verdict = "within" if render["median_s"] <= LIMIT_SECONDS else "OVER"
    print(f"render median {render['median_s']:.3f} s = {result['median_vs_limit']:.2f} x the {LIMIT_SECONDS:.0f} s limit ({verdict})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
