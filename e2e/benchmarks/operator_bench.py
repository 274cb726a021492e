#!/usr/bin/env python3
"""Operator benchmark on a real local control plane (KWOK GPU nodes). Prints a table, writes JSON.

Measured in one run, on one fresh cluster:
- apply -> Ready latency of single HiSparseDeployments applied one at a time (p50/p99);
- N deployments applied at once: time until every one is Ready, beside the same objects written
  directly by one server-side apply of `hisparse render` output into other namespaces, with the
  operator stopped (the raw apiserver + controller-manager + KWOK cost of those objects), and the ratio;
- API writes per no-op reconcile (every resource touched once after convergence; target 0);
- operator peak RSS (before the raw phase).

Waiting for the batches is one ``kubectl get --watch`` stream each, not a listing every half second:
on 2 cores a full listing of hundreds of objects twice a second (a kubectl process, the apiserver's
serialisation) took CPU from the very processes being measured.

    .venv/bin/python e2e/benchmarks/operator_bench.py [--count 200] [--single 20]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator"))
from hisparse_devcluster import Cluster, GpuNodeSpec, Tools  # noqa: E402
from hisparse_operator.render import render  # noqa: E402

CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"


def bench_manifest(namespace: str, name: str) -> dict[str, Any]:
    """The single-node example shrunk to one GPU per role, so hundreds fit on a few KWOK nodes."""
    doc = yaml.safe_load((REPO / "examples" / "deepseek-v32-single-node.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["prefill"]["parallelism"] = {"gpusPerNode": 1, "tensorParallelSize": 1}
    doc["spec"]["decode"]["parallelism"] = {"gpusPerNode": 1, "dataParallelSize": 1, "dataParallelSizeLocal": 1}
    doc["spec"]["decode"]["hisparse"] = {"hostPoolGiB": 32}
    doc["spec"]["decode"]["resources"]["requests"] = {"cpu": "4", "memory": "128Gi"}
    doc["spec"]["prefill"]["resources"]["requests"] = {"cpu": "4", "memory": "64Gi"}
    doc["spec"]["monitoring"] = {"enabled": False}
    return doc


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def _ready_names(c: Cluster) -> set[tuple[str, str]]:
    items = json.loads(c.kubectl("get", "hsd", "-A", "-o", "json", timeout=300).stdout)["items"]
    out = set()
    for i in items:
        conds = {x["type"]: x["status"] for x in (i.get("status") or {}).get("conditions", [])}
        if conds.get("Ready") == "True":
            out.add((i["metadata"]["namespace"], i["metadata"]["name"]))
    return out


def _all_available(value: str) -> bool:
    """``available/desired`` as the Deployment watch prints it."""
    have, _, want = value.partition("/")
    return want.isdigit() and int(want) > 0 and have.isdigit() and int(have) >= int(want)


class Watch:
    """One ``kubectl get --watch`` whose jsonpath prints ``KEY VALUE`` per event: the latest value per key
    and when it last changed, without a listing per check."""

    def __init__(self, c: Cluster, *args: str, template: str) -> None:
        self.latest: dict[str, tuple[str, float]] = {}
        self._proc = subprocess.Popen([str(c.kubectl_path), f"--kubeconfig={c.kubeconfig}", "get", *args, "--watch",
                                       "-o", f"jsonpath={template}{{\"\\n\"}}"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            key, _, value = line.strip().partition(" ")
            with self._lock:
                if key and self.latest.get(key, ("",))[0] != value:
                    self.latest[key] = (value, time.perf_counter())

    def keys_where(self, ok) -> set[str]:
        with self._lock:
            return {k for k, (v, _) in self.latest.items() if ok(v)}

    def keys(self, value: str) -> set[str]:
        return self.keys_where(lambda v: v == value)

    def last_change(self, keys: set[str]) -> float:
        """``time.perf_counter()`` when the last of ``keys`` last changed."""
        with self._lock:
            return max(self.latest[k][1] for k in keys)

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)


def _wait(what: str, check, timeout: float) -> float:
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.5)
    return time.perf_counter() - start


def _rss_mb(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    get = lambda key: int(re.search(rf"^{key}:\s+(\d+) kB", status, re.M).group(1)) / 1024  # noqa: E731
    return get("VmRSS"), get("VmHWM")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def start_operator(c: Cluster, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Install our CRD in ``c`` and start ``hisparse operator run`` against it, its metrics on a free
    loopback port and its log in ``workdir``; returns once it serves metrics, with that port."""
    c.kubectl("apply", "--server-side", "-f", str(CRD))
    # Not `kubectl wait`: it fails at once while the new CRD has no status yet (a loaded apiserver).
    _wait("the CRD Established", lambda: c.kubectl(
        "get", "crd/hisparsedeployments.serving.hisparse.dev", "-o",
        "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False).stdout == "True", 60)
    mport = _port()
    env = {**os.environ, "KUBECONFIG": str(c.kubeconfig), "HISPARSE_METRICS_PORT": str(mport),
           "HISPARSE_METRICS_ADDR": "127.0.0.1"}
    op = subprocess.Popen([sys.executable, "-m", "hisparse_operator.cli", "operator", "run"], env=env,
                          stdout=open(workdir / "operator.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    _wait("operator metrics", lambda: _try(lambda: _metric(mport, "hisparse_operator_reconciles_total") >= 0), 60)
    return op, mport


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--single", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=REPO / "e2e" / "benchmarks" / "results" / "operator.json")
    args = ap.parse_args()
    gpus_needed = 2 * (2 * args.count + args.single)
    workdir = Path(tempfile.mkdtemp(prefix="hisparse-bench-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on SIGTERM too
    c = Cluster.start(workdir, tools=Tools.locate())
    op = None
    try:
        # 8-GPU nodes, about a hundred: KWOK keeps their liveness in node Leases (see devcluster).
        spec = GpuNodeSpec()
        count = gpus_needed // spec.gpus + 2
        for start in range(0, count, 200):
            c.add_gpu_nodes(min(200, count - start), spec, nodes_per_rack=8)
        op, mport = start_operator(c, workdir)

        # 1. one at a time
        c.kubectl("create", "namespace", "single")
        single = []
        for i in range(args.single):
            doc = bench_manifest("single", f"s{i:03d}")
            start = time.perf_counter()
            c.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
            _wait(f"s{i} Ready", lambda: ("single", doc["metadata"]["name"]) in _ready_names(c), args.timeout)
            single.append(time.perf_counter() - start)

        # 2. many at once, through the operator
        docs = [bench_manifest(f"op{i // 50}", f"d{i:03d}") for i in range(args.count)]
        for ns in sorted({d["metadata"]["namespace"] for d in docs}):
            c.kubectl("create", "namespace", ns)
        want = {f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in docs}
        ready = Watch(c, "hsd", "-A", template='{.metadata.namespace}/{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}')
        t0 = time.perf_counter()
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), timeout=600)
        operator_apply_s = time.perf_counter() - t0
        _wait(f"{args.count} Ready", lambda: want <= ready.keys("True"), args.timeout)
        operator_s = ready.last_change(want) - t0
        ready.close()
        # The apiserver's own record of when each became Ready (1 s resolution): latency per resource.
        items = json.loads(c.kubectl("get", "hsd", "-A", "-o", "json", timeout=300).stdout)["items"]
        batch_latency = []
        for i in items:
            if i["metadata"]["namespace"].startswith("op"):
                created = datetime.datetime.fromisoformat(i["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
                cond = next(x for x in i["status"]["conditions"] if x["type"] == "Ready")
                done = datetime.datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))
                batch_latency.append((done - created).total_seconds())

        # 3. no-op reconciles: touch every resource once, count writes
        time.sleep(5)
        writes0 = _metric(mport, "hisparse_operator_api_writes_total")
        rec0 = _metric(mport, "hisparse_operator_reconciles_total")
        for ns in sorted({d["metadata"]["namespace"] for d in docs}):
            c.kubectl("annotate", "hsd", "--all", "-n", ns, "bench/touched=1", "--overwrite", timeout=300)
        _wait("reconciles of the touched resources", lambda: _metric(mport, "hisparse_operator_reconciles_total") - rec0 >= args.count, 300)
        time.sleep(5)
        noop_writes = _metric(mport, "hisparse_operator_api_writes_total") - writes0
        noop_reconciles = _metric(mport, "hisparse_operator_reconciles_total") - rec0
        rss, hwm = _rss_mb(op.pid)
        # The raw copies carry the operator's managed-by label: a running operator would watch, cache and
        # try to reconcile them, i.e. take part in the very measurement meant to leave it out.
        os.killpg(op.pid, signal.SIGTERM)
        op.wait(60)
        op = None

        # 4. the same objects written directly (other namespaces, no owner, no operator running)
        raw = []
        for d in docs:
            d = json.loads(json.dumps(d))
            d["metadata"]["namespace"] = d["metadata"]["namespace"].replace("op", "raw")
            raw += render(d)
        for ns in sorted({o["metadata"]["namespace"] for o in raw}):
            c.kubectl("create", "namespace", ns)
        raw_want = {f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in raw if o["kind"] == "Deployment"}
        available = Watch(c, "deployments", "-A", "-l", "app.kubernetes.io/managed-by=hisparse-operator",
                          template="{.metadata.namespace}/{.metadata.name} {.status.availableReplicas}/{.spec.replicas}")
        t0 = time.perf_counter()
        # JSON, not YAML: PyYAML writes a hash such as 1234567e12 unquoted, and kubectl reads it as a number.
        c.kubectl("apply", "--server-side", "--field-manager=bench", "-f", "-", timeout=900,
                  input=json.dumps({"apiVersion": "v1", "kind": "List", "items": raw}))
        raw_apply_s = time.perf_counter() - t0
        _wait("raw Deployments available", lambda: raw_want <= available.keys_where(_all_available), args.timeout)
        raw_s = available.last_change(raw_want) - t0
        available.close()
    finally:
        if op is not None:
            os.killpg(op.pid, signal.SIGTERM)
            op.wait(60)
        c.stop()

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]

    result = {
        "benchmark": "operator on a local control plane (etcd, kube-apiserver 1.35, controller-manager, scheduler, KWOK)",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "python": platform.python_version()},
        "kwok_nodes": {"count": count, "gpus_each": spec.gpus},
        "single_apply_to_ready_s": {"n": len(single), "p50": pct(single, 0.5), "p99": pct(single, 0.99), "max": max(single)},
        "batch": {"count": args.count, "operator_converge_s": operator_s, "raw_ssa_converge_s": raw_s,
                  "operator_kubectl_apply_s": operator_apply_s, "raw_kubectl_apply_s": raw_apply_s,
                  "ratio_operator_vs_raw": operator_s / raw_s, "target_converge_s": 60, "target_ratio": 1.5,
                  "apply_to_ready_s": {"p50": pct(batch_latency, 0.5), "p99": pct(batch_latency, 0.99)}},
        "noop": {"reconciles": noop_reconciles, "api_writes": noop_writes,
                 "writes_per_reconcile": noop_writes / max(noop_reconciles, 1), "target": 0},
        "operator_rss_mb": {"current": rss, "peak": hwm, "target": 150},
    }
    print(f"{'measure':44} {'value':>12} {'target':>10}")
    rows = [
        ("single apply->Ready p50 (s)", result["single_apply_to_ready_s"]["p50"], ""),
        ("single apply->Ready p99 (s)", result["single_apply_to_ready_s"]["p99"], ""),
        (f"{args.count} at once, operator converge (s)", operator_s, "< 60"),
        (f"{args.count} at once, raw SSA converge (s)", raw_s, ""),
        ("ratio operator / raw", operator_s / raw_s, "<= 1.5"),
        ("batch apply->Ready p50 / p99 (s)", f"{result['batch']['apply_to_ready_s']['p50']:.0f} / {result['batch']['apply_to_ready_s']['p99']:.0f}", ""),
        ("API writes per no-op reconcile", result["noop"]["writes_per_reconcile"], "0"),
        ("operator peak RSS (MB)", hwm, "< 150"),
    ]
    for name, value, target in rows:
        v = f"{value:12.2f}" if isinstance(value, float) else f"{value!s:>12}"
        print(f"{name:44} {v} {target:>10}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # fleet_bench.py keeps its figures under "fleet" in the same file.
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.write_text(json.dumps({**({"fleet": existing["fleet"]} if "fleet" in existing else {}), **result},
                                   indent=2) + "\n")


def _try(fn) -> bool:
    try:
        return bool(fn())
    except OSError:
        return False


if __name__ == "__main__":
    main()
