"""Every documented example renders to its golden file; every invalid example is refused with its
field path and message, by the model (``validate``) and by the CLI."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import yaml

from hisparse_operator.api import validate
from hisparse_operator.render import InvalidSpec, render

from opsupport import INVALID_EXAMPLES, REPO, VALID_EXAMPLES, invalid_example

GOLDEN = REPO / "operator" / "tests" / "golden"
CLI = [sys.executable, "-m", "hisparse_operator.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed CLI as a user runs it: a process of its own (the valid examples go through this)."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def _cli_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """The same command through the CLI's own app in this process (click's runner: its exit code, stdout and
    stderr apart), so the 87 invalid examples do not each pay a Python start and the imports."""
    from typer.testing import CliRunner

    from hisparse_operator.cli import app

    res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_render_matches_golden(path):
    result = _cli("render", str(path.relative_to(REPO)))
    assert result.returncode == 0, result.stderr
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(result.stdout)
    assert golden.exists(), f"no golden file for {path.name}: run with UPDATE_GOLDEN=1 and review it"
    assert result.stdout == golden.read_text(), f"render output of {path.name} changed; review and UPDATE_GOLDEN=1"


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_cli_render_equals_library_render(path):
    """The CLI prints exactly the objects the operator would apply."""
    result = _cli("render", str(path))
    assert list(yaml.safe_load_all(result.stdout)) == render(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=lambda p: p.stem)
def test_valid_examples_validate(path):
    result = _cli("validate", str(path))
    assert result.returncode == 0 and "valid" in result.stdout, result.stderr


def test_there_are_invalid_examples():
    assert len(INVALID_EXAMPLES) >= 20


def test_an_invalid_example_is_refused_by_the_cli_process_as_in_process():
    """The in-process runner the invalid examples use agrees with the CLI's own process, exit code and
    output, for one of them."""
    path = INVALID_EXAMPLES[0]
    for command in ("validate", "render"):
        alone, here = _cli(command, str(path)), _cli_in_process(command, str(path))
        assert (alone.returncode, alone.stdout, alone.stderr) == (here.returncode, here.stdout, here.stderr), command
        assert alone.returncode == 1


@pytest.mark.parametrize("path", INVALID_EXAMPLES, ids=lambda p: p.stem)
def test_invalid_example_rejected_by_model(path):
    ex = invalid_example(path)
    _, errors = validate(ex.manifest)
    assert errors, f"{path.name} was accepted"
    hits = [e for e in errors if e.path == ex.expected_path]
    assert hits, f"{path.name}: no error at {ex.expected_path}; got {[str(e) for e in errors]}"
    assert any(ex.expected_message in e.message for e in hits), [str(e) for e in hits]
    with pytest.raises(InvalidSpec) as raised:
        render(ex.manifest)
    assert ex.expected_path in str(raised.value)


@pytest.mark.parametrize("path", INVALID_EXAMPLES, ids=lambda p: p.stem)
def test_invalid_example_rejected_by_cli(path):
    ex = invalid_example(path)
    result = _cli_in_process("validate", str(path))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert any(f": {ex.expected_path}: " in line and ex.expected_message in line for line in lines), result.stderr
    rendered = _cli_in_process("render", str(path))
    assert rendered.returncode == 1 and rendered.stdout == "", "an invalid resource must render nothing"


@pytest.mark.parametrize("prefill", [None], ids=["no-prefill-role"])
def test_the_pool_targets_the_port_decode_serves_on_without_prefill(prefill):
    """Without prefill, decode has no llm-d sidecar: the InferencePool (and the serving Service) must
    target the port its vLLM listens on, not the sidecar's."""
    doc = yaml.safe_load((REPO / "examples" / "deepseek-v32-single-node.yaml").read_text())
    del doc["spec"]["prefill"]
    objs = render(doc)
    decode = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-decode"))
    pod = decode["spec"]["template"]["spec"]
    listening = {p["containerPort"] for c in pod["containers"] + pod.get("initContainers", []) for p in c.get("ports", [])}
    pool = next(o for o in objs if o["kind"] == "InferencePool")
    serving = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-serving"))
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [8200] and 8200 in listening
    assert serving["spec"]["ports"][0]["targetPort"] in listening
    # No sidecar to front port 8000 (the example's PodEphemeral model cache adds only its fetch-model init container).
    assert [c["name"] for c in pod.get("initContainers", [])] == ["fetch-model"]


def test_scaling_prefill_to_zero_is_refused_and_decode_keeps_its_template():
    """Prefill replicas 0 is refused (it would rewrite decode's pod template outside the canary gate);
    scaling prefill between non-zero counts leaves decode's template and the revision unchanged."""
    doc = yaml.safe_load((REPO / "examples" / "deepseek-v32-single-node.yaml").read_text())
    def decode_template(replicas: int) -> dict:
        d = copy.deepcopy(doc)
        d["spec"]["prefill"]["replicas"] = replicas
        objs = render(d)
        return next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-decode"))["spec"]["template"]
    assert decode_template(1) == decode_template(3)
    zero = copy.deepcopy(doc)
    zero["spec"]["prefill"]["replicas"] = 0
    _, errors = validate(zero)
    assert [e.path for e in errors] == ["spec.prefill.replicas"] and "remove spec.prefill" in errors[0].message
