#!/usr/bin/env python3
"""Admission latency at thousands of KWOK nodes: the webhook reading every node live (the code before the
node watch) beside the node watch's cache, in one run on one fresh control plane. Prints a table, writes
JSON.

Each admission request is a server-side dry-run create of the single-node example (admitted), sent with
the Kubernetes client and timed by it: the apiserver, its call to the webhook and the verdict. Measured
per phase: latency p50/p99/max, requests refused (the webhook timed out or failed), node LISTs the
apiserver served during the phase (``apiserver_request_total``), and the operator's RSS. Then the
memory the node facts take per node (``tracemalloc``, in this process, from the same LIST the watch does)
beside the whole Node objects.

The live phase runs the operator of ``--live-ref`` (a git revision whose admission LISTs every node per
request) from a ``git archive`` of it; the cache phase runs this tree's.

    .venv/bin/python e2e/benchmarks/admission_bench.py [--nodes 5000] [--requests 50]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "e2e" / "tests"))
from e2e_helpers import scrape_metric as _metric  # noqa: E402
from operator_bench import _cpu, _rss_mb  # noqa: E402 (the same /proc readers as the operator benchmark)
from hisparse_devcluster import Cluster, GpuNodeSpec, Tools  # noqa: E402
from hisparse_operator.controller.cache import NodeFactsCache  # noqa: E402
from hisparse_operator.controller.nodes import list_node_facts  # noqa: E402
from kubernetes import client as k8s  # noqa: E402

CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
WEBHOOK_CONFIGURATION = "hisparsedeployments.serving.hisparse.dev"
LIVE_REF = "19b1ab9"
"""The last commit whose admission LISTs every node per request (unpaginated, through the dynamic client)."""
SOURCE_DIRS = ("operator", "runtime", "kernels", "devcluster")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _apiserver_node_lists(c: Cluster) -> float:
    status, body = c.api_get("/metrics", timeout=30)
    assert status == 200, body
    return sum(float(m.group(1)) for m in re.finditer(
        r'^apiserver_request_total\{[^}]*resource="nodes"[^}]*verb="LIST"[^}]*\} (\S+)$', body, re.M))


def _wait(what: str, check, timeout: float) -> float:
    start = time.perf_counter()
    while True:
        try:
            if check():
                return time.perf_counter() - start
        except OSError:
            pass
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.5)


def _ready_nodes(c: Cluster) -> int:
    out = c.kubectl("get", "nodes", "--no-headers", "-o",
                    "custom-columns=READY:.status.conditions[?(@.type=='Ready')].status", timeout=120).stdout
    time.sleep(3)
    return out.split().count("True")


def _os() -> str:
    try:
        return re.search(r'^PRETTY_NAME="(.*)"$', Path("/etc/os-release").read_text(), re.M).group(1)
    except (OSError, AttributeError):
        return platform.platform()


def _tree_of(ref: str, into: Path) -> list[str]:
    """The Python source folders of git revision ``ref``, unpacked into ``into``: PYTHONPATH entries."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], capture_output=True, text=True,
                         check=True).stdout.strip()
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "src.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), sha, *SOURCE_DIRS], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return [str(into / d) for d in SOURCE_DIRS]


class Operator:
    """``hisparse operator run`` in URL mode (the webhook on loopback), from the given source folders."""

    def __init__(self, c: Cluster, workdir: Path, name: str, pythonpath: list[str]) -> None:
        self.metrics_port, webhook_port = _port(), _port()
        env = {**os.environ, "KUBECONFIG": str(c.kubeconfig), "PYTHONPATH": os.pathsep.join(pythonpath),
               "HISPARSE_METRICS_PORT": str(self.metrics_port), "HISPARSE_METRICS_ADDR": "127.0.0.1",
               "HISPARSE_WEBHOOK_PORT": str(webhook_port), "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / f"{name}-certs")}
        self.proc = subprocess.Popen([sys.executable, "-m", "hisparse_operator.cli", "operator", "run"], env=env,
                                     stdout=open(workdir / f"{name}.log", "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        _wait(f"{name} operator metrics", lambda: self._alive() and _metric(self.metrics_port,
                                                                           "hisparse_operator_reconciles_total") >= 0, 120)
        _wait(f"{name} webhook configuration", lambda: c.kubectl(
            "get", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION, "--ignore-not-found", "-o", "name",
            check=False).stdout.strip() != "", 60)

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}")
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)


def _admission_latencies(custom: k8s.CustomObjectsApi, doc: dict[str, Any], n: int,
                         budget_s: float) -> tuple[list[float], list[str]]:
    """``n`` dry-run creates, one at a time (fewer if ``budget_s`` runs out): seconds each, and the
    error of each refused one."""
    times, errors = [], []
    started = time.perf_counter()
    for i in range(n):
        body = {**doc, "metadata": {**doc["metadata"], "name": f"adm-{i:04d}"}}
        t0 = time.perf_counter()
        try:
            custom.create_namespaced_custom_object("serving.hisparse.dev", "v1alpha1", doc["metadata"]["namespace"],
                                                   "hisparsedeployments", body, dry_run="All", _request_timeout=60)
        except k8s.ApiException as e:
            errors.append(f"{e.status}: {(e.body or '')[:300]}")
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - started > budget_s:
            break
    return times, errors


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _phase(c: Cluster, op: Operator, custom: k8s.CustomObjectsApi, doc: dict[str, Any], n: int,
           budget_s: float) -> dict[str, Any]:
    _admission_latencies(custom, doc, 2, budget_s)  # connections and the first validation (CEL's load)
    lists0 = _apiserver_node_lists(c)
    times, errors = _admission_latencies(custom, doc, n, budget_s)
    lists = _apiserver_node_lists(c) - lists0
    rss, hwm = _rss_mb(op.proc.pid)
    return {"requests": len(times), "refused": len(errors), "errors": sorted(set(errors))[:3],
            "p50_s": _pct(times, 0.5), "p99_s": _pct(times, 0.99), "max_s": max(times),
            "mean_s": statistics.fmean(times), "apiserver_node_lists": lists,
            "operator_rss_mb": rss, "operator_peak_rss_mb": hwm}


def _memory_per_node(core: k8s.CoreV1Api, nodes: int) -> dict[str, float]:
    """Bytes per node held by a filled :class:`NodeFactsCache` (with its snapshot), and by the whole Node
    objects as parsed JSON, measured with tracemalloc in this process."""

    def held(build) -> float:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del kept
        return (after - before) / nodes

    def facts() -> NodeFactsCache:
        cache = NodeFactsCache()
        cache.replace(list_node_facts(core)[0])
        cache.snapshot()
        return cache

    def whole() -> list[dict[str, Any]]:
        return json.loads(core.list_node(resource_version="0", _preload_content=False).data)["items"]

    return {"node_facts_cache_bytes_per_node": held(facts), "whole_node_bytes_per_node": held(whole)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--requests", type=int, default=50, help="admission requests per phase")
    ap.add_argument("--phase-budget", type=float, default=120, help="seconds of requests per phase at most")
    ap.add_argument("--live-ref", default=LIVE_REF)
    ap.add_argument("--out", type=Path, default=REPO / "e2e" / "benchmarks" / "results" / "admission.json")
    args = ap.parse_args()
    begun = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="hisparse-admission-bench-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on SIGTERM too
    live_tree = _tree_of(args.live_ref, workdir / "live-src")
    own_tree = [str(REPO / d) for d in SOURCE_DIRS]
    c = Cluster.start(workdir / "cluster", tools=Tools.locate())
    op: Operator | None = None
    result: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        spec = GpuNodeSpec()
        for start in range(0, args.nodes, 500):
            c.add_gpu_nodes(min(500, args.nodes - start), spec, nodes_per_rack=8, wait=False)
        # One listing every few seconds, not `kubectl wait` (one request per node, client-side throttled).
        _wait(f"{args.nodes} nodes Ready", lambda: _ready_nodes(c) >= args.nodes, 300)
        nodes_s = time.perf_counter() - t0
        c.kubectl("apply", "--server-side", "-f", str(CRD))
        _wait("the CRD Established", lambda: c.kubectl(
            "get", "crd/hisparsedeployments.serving.hisparse.dev", "-o",
            "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False).stdout == "True", 60)
        c.kubectl("create", "namespace", "bench")
        doc = yaml.safe_load((REPO / "examples" / "deepseek-v32-single-node.yaml").read_text())
        doc["metadata"] = {"name": "adm", "namespace": "bench"}
        api = c.client()
        custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)

        for name, tree in (("live", live_tree), ("cache", own_tree)):
            op = Operator(c, workdir, name, tree)
            if name == "cache":
                _wait("the node watch's first list",
                      lambda: _metric(op.metrics_port, "hisparse_operator_node_lists_total", reason="start") >= 1, 120)
            result[name] = _phase(c, op, custom, doc, args.requests, args.phase_budget)
            if name == "cache":
                result[name]["admission_node_facts"] = {
                    s: _metric(op.metrics_port, "hisparse_operator_admission_node_facts_total", source=s)
                    for s in ("cache", "live")}
            op.stop()
            op = None
            _wait("the webhook configuration withdrawn", lambda: c.kubectl(
                "get", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION, "--ignore-not-found", "-o", "name",
                check=False).stdout.strip() == "", 60)
        memory = _memory_per_node(core, args.nodes)
    finally:
        if op is not None:
            op.stop()
        c.stop()

    result = {
        "benchmark": "admission latency, live node LIST vs node watch cache (etcd, kube-apiserver 1.35, KWOK)",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(),
                    "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
                    "os": _os(), "kernel": platform.release(), "python": platform.python_version(),
                    "load_average_at_end": os.getloadavg()},
        "kwok_nodes": args.nodes, "nodes_created_and_ready_s": nodes_s, "live_ref": args.live_ref,
        **result, "memory": memory, "wall_s": time.perf_counter() - begun,
    }
    print(f"{'':34} {'live LIST (' + args.live_ref + ')':>20} {'node watch cache':>18}")
    for key, label, fmt in (("requests", "admission requests", "{:.0f}"), ("refused", "refused (webhook failed)", "{:.0f}"),
                            ("p50_s", "latency p50 (s)", "{:.3f}"), ("p99_s", "latency p99 (s)", "{:.3f}"),
                            ("max_s", "latency max (s)", "{:.3f}"),
                            ("apiserver_node_lists", "node LISTs served meanwhile", "{:.0f}"),
                            ("operator_peak_rss_mb", "operator peak RSS (MB)", "{:.1f}")):
        print(f"{label:34} {fmt.format(result['live'][key]):>20} {fmt.format(result['cache'][key]):>18}")
    print(f"node facts cache: {memory['node_facts_cache_bytes_per_node']:.0f} B/node; whole Node objects: "
          f"{memory['whole_node_bytes_per_node']:.0f} B/node; wall {result['wall_s']:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
