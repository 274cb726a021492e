#!/usr/bin/env python3
"""Real-node benchmark: node up time and pod start latency. Prints a table, writes JSON.

On a fresh local control plane (no LWS): the real node is started --runs times (each start is timed
from ``RealNode.start()`` to Ready node, synced kube-proxy and available CoreDNS, then stopped and
timed too); on the last node, a busybox image is imported, then --pods pods are created one at a time
(create -> Ready each) and --pods at once (create -> all Ready). The node's kubelet and containerd
RSS are read at the end.

    .venv/bin/python e2e/benchmarks/realnode_bench.py [--runs 3] [--pods 5]

The result goes to e2e/benchmarks/results/realnode.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "devcluster"))
sys.path.insert(0, str(REPO / "e2e" / "tests"))
sys.path.insert(0, str(REPO / "e2e" / "benchmarks"))
from e2e_realnode import busybox_archive, busybox_pod, wait_pods_ready  # noqa: E402
from hisparse_devcluster import Cluster, Tools  # noqa: E402
from hisparse_devcluster.realnode import RealNode  # noqa: E402
from operator_bench import _cpu, _rss_mb  # noqa: E402


def machine() -> dict[str, Any]:
    """The machine a real-node benchmark ran on, recorded with its figures."""
    return {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}


def report(rows: list[tuple[str, str]], result: dict[str, Any], out: Path) -> None:
    """Print the table (after the machine) and write ``result`` as JSON to ``out``."""
    width = max(len(k) for k, _ in rows)
    print(f"machine: {result['machine']}")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def _timed_pods(c: Cluster, ns: str, names: list[str]) -> float:
    t0 = time.monotonic()
    c.apply([busybox_pod(n, ns, "exec /bin/busybox sleep 3600") for n in names])
    wait_pods_ready(c, ns, names)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pods", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "e2e" / "benchmarks" / "results" / "realnode.json")
    args = ap.parse_args()
    tools = Tools.locate()
    up, down, single, batch = [], [], [], 0.0
    rss: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="realnode-bench-") as tmp, Cluster.start(tmp, tools=tools) as c:
        node = None
        for i in range(args.runs):
            t0 = time.monotonic()
            node = RealNode(c, tools=tools).start()
            up.append(time.monotonic() - t0)
            if i < args.runs - 1:
                t0 = time.monotonic()
                node.stop()
                down.append(time.monotonic() - t0)
        assert node is not None
        t0 = time.monotonic()
        node.import_image(busybox_archive(Path(tmp) / "images" / "busybox.tar"))
        import_s = time.monotonic() - t0
        c.kubectl("create", "namespace", "bench")
        for i in range(args.pods):
            single.append(_timed_pods(c, "bench", [f"one-{i}"]))
        batch = _timed_pods(c, "bench", [f"batch-{i}" for i in range(args.pods)])
        for p in node.processes:
            if p.name in ("kubelet", "containerd"):
                rss[p.name] = round(_rss_mb(p.pid)[0], 1)
        t0 = time.monotonic()
        node.stop()
        down.append(time.monotonic() - t0)
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "node_up_s": [round(x, 2) for x in up],
        "node_down_s": [round(x, 2) for x in down],
        "image_import_s": round(import_s, 2),
        "pod_start_single_s": [round(x, 2) for x in single],
        "pod_start_batch_s": round(batch, 2),
        "batch_pods": args.pods,
        "rss_mb": rss,
    }
    rows = [
        ("real node up (start -> Ready, kube-proxy synced, CoreDNS available), median / max",
         f"{statistics.median(up):.1f} s / {max(up):.1f} s"),
        ("real node down (nothing left), median", f"{statistics.median(down):.1f} s"),
        ("import of the busybox image", f"{import_s:.2f} s"),
        ("pod create -> Ready, one at a time, median / max",
         f"{statistics.median(single):.2f} s / {max(single):.2f} s"),
        (f"{args.pods} pods at once, create -> all Ready", f"{batch:.2f} s"),
        ("kubelet / containerd RSS", f"{rss.get('kubelet', 0):.0f} MB / {rss.get('containerd', 0):.0f} MB"),
    ]
    report(rows, result, args.out)


if __name__ == "__main__":
    main()
