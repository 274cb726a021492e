#!/usr/bin/env python3
"""Fleet benchmark: copies of the 16-node production example on KWOK GPU nodes. Prints a table, writes JSON.

For each scale (nodes), on a fresh local control plane with the LeaderWorkerSet controller:
N = nodes * 60 / 1000 copies of examples/hisparse-deployment.yaml (8 prefill pods, one 8-pod decode
LeaderWorkerSet group each; see e2e/tests/e2e_fleet.py) are applied at once; measured are the time until
every copy is Ready, the operator's CPU seconds and peak RSS over that, every control-plane process's CPU
seconds, and then a hold: every copy must still be Ready and every node Ready after --hold seconds
(node liveness rests on KWOK's node Leases), with the operator's idle CPU over the hold.

    .venv/bin/python e2e/benchmarks/fleet_bench.py [--scales 100,500,1000] [--hold 60]

The result goes under "fleet" in e2e/benchmarks/results/operator.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "e2e" / "tests"))
import e2e_fleet  # noqa: E402
from hisparse_devcluster import Cluster, Tools, storage  # noqa: E402
from operator_bench import _cpu, _metric, _rss_mb, _wait, start_operator  # noqa: E402

COPIES_PER_1000_NODES = 60
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _hsd_ready(c: Cluster) -> tuple[int, int]:
    items = json.loads(c.kubectl("get", "hsd", "-A", "-o", "json", timeout=300).stdout)["items"]
    ready = sum(1 for i in items if any(x["type"] == "Ready" and x["status"] == "True"
                                        for x in (i.get("status") or {}).get("conditions", [])))
    return ready, len(items)


def _not_ready_nodes(c: Cluster) -> int:
    items = json.loads(c.kubectl("get", "nodes", "-o", "json", timeout=300).stdout)["items"]
    return sum(1 for n in items if not any(x["type"] == "Ready" and x["status"] == "True"
                                           for x in n["status"].get("conditions", [])))


def _pods(c: Cluster) -> tuple[int, int]:
    """(serving pods the operator manages, those Running and Ready)."""
    items = json.loads(c.kubectl("get", "pods", "-A", "-l", "app.kubernetes.io/managed-by=hisparse-operator",
                                 "-o", "json", timeout=300).stdout)["items"]
    ok = sum(1 for p in items if p["status"].get("phase") == "Running" and any(
        x["type"] == "Ready" and x["status"] == "True" for x in p["status"].get("conditions", [])))
    return len(items), ok


def run_scale(nodes: int, hold: float, timeout: float) -> dict[str, Any]:
    copies = nodes * COPIES_PER_1000_NODES // 1000
    decode_nodes = copies * e2e_fleet.NODES_PER_COPY["decode"]
    workdir = Path(tempfile.mkdtemp(prefix=f"hisparse-fleet-{nodes}-"))
    c = Cluster.start(workdir, tools=Tools.locate(), lws=True)
    op = None
    try:
        t0 = time.perf_counter()
        e2e_fleet.add_nodes(c, copies, prefix="", total=nodes)
        nodes_s = time.perf_counter() - t0
        op, mport = start_operator(c, workdir)
        # One namespace: LWS's exclusive placement keeps groups apart only within a namespace (its
        # pod anti-affinity term names no namespaces), so copies in separate namespaces share racks.
        docs = [e2e_fleet.manifest("fleet", f"glm52-{i:02d}") for i in range(copies)]
        c.kubectl("create", "namespace", "fleet")
        for doc in docs:
            storage.provide_model_cache(c, doc)  # each copy's model cache claim, bound before the apply
        time.sleep(2)
        procs = {p.name: p.pid for p in c.processes}
        cpu0 = {name: _cpu_s(pid) for name, pid in procs.items()} | {"operator": _cpu_s(op.pid)}
        writes0 = _metric(mport, "hisparse_operator_api_writes_total")
        t0 = time.perf_counter()
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), timeout=600)
        try:
            _wait(f"{copies} copies Ready", lambda: _hsd_ready(c)[0] == copies, timeout)
        except TimeoutError as e:
            pending = c.kubectl("get", "pods", "-A", "--field-selector=status.phase!=Running", "--no-headers").stdout
            raise TimeoutError(f"{e}; Ready: {_hsd_ready(c)}; pods not Running:\n{pending[:3000]}") from e
        converge_s = time.perf_counter() - t0  # from the start of the apply
        cpu1 = {name: _cpu_s(pid) for name, pid in procs.items()} | {"operator": _cpu_s(op.pid)}
        writes = _metric(mport, "hisparse_operator_api_writes_total") - writes0
        rss, hwm = _rss_mb(op.pid)
        pods, pods_ok = _pods(c)
        # Hold: nothing may fall back to not ready while KWOK only renews leases.
        time.sleep(hold)
        cpu2 = _cpu_s(op.pid)
        held_ready, _ = _hsd_ready(c)
        pods_after, pods_ok_after = _pods(c)
        not_ready_nodes = _not_ready_nodes(c)
        leases = len(c.kubectl("get", "leases", "-n", "kube-node-lease", "-o", "name").stdout.split())
        rss_after, hwm_after = _rss_mb(op.pid)
    finally:
        if op is not None and op.poll() is None:
            os.killpg(op.pid, signal.SIGTERM)
            op.wait(60)
        c.stop()
    return {
        "nodes": nodes, "copies": copies, "decode_nodes": decode_nodes, "prefill_nodes": nodes - decode_nodes,
        "cpu_nodes": copies // e2e_fleet.COPIES_PER_CPU_NODE + 1,
        "pods": pods, "pods_running_ready": pods_ok,
        "add_nodes_s": round(nodes_s, 1),
        "converge_s": round(converge_s, 1),
        "operator": {"cpu_s_during_converge": round(cpu1["operator"] - cpu0["operator"], 1),
                     "api_writes_during_converge": writes,
                     "rss_mb_after_converge": round(rss, 1), "peak_rss_mb": round(max(hwm, hwm_after), 1),
                     "idle_cpu_percent_during_hold": round(100 * (cpu2 - cpu1["operator"]) / hold, 2)},
        "cpu_s_during_converge": {k: round(cpu1[k] - cpu0[k], 1) for k in cpu0},
        "hold": {"seconds": hold, "copies_ready": held_ready, "pods_running_ready": pods_ok_after,
                 "pods": pods_after, "nodes_not_ready": not_ready_nodes, "node_leases": leases},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="100,500,1000", help="node counts, comma-separated")
    ap.add_argument("--hold", type=float, default=60)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=REPO / "e2e" / "benchmarks" / "results" / "operator.json",
                    help="JSON file whose 'fleet' entry is replaced (operator_bench.py writes the rest)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = []
    for nodes in (int(x) for x in args.scales.split(",")):
        runs.append(run_scale(nodes, args.hold, args.timeout))
        print(json.dumps(runs[-1]), flush=True)
    result = {
        "benchmark": "copies of examples/hisparse-deployment.yaml (16 nodes each) on KWOK GPU nodes, "
                     "local control plane with the LeaderWorkerSet controller",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version()},
        "runs": runs,
    }
    print(f"\n{'nodes':>6} {'copies':>6} {'pods':>5} {'converge s':>10} {'op CPU s':>9} {'op peak RSS MB':>14} "
          f"{'op idle CPU %':>13} {'held Ready':>10} {'nodes NotReady':>14}")
    for r in runs:
        print(f"{r['nodes']:>6} {r['copies']:>6} {r['pods']:>5} {r['converge_s']:>10.1f} "
              f"{r['operator']['cpu_s_during_converge']:>9.1f} {r['operator']['peak_rss_mb']:>14.1f} "
              f"{r['operator']['idle_cpu_percent_during_hold']:>13.2f} "
              f"{r['hold']['copies_ready']:>4}/{r['copies']:<5} {r['hold']['nodes_not_ready']:>14}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.write_text(json.dumps({**existing, "fleet": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
