#!/usr/bin/env python3
"""CPU example benchmark: ``kubectl apply`` of ``examples/cpu-tiny.yaml`` -> Ready on the real node, and
the start of a replacement serving pod. Prints a table, writes JSON.

On a fresh local control plane with the real node and the operator (as a host process, so that its own
start is not counted): the images are built or taken from the cache and imported into the node
(``cpu_example.prepare``, timed), then the example is applied and followed until Ready: per serving role,
pod created -> Running (the kubelet, containerd, the image present) and Running -> Ready (the entrypoint's
preflight, the CPU engine's start, and for decode the readiness probe's NIXL read and completion). Then
``--restarts`` times a decode pod is deleted and its replacement timed from the delete to Ready again,
which is what a rolling update or a node drain costs per pod.

    .venv/bin/python e2e/benchmarks/cpu_example_bench.py [--restarts 1]

The result goes to e2e/benchmarks/results/cpu_example.json. A benchmark, not a test: 10-20 minutes on 2
cores, most of it the serving pods' start.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / d) for d in ("operator", "runtime", "kernels", "devcluster", "e2e/tests", "e2e/benchmarks")]

from e2e_helpers import OperatorProcess, apply_crds, eventually, free_port, get_json  # noqa: E402
from hisparse_devcluster import Cluster, Tools, cpu_example  # noqa: E402
from hisparse_devcluster.realnode import RealNode  # noqa: E402
from realnode_bench import machine, report  # noqa: E402

CRD = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
ROLES = ("prefill", "decode")


def _ts(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _condition_time(pod: dict[str, Any], kind: str) -> float | None:
    for c in pod.get("status", {}).get("conditions", []):
        if c["type"] == kind and c["status"] == "True":
            return _ts(c["lastTransitionTime"])
    return None


def _pod_phases(pod: dict[str, Any]) -> dict[str, float]:
    """Seconds from the pod's creation to its vLLM container running and to the pod Ready (the apiserver's
    timestamps have one-second resolution)."""
    created = _ts(pod["metadata"]["creationTimestamp"])
    vllm = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "vllm")
    running = _ts(vllm["state"]["running"]["startedAt"])
    ready = _condition_time(pod, "Ready")
    assert ready is not None, pod["metadata"]["name"]
    return {"created_to_running_s": running - created, "running_to_ready_s": ready - running}


def _pods(c: Cluster, ns: str, name: str, role: str) -> list[dict[str, Any]]:
    return get_json(c, "pods", "-n", ns, "-l",
                    f"serving.hisparse.dev/role={role},serving.hisparse.dev/deployment={name}")["items"]


def _ready(c: Cluster, ns: str, name: str) -> bool:
    st = get_json(c, "hsd", name, "-n", ns).get("status") or {}
    return any(x["type"] == "Ready" and x["status"] == "True" for x in st.get("conditions", []))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--restarts", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, default=REPO / "e2e" / "benchmarks" / "results" / "cpu_example.json")
    args = ap.parse_args()
    doc = cpu_example.example_doc()
    name, ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
    tools = Tools.locate()
    result: dict[str, Any] = {"date": datetime.date.today().isoformat(), "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="cpu-example-bench-") as tmp, \
            Cluster.start(Path(tmp) / "cluster", tools=tools) as c:
        node = RealNode(c, tools=tools).start()
        op = None
        try:
            t0 = time.monotonic()
            cpu_example.prepare(c, node)
            result["prepare_s"] = round(time.monotonic() - t0, 1)  # images built or cached, then imported
            apply_crds(c, CRD)
            work = Path(tmp) / "operator"
            work.mkdir()
            op = OperatorProcess(c, work, env={"HISPARSE_WEBHOOK_PORT": str(free_port()),
                                               "HISPARSE_WEBHOOK_CERT_DIR": str(work / "certs")})
            op.spawn()
            op.wait_serving()
            t0 = time.monotonic()
            c.kubectl("apply", "-f", str(cpu_example.EXAMPLE))
            eventually(lambda: _ready(c, ns, name), what=f"{name} Ready", timeout=args.timeout)
            result["apply_to_ready_s"] = round(time.monotonic() - t0, 1)
            result["first_start"] = {role: {k: round(v, 1) for k, v in _pod_phases(_pods(c, ns, name, role)[0]).items()}
                                     for role in ROLES}
            restarts = []
            for _ in range(args.restarts):
                (old,) = _pods(c, ns, name, "decode")
                t0 = time.monotonic()
                c.kubectl("delete", "pod", "-n", ns, old["metadata"]["name"], "--wait=false")

                def replaced() -> dict[str, Any] | None:
                    new = [p for p in _pods(c, ns, name, "decode") if p["metadata"]["uid"] != old["metadata"]["uid"]
                           and _condition_time(p, "Ready") is not None]
                    return new[0] if new else None

                pod = eventually(replaced, what="a replacement decode pod Ready", timeout=args.timeout)
                restarts.append({"delete_to_ready_s": round(time.monotonic() - t0, 1),
                                 **{k: round(v, 1) for k, v in _pod_phases(pod).items()}})
            result["decode_replacements"] = restarts
        finally:
            if op is not None:
                c.kubectl("delete", "hsd", name, "-n", ns, "--wait=true", "--timeout=120s", check=False)
                op.stop()
            node.stop()
    rows = [("images built or cached, imported into the node (prepare)", f"{result['prepare_s']:.0f} s"),
            ("kubectl apply -> Ready (both roles serving, decode's data path proven)", f"{result['apply_to_ready_s']:.0f} s")]
    for role in ROLES:
        p = result["first_start"][role]
        rows.append((f"{role}: pod created -> vLLM container running / running -> Ready",
                     f"{p['created_to_running_s']:.0f} s / {p['running_to_ready_s']:.0f} s"))
    for i, r in enumerate(result["decode_replacements"], 1):
        rows.append((f"decode pod deleted -> replacement Ready ({i})", f"{r['delete_to_ready_s']:.0f} s"))
    report(rows, result, args.out)


if __name__ == "__main__":
    main()
