"""``hisparse render --argv`` shows what each serving pod's entrypoint will run: checked against the
entrypoint itself (``hisparse-runtime serve --dry-run`` in its own process, given the rendered ConfigMap
file and the LeaderWorkerSet environment a pod gets)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from opsupport import EXAMPLES

from hisparse_operator.pod_commands import LEADER_ADDRESS_PLACEHOLDER
from hisparse_operator.render import render

VALID = sorted(EXAMPLES.glob("*.yaml"))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hisparse_operator.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_render_argv_is_what_the_entrypoint_runs(path: Path, tmp_path: Path) -> None:
    res = _cli("render", str(path), "--argv")
    assert res.returncode == 0, res.stderr
    shown = list(yaml.safe_load_all(res.stdout))
    objects = render(yaml.safe_load(path.read_text()))
    engine = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-engine"))
    workloads = [o for o in objects if o["kind"] in ("Deployment", "LeaderWorkerSet")
                 and any(c["name"] == "vllm" for c in _template(o)["spec"]["containers"])]  # fmt: skip
    expected_pods = sum(_size(o) for o in workloads)
    assert len(shown) == expected_pods and expected_pods > 0, shown
    for pod in shown:
        role = pod["role"]
        settings = tmp_path / f"{role}.json"
        settings.write_text(engine["data"][f"{role}.json"])
        env = {"PATH": "/usr/bin:/bin"}
        if pod["workload"].startswith("LeaderWorkerSet/"):
            env.update(LWS_WORKER_INDEX=str(pod["workerIndex"]), LWS_LEADER_ADDRESS=LEADER_ADDRESS_PLACEHOLDER)
        run = subprocess.run([sys.executable, "-m", "hisparse_runtime", "serve", "--role", role, "--config", str(settings),
                              "--dry-run"], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout) == pod["argv"], f"{path.name} {pod['workload']} #{pod['workerIndex']}"
        workload = next(o for o in workloads if f"{o['kind']}/{o['metadata']['name']}" == pod["workload"])
        container = next(c for c in _template(workload)["spec"]["containers"] if c["name"] == "vllm")
        assert pod["env"] == container.get("env", [])


def test_multi_node_workers_get_their_own_argv() -> None:
    multi = [p for p in VALID if any(o["kind"] == "LeaderWorkerSet" and _size(o) > 1 for o in render(yaml.safe_load(p.read_text())))]
    assert multi, "an example with a multi-node replica"
    shown = list(yaml.safe_load_all(_cli("render", str(multi[0]), "--argv").stdout))
    lws = [p for p in shown if p["workload"].startswith("LeaderWorkerSet/")]
    assert sorted({p["workerIndex"] for p in lws}) == list(range(len({p["workerIndex"] for p in lws})))
    assert len({json.dumps(p["argv"]) for p in lws}) > 1, "the leader and a worker run different argv"


def test_an_invalid_manifest_prints_its_errors_not_argv() -> None:
    res = _cli("render", str(EXAMPLES / "invalid" / "speculative-via-spec-method.yaml"), "--argv")
    assert res.returncode == 1 and res.stdout == "" and "spec" in res.stderr


def _template(o: dict) -> dict:
    return o["spec"]["template"] if o["kind"] == "Deployment" else o["spec"]["leaderWorkerTemplate"]["workerTemplate"]


def _size(o: dict) -> int:
    return 1 if o["kind"] == "Deployment" else int(o["spec"]["leaderWorkerTemplate"].get("size") or 1)
