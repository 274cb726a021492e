"""The images built here from the project's Dockerfiles (``hisparse dev images``): their inputs' hash, the
errors of the builder, and (slow) both images built, loaded into a containerd of the test's own with
``ctr -n k8s.io images import`` as the node loads them, and run.

A cold build of the CPU runtime image takes minutes and about 11 GB (see e2e/BENCHMARKS.md); the cache
under ``${HISPARSE_CACHE:-~/.cache/hisparse}/images`` makes a warm run seconds."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hisparse_devcluster import images
from hisparse_devcluster.images import _run, _spec
from hisparse_devcluster.images.containerd import PrivateContainerd, leftover_mounts

pytestmark = pytest.mark.host

REPO = _spec.REPO_ROOT


# ---- the plan and its hashes (no tool runs) ----------------------------------------------------------------

def test_plan_builds_each_base_before_the_images_that_start_from_it() -> None:
    order = [t.name for t in images.plan()]
    assert order.index("debian-python") < order.index("hisparse-operator")
    assert order.index("debian-python-rdma") < order.index("vllm-cpu") < order.index("hisparse-runtime-cpu")
    targets = {t.name: t for t in images.plan()}
    assert targets["hisparse-runtime-cpu"].base_refs == {"BASE_IMAGE": targets["vllm-cpu"].ref}
    assert [t.name for t in images.plan() if t.shipped] == [
        "hisparse-operator", "hisparse-runtime-cpu", "llm-d-epp", "llm-d-pd-sidecar",
        "prometheus-operator", "prometheus-config-reloader", "prometheus"]
    # llm-d's programs on their own Debian base, tagged with the release they were built from; project
    # images also get the :dev tag a local manifest names.
    assert targets["llm-d-epp"].base_refs == {"BASE": targets["debian-llmd"].ref}
    assert targets["llm-d-epp"].ref == "localhost/llm-d-epp:v0.4.0" and targets["llm-d-epp"].alias is None
    assert targets["llm-d-pd-sidecar"].ref == "localhost/llm-d-pd-sidecar:v0.5.1"
    assert targets["hisparse-runtime-cpu"].alias == "localhost/hisparse-runtime-cpu:dev"


def test_binary_image_hash_follows_the_program_and_its_base(tmp_path: Path) -> None:
    program = tmp_path / "epp"
    program.write_bytes(b"\x7fELF one build")
    image = _spec.LLMD_EPP
    before = image.input_hash(program, "base-hash")
    assert image.input_hash(program, "base-hash") == before
    assert image.input_hash(program, "other-base") != before
    program.write_bytes(b"\x7fELF another build")
    assert image.input_hash(program, "base-hash") != before


def test_lock_patterns_expand_to_every_matching_pin_once() -> None:
    args = _spec.VLLM_CPU.resolved_build_args()
    pins = _spec.lock_pins()
    cuda = args["CUDA_LIBRARY_PACKAGES"].split()
    # Pattern by pattern, each in the lock's order.
    assert cuda == [f"{n}=={v}" for prefix in ("nvidia-", "cuda-") for n, v in pins.items() if n.startswith(prefix)]
    assert len(cuda) > 20
    assert args["TORCH_PACKAGES"] == f"torch=={pins['torch']} triton=={pins['triton']}"
    bad = _spec.DockerfileImage("x", _spec.VLLM_CPU.dockerfile, "", lock_args={"A": ("nosuch-*",)})
    with pytest.raises(KeyError, match="'nosuch-\\*' is not pinned"):
        bad.resolved_build_args()


@pytest.fixture
def repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files the operator image's context reads, copied, with the catalog pointed at the copy."""
    for rel in _spec.OPERATOR.context_files() + [Path("operator/Dockerfile"), Path("requirements/test.lock")]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    monkeypatch.setattr(_spec, "REPO_ROOT", tmp_path)
    return tmp_path


def _operator_hash(root: Path) -> str:
    image = _spec.DockerfileImage("op", root / "operator" / "Dockerfile", "", bases={"PYTHON_IMAGE": "b"})
    return image.input_hash({"PYTHON_IMAGE": "base-hash"}, "wheels-hash")


def test_hash_follows_the_context_the_dockerfile_copies(repo_copy: Path) -> None:
    before = _operator_hash(repo_copy)
    assert _operator_hash(repo_copy) == before, "the hash must be stable"
    # Bytecode and in-place builds are never part of the context.
    cache = repo_copy / "operator" / "hisparse_operator" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "x.cpython-311.pyc").write_bytes(b"\0")
    (repo_copy / "kernels" / "hisparse_kernels" / "_C.so").write_bytes(b"\0")
    assert _operator_hash(repo_copy) == before
    # A file outside what the Dockerfile copies does not count.
    (repo_copy / "notes.txt").write_text("x")
    assert _operator_hash(repo_copy) == before
    module = repo_copy / "runtime" / "hisparse_runtime" / "versions.py"
    module.write_text(module.read_text() + "\n# changed\n")
    assert _operator_hash(repo_copy) != before, "a copied source changed: the image must be rebuilt"


def test_hash_follows_the_dockerfile_the_bases_and_the_wheelhouse(repo_copy: Path) -> None:
    image = _spec.DockerfileImage("op", repo_copy / "operator" / "Dockerfile", "", bases={"PYTHON_IMAGE": "b"})
    before = image.input_hash({"PYTHON_IMAGE": "base-hash"}, "wheels-hash")
    assert image.input_hash({"PYTHON_IMAGE": "other-base"}, "wheels-hash") != before
    assert image.input_hash({"PYTHON_IMAGE": "base-hash"}, "other-wheels") != before
    dockerfile = repo_copy / "operator" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=0"))
    assert image.input_hash({"PYTHON_IMAGE": "base-hash"}, "wheels-hash") != before


def test_debian_base_hash_follows_its_packages() -> None:
    base = _spec.DEBIAN_PYTHON
    assert base.input_hash() == _spec.DebianBase(base.name, base.stands_in_for, base.packages).input_hash()
    assert base.input_hash() != _spec.DebianBase(base.name, "", base.packages + ("curl",)).input_hash()


def test_copied_sources_skip_copies_between_stages_and_flags() -> None:
    dockerfile = "FROM a AS b\nCOPY --chown=1:1 x y \\\n  /dst/\nCOPY --from=b /w /w\nADD z /z\n"
    assert _spec.copied_sources(dockerfile) == ["x", "y", "z"]


def test_wheelhouse_resumes_with_the_pins_it_lacks(tmp_path: Path) -> None:
    from hisparse_devcluster.images import build

    pins = _spec.lock_pins()
    (tmp_path / f"torch-{pins['torch']}-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    (tmp_path / f"PyYAML-{pins['pyyaml']}.tar.gz").touch()
    missing = dict(build._missing_pins(tmp_path))
    assert "torch" not in missing and "pyyaml" not in missing
    assert missing["vllm"] == pins["vllm"] and "setuptools" in missing
    assert len(missing) == len(pins) + len(_spec.pins(_spec.BUILD_REQUIREMENTS)) - 2


# ---- failures: one message with the step, the cause and the fix ------------------------------------------

def test_a_missing_tool_names_the_step_the_package_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(images.ImageError) as err:
        _run.require("buildah", "mmdebstrap", step="tools")
    message = str(err.value)
    assert "image step 'tools' failed" in message and "buildah, mmdebstrap not found" in message
    assert "scripts/setup" in message and "apt-get install buildah mmdebstrap" in message


def test_a_failed_command_reports_its_exit_and_log_tail(tmp_path: Path) -> None:
    with pytest.raises(images.ImageError) as err:
        _run.run("build x", ["sh", "-c", "echo the cause is here; exit 3"], tmp_path / "x.log", fix="do this")
    assert err.value.step == "build x" and "exited 3" in err.value.cause and "the cause is here" in err.value.cause
    assert err.value.fix == "do this" and "fix: do this" in str(err.value)


def test_an_unknown_image_is_a_plan_error() -> None:
    with pytest.raises(images.ImageError, match="image step 'plan' failed: .*no image named 'nope'"):
        images.ensure(["nope"])


# ---- built, loaded into containerd, run (slow) -------------------------------------------------------------

@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateContainerd]:
    workdir = tmp_path_factory.mktemp("containerd")
    with PrivateContainerd.start(workdir) as ctd:
        yield ctd
    assert ctd.popen.poll() is not None, "containerd still runs after stop"
    assert not leftover_mounts(ctd.root, ctd.state), "containerd left mounts behind"
    assert not ctd.root.exists() and not ctd.state.exists()


def _build(name: str) -> images.BuiltImage:
    started = time.monotonic()
    built = images.ensure([name])[name]
    print(f"\n{name}: ensure {time.monotonic() - started:.1f}s (build {built.build_s}s, export {built.export_s}s, "
          f"{built.archive_bytes / 2**30:.2f} GiB)")
    assert Path(built.archive).stat().st_size == built.archive_bytes > 0
    # Warm: the inputs did not change, so the cached archive comes back with no tool run.
    started = time.monotonic()
    again = images.ensure([name])[name]
    warm = time.monotonic() - started
    print(f"{name}: warm ensure {warm:.1f}s")
    assert again == built and warm < 20, "a warm build must be a cache hit"
    return built


def _import(ctd: PrivateContainerd, built: images.BuiltImage) -> None:
    started = time.monotonic()
    assert ctd.import_image(built.archive) == [built.ref]
    print(f"{built.name}: ctr -n k8s.io images import {time.monotonic() - started:.1f}s")


def _run_ok(ctd: PrivateContainerd, ref: str, argv: list[str]) -> str:
    proc = ctd.run(ref, argv)
    assert proc.returncode == 0, f"{argv} in {ref} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.slow
def test_operator_image_builds_loads_and_runs(containerd: PrivateContainerd) -> None:
    built = _build("hisparse-operator")
    _import(containerd, built)
    assert "operator" in _run_ok(containerd, built.ref, ["hisparse", "--help"])
    # The image's user is the chart's numeric uid; the dev cluster package is not in it.
    assert _run_ok(containerd, built.ref, ["id", "-u"]).strip() == "65532"
    probe = containerd.run(built.ref, ["python", "-c", "import hisparse_devcluster"])
    assert probe.returncode != 0 and "No module named 'hisparse_devcluster'" in probe.stdout + probe.stderr
    _run_ok(containerd, built.ref, ["python", "-c", "import kopf, hisparse_operator.controller.handlers"])


@pytest.mark.slow
def test_cpu_runtime_image_builds_and_is_cached() -> None:
    """Built (and found again by its inputs' hash). Loading and running it is the real node's: the CPU
    example's pods run it (``test_e2e_cpu_example.py``), so no second ~20 GiB import happens here."""
    built = _build("hisparse-runtime-cpu")
    assert built.archive_bytes > 5 << 30, "the CPU runtime image carries vLLM, torch and NIXL"


@pytest.mark.slow
@pytest.mark.parametrize(("name", "binary", "flag"), [("llm-d-epp", "epp", "config-file"),
                                                      ("llm-d-pd-sidecar", "pd-sidecar", "connector")])
def test_llmd_images_build_load_and_run(containerd: PrivateContainerd, name: str, binary: str, flag: str) -> None:
    built = _build(name)
    _import(containerd, built)
    # The program starts and lists the flags the render passes it: the EPP's cgo libraries (libpython3.11,
    # libzmq) come from the image's base, and the image's user is not root.
    out = containerd.run(built.ref, [f"/usr/local/bin/{binary}", "--help"])
    text = out.stdout + out.stderr
    assert "error while loading shared libraries" not in text and flag in text, text[-2000:]
    assert _run_ok(containerd, built.ref, ["id", "-u"]).strip() == "65532"


def test_containerd_harness_runs_what_it_imports_only(containerd: PrivateContainerd) -> None:
    proc = containerd.run("localhost/no-such-image:x", ["true"])
    assert proc.returncode != 0 and "not found" in (proc.stdout + proc.stderr)
    assert subprocess.run(["ctr", "--address", str(containerd.socket), "version"], capture_output=True).returncode == 0
