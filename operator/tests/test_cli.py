"""The `hisparse` CLI: exit codes, error lines for people, stdin, the CRD command, node facts."""

from __future__ import annotations

import subprocess
import sys

import yaml
from opsupport import EXAMPLES, REPO

CLI = [sys.executable, "-m", "hisparse_operator.cli"]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, cwd=REPO, timeout=60)


def test_unreadable_and_non_mapping_input_exit_2():
    missing = run("validate", "no-such-file.yaml")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    garbage = run("render", "-", stdin="- just\n- a list\n")
    assert garbage.returncode == 2 and "document 1 (line 1): expected a YAML mapping" in garbage.stderr
    broken = run("validate", "-", stdin="spec: [unclosed\n")
    assert broken.returncode == 2


def test_stdin_and_multi_document_streams():
    text = (EXAMPLES / "deepseek-v32-single-node.yaml").read_text()
    two = text + "\n---\n" + text.replace("name: dsv32", "name: dsv32-b")
    result = run("render", "-", stdin=two)
    assert result.returncode == 0, result.stderr
    names = {o["metadata"]["name"] for o in yaml.safe_load_all(result.stdout)}
    assert {"dsv32-decode", "dsv32-b-decode"} <= names


def test_every_error_is_reported_not_just_the_first():
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    doc["spec"]["decode"]["enableDbo"] = True
    doc["spec"]["decode"]["speculativeConfig"] = {"method": "mtp"}
    doc["spec"]["decode"]["hisparse"]["deviceBufferSize"] = 100
    result = run("validate", "-", stdin=yaml.safe_dump(doc))
    assert result.returncode == 1
    paths = {line.split(": ")[1] for line in result.stderr.splitlines()}
    assert {"spec.decode.enableDbo", "spec.decode.speculativeConfig", "spec.decode.hisparse.deviceBufferSize"} <= paths


def test_crd_command_prints_the_committed_crd():
    result = run("crd")
    assert result.returncode == 0
    assert result.stdout == (REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml").read_text()


def test_nodes_file_checks_host_pool_against_allocatable(tmp_path):
    """Node facts (a `kubectl get nodes -o yaml` dump, written here by hand: no cluster in this test)."""
    def node(name: str, memory: str, gpus: int = 8) -> dict:
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
                "status": {"allocatable": {"memory": memory, "nvidia.com/gpu": str(gpus)}}}

    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [node("a", "700Gi"), node("b", "2Ti", gpus=0)]}))
    result = run("validate", "examples/deepseek-v32-single-node.yaml", "--nodes", str(small))
    assert result.returncode == 1
    assert "spec.decode.hisparse.hostPoolGiB" in result.stderr and "only 0 of the 1 nodes" in result.stderr
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [node("a", "2Ti")]}))
    assert run("validate", "examples/deepseek-v32-single-node.yaml", "--nodes", str(big)).returncode == 0


def test_rollout_commands_are_the_operator_s_controls() -> None:
    from typer.main import get_command

    from hisparse_operator.api import labels as L
    from hisparse_operator.cli import app

    group = get_command(app).commands["rollout"]  # type: ignore[attr-defined]
    assert set(group.commands) == {"status", *L.ROLLOUT_ACTIONS}
