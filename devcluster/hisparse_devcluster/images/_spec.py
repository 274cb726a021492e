"""What each local image is made of, and the hash of those inputs: pure, no I/O but reading the files.

Three kinds of target, built in order:

- a Debian base (:class:`DebianBase`): a minbase root file system of Debian packages (``mmdebstrap``),
  standing in for a public base image that a registry would serve;
- a Dockerfile target (:class:`DockerfileImage`): ``buildah bud`` of a Dockerfile, its bases given as
  build arguments (so the Dockerfile users build is the one built here), pip fed from the local
  wheelhouse;
- a program ``e2e/tools/build.sh`` built, on a Debian base (:class:`BinaryImage`);
- the wheelhouse itself (``requirements/test.lock`` plus the build requirements, one wheel each).

A target's hash covers everything that can change what it builds: its recipe, the hashes of the targets
it starts from, and the content of every file its Dockerfile copies from the build context.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[3]
HERE: Final = Path(__file__).resolve().parent
BUILDER_VERSION: Final = "1"
"""Bumped when the builder itself changes what a target holds: every hash changes with it."""
LOCK: Final = REPO_ROOT / "requirements" / "test.lock"
BUILD_REQUIREMENTS: Final = HERE / "build-requirements.txt"
SKIPPED_NAMES: Final = ("__pycache__", ".pytest_cache", ".hypothesis")
SKIPPED_SUFFIXES: Final = (".pyc", ".so", ".egg-info")
"""Never part of a build context: bytecode, in-place builds of the kernels, build metadata."""


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def wheelhouse_hash() -> str:
    """The lock and the build requirements: the wheelhouse holds exactly what they pin."""
    h = hashlib.sha256()
    for path in (LOCK, BUILD_REQUIREMENTS):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def lock_pins() -> dict[str, str]:
    """``name -> version`` of every line of ``requirements/test.lock`` (names normalized as pip does)."""
    return pins(LOCK)


def pins(path: Path) -> dict[str, str]:
    """``name -> version`` of a requirements file of ``name==version`` lines."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


@dataclass(frozen=True)
class DebianBase:
    """A minbase Debian root file system with ``packages``, committed as a one-layer image."""

    name: str
    stands_in_for: str
    packages: tuple[str, ...]
    suite: str = "bookworm"
    mirrors: tuple[str, ...] = ("http://deb.debian.org/debian",
                                "deb http://deb.debian.org/debian-security bookworm-security main")
    env: tuple[tuple[str, str], ...] = (("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
                                        ("LANG", "C.UTF-8"))

    def input_hash(self) -> str:
        return _digest({"builder": BUILDER_VERSION, "kind": "debian", "packages": sorted(self.packages),
                        "suite": self.suite, "mirrors": list(self.mirrors), "env": list(self.env)})

    def ref(self) -> str:
        return f"localhost/hisparse-base/{self.name}:{self.input_hash()}"


@dataclass(frozen=True)
class DockerfileImage:
    """``buildah bud -f dockerfile`` with ``build_args``; ``bases`` maps a build argument to the target whose
    reference it receives; ``lock_args`` maps a build argument to package names pinned from the lock."""

    name: str
    dockerfile: Path
    description: str
    bases: Mapping[str, str] = field(default_factory=dict)
    build_args: Mapping[str, str] = field(default_factory=dict)
    lock_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    shipped: bool = True
    """A product image (exported as an archive for containerd); a base only lives in the build storage."""
    python_version_arg: str | None = None
    """A build argument that receives the CPython release of the Debian base (the Dockerfile labels it)."""
    layers: bool = False
    """One layer per instruction (``buildah bud --layers``) instead of one per stage: committing a layer
    costs about four times its size in transient disk, so a base of several GB is built in slices."""

    def copied_sources(self) -> list[str]:
        return copied_sources(self.dockerfile.read_text())

    def context_files(self) -> list[Path]:
        """Every file of the build context that a COPY reads, sorted, as paths relative to the repository."""
        out: set[Path] = set()
        for source in self.copied_sources():
            path = REPO_ROOT / source
            if not path.exists():
                raise FileNotFoundError(f"{self.dockerfile}: COPY source {source} does not exist")
            out.update(p.relative_to(REPO_ROOT) for p in _files(path))
        return sorted(out)

    def resolved_build_args(self) -> dict[str, str]:
        """The build arguments with the lock's pins filled in (bases excluded: they are references). A name
        with a ``*`` is a pattern (``nvidia-*``): every pin of the lock it matches, in the lock's order."""
        pins = lock_pins()
        args = dict(self.build_args)
        for arg, names in self.lock_args.items():
            chosen: list[str] = []
            for name in names:
                matched = [n for n in pins if fnmatch.fnmatchcase(n, name)] if "*" in name else \
                    [name] if name in pins else []
                if not matched:
                    raise KeyError(f"{self.name}: {name!r} is not pinned in {LOCK.relative_to(REPO_ROOT)}")
                chosen.extend(n for n in matched if n not in chosen)
            args[arg] = " ".join(f"{n}=={pins[n]}" for n in chosen)
        return args

    def input_hash(self, base_hashes: Mapping[str, str], wheels: str) -> str:
        context = hashlib.sha256()
        for rel in self.context_files():
            path = REPO_ROOT / rel
            context.update(f"{rel}\0{path.stat().st_mode & 0o111:o}\0".encode())
            context.update(hashlib.sha256(path.read_bytes()).digest())
        return _digest({"builder": BUILDER_VERSION, "kind": "dockerfile", "dockerfile": self.dockerfile.read_text(),
                        "args": self.resolved_build_args(), "layers": self.layers, "bases": dict(base_hashes), "wheelhouse": wheels,
                        "context": context.hexdigest()})


@dataclass(frozen=True)
class BinaryImage:
    """A program ``e2e/tools/build.sh`` built (family ``family``, binary ``binary``) as an image of its own:
    the binary at ``/usr/local/bin/<binary>`` on the Debian base ``base``, run as ``user``. Tagged with the
    version of the module it was built from, as upstream tags its release images."""

    name: str
    family: str
    binary: str
    base: str
    description: str
    user: str = "65532:65532"
    shipped: bool = True
    install_dir: str = "/usr/local/bin"
    """Where the program goes, for upstream code that runs it by an absolute path of its release image."""

    @property
    def path(self) -> str:
        return f"{self.install_dir}/{self.binary}"

    def input_hash(self, binary: Path, base_hash: str) -> str:
        payload = {"builder": BUILDER_VERSION, "kind": "binary", "name": self.name, "user": self.user,
                   "base": base_hash, "binary": hashlib.sha256(binary.read_bytes()).hexdigest()}
        if self.install_dir != "/usr/local/bin":  # the hashes of images built before the field stay the same
            payload["path"] = self.path
        return _digest(payload)


def _files(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    for p in sorted(path.rglob("*")):
        rel_parts = p.relative_to(path).parts
        if any(part in SKIPPED_NAMES or part.endswith(SKIPPED_SUFFIXES) for part in rel_parts):
            continue
        if p.is_file():
            yield p


def copied_sources(dockerfile: str) -> list[str]:
    """Build-context paths the COPY/ADD instructions read (copies between stages excluded)."""
    sources: list[str] = []
    for line in re.sub(r"\\\n", " ", dockerfile).splitlines():
        words = line.strip().split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = words[1:]
        if any(a.startswith("--from") for a in args):
            continue
        paths = [a for a in args if not a.startswith("--")]
        sources.extend(paths[:-1])
    return sources


# ---- the catalog ---------------------------------------------------------------------------------------

DEBIAN_PYTHON: Final = DebianBase(
    name="debian-python",
    stands_in_for="python:3.11-slim-bookworm",
    # What the slim image offers that the operator's Dockerfile uses: python (and venv), groupadd/useradd.
    packages=("python3", "python3-venv", "python-is-python3", "passwd", "ca-certificates"),
)
DEBIAN_PYTHON_RDMA: Final = DebianBase(
    name="debian-python-rdma",
    stands_in_for="the OS layers of vllm/vllm-openai",
    # Mooncake's transfer engine links libibverbs/librdmacm even for TCP; NIXL's UCX loads them if present.
    packages=DEBIAN_PYTHON.packages + ("libibverbs1", "librdmacm1"),
)
DEBIAN_LLMD: Final = DebianBase(
    name="debian-llmd",
    stands_in_for="the distroless/UBI bases of llm-d's release images",
    # The EPP is a cgo build that links Debian's libpython3.11 (its tokenizer bridge) and libzmq; the sidecar
    # is static and needs nothing.
    packages=("libpython3.11", "libzmq5", "ca-certificates"),
)
DEBIAN_STATIC: Final = DebianBase(
    name="debian-static",
    stands_in_for="the busybox/distroless bases of the Prometheus Operator's and Prometheus's release images",
    # Static Go programs (Prometheus, the Prometheus Operator and its config reloader) need only CA certificates.
    packages=("ca-certificates",),
)
BASES: Final = {b.name: b for b in (DEBIAN_PYTHON, DEBIAN_PYTHON_RDMA, DEBIAN_LLMD, DEBIAN_STATIC)}

VLLM_CPU: Final = DockerfileImage(
    name="vllm-cpu",
    dockerfile=HERE / "vllm-cpu.Dockerfile",
    description="stand-in for vllm/vllm-openai: vLLM's Python package, torch, NIXL, Mooncake; no CUDA toolkit",
    bases={"PYTHON_IMAGE": DEBIAN_PYTHON_RDMA.name},
    # Three slices of about 3 GB each (see ``layers``): the CUDA libraries torch and vLLM's kernels load at
    # import, torch with triton, then vLLM and the rest. All exact pins of the lock.
    lock_args={"CUDA_LIBRARY_PACKAGES": ("nvidia-*", "cuda-*"), "TORCH_PACKAGES": ("torch", "triton"),
               "PACKAGES": ("vllm", "torch", "mooncake-transfer-engine-non-cuda"), "NO_DEPS_PACKAGES": ("nixl-cu12",)},
    shipped=False,
    layers=True,
)
OPERATOR: Final = DockerfileImage(
    name="hisparse-operator",
    dockerfile=REPO_ROOT / "operator" / "Dockerfile",
    description="the operator image (operator/Dockerfile) on the Debian Python base",
    bases={"PYTHON_IMAGE": DEBIAN_PYTHON.name},
    python_version_arg="PYTHON_VERSION",
)
RUNTIME_CPU: Final = DockerfileImage(
    name="hisparse-runtime-cpu",
    dockerfile=REPO_ROOT / "runtime" / "Dockerfile",
    description="the runtime image (runtime/Dockerfile) on the vLLM CPU base, without compiled CUDA kernels",
    bases={"BASE_IMAGE": VLLM_CPU.name},
    build_args={"TORCH_CUDA_ARCH_LIST": ""},
)
DOCKERFILE_IMAGES: Final = {i.name: i for i in (VLLM_CPU, OPERATOR, RUNTIME_CPU)}
LLMD_EPP: Final = BinaryImage(name="llm-d-epp", family="llmd", binary="epp", base=DEBIAN_LLMD.name,
                              description="llm-d's endpoint picker (cmd/epp), built here from its Go module")
LLMD_SIDECAR: Final = BinaryImage(name="llm-d-pd-sidecar", family="llmd_sidecar", binary="pd-sidecar",
                                  base=DEBIAN_LLMD.name,
                                  description="llm-d's P/D routing sidecar (cmd/pd-sidecar), built here from its Go module")
PROMETHEUS_OPERATOR: Final = BinaryImage(
    name="prometheus-operator", family="prometheus_operator", binary="prometheus-operator", base=DEBIAN_STATIC.name,
    description="the Prometheus Operator (cmd/operator), built here from its Go module")
PROMETHEUS_CONFIG_RELOADER: Final = BinaryImage(
    name="prometheus-config-reloader", family="prometheus_operator", binary="prometheus-config-reloader",
    base=DEBIAN_STATIC.name,
    # The operator runs it as /bin/prometheus-config-reloader; /bin is /usr/bin on Debian 12 (merged /usr).
    install_dir="/usr/bin",
    description="the Prometheus Operator's config reloader (cmd/prometheus-config-reloader), built here from its Go module")
PROMETHEUS: Final = BinaryImage(
    name="prometheus", family="prometheus", binary="prometheus", base=DEBIAN_STATIC.name,
    # Debian 12's prometheus package is built without Kubernetes service discovery, which every
    # configuration the operator generates uses; so Prometheus is built from its Go module too.
    description="Prometheus (cmd/prometheus, API only: no web UI assets), built here from its Go module")
BINARY_IMAGES: Final = {i.name: i for i in (LLMD_EPP, LLMD_SIDECAR, PROMETHEUS_OPERATOR, PROMETHEUS_CONFIG_RELOADER,
                                            PROMETHEUS)}
SHIPPED: Final = tuple(name for name, i in {**DOCKERFILE_IMAGES, **BINARY_IMAGES}.items() if i.shipped)
SHORT_NAMES: Final = {"operator": OPERATOR.name, "runtime": RUNTIME_CPU.name, "epp": LLMD_EPP.name,
                      "sidecar": LLMD_SIDECAR.name, "prometheus-operator": PROMETHEUS_OPERATOR.name,
                      "prometheus-config-reloader": PROMETHEUS_CONFIG_RELOADER.name, "prometheus": PROMETHEUS.name}
"""What ``hisparse dev images --only`` accepts."""
DEV_TAG: Final = "dev"
"""Every project image is also tagged ``localhost/<name>:dev`` where it is loaded, so a manifest (such as
``examples/cpu-tiny.yaml``) can name the newest local build."""


def tool_binary(family: str, binary: str) -> Path:
    """Where build.sh put ``binary`` of ``family`` (nothing is built)."""
    from .._tools import ToolsNotBuiltError, locate_binary

    try:
        return locate_binary(family, binary)
    except ToolsNotBuiltError as e:
        raise FileNotFoundError(str(e)) from e


@dataclass(frozen=True)
class Target:
    """One step of a plan: a base or an image, with the hash of its inputs and the reference it gets."""

    name: str
    spec: DebianBase | DockerfileImage | BinaryImage
    input_hash: str
    base_refs: Mapping[str, str]
    binary: Path | None = None
    """A :class:`BinaryImage`'s program."""
    version: str | None = None
    """A :class:`BinaryImage`'s tag: the version of the module its program was built from."""

    @property
    def ref(self) -> str:
        if isinstance(self.spec, DebianBase):
            return self.spec.ref()
        if isinstance(self.spec, BinaryImage):
            return f"localhost/{self.name}:{self.version}"
        prefix = "localhost/" if self.spec.shipped else "localhost/hisparse-base/"
        return f"{prefix}{self.name}:{self.input_hash}"

    @property
    def alias(self) -> str | None:
        """The ``:dev`` tag of a project image (none for upstream programs: their tag is their release)."""
        return f"localhost/{self.name}:{DEV_TAG}" if isinstance(self.spec, DockerfileImage) and self.shipped else None

    @property
    def shipped(self) -> bool:
        return isinstance(self.spec, (DockerfileImage, BinaryImage)) and self.spec.shipped


def plan(names: tuple[str, ...] = SHIPPED) -> list[Target]:
    """Every target the images ``names`` need, each after the ones it starts from."""
    wheels = wheelhouse_hash()
    done: dict[str, Target] = {}

    def visit(name: str) -> Target:
        if name in done:
            return done[name]
        if name in BASES:
            base = BASES[name]
            target = Target(name, base, base.input_hash(), {})
        elif name in BINARY_IMAGES:
            image = BINARY_IMAGES[name]
            parent = visit(image.base)
            binary = tool_binary(image.family, image.binary)
            target = Target(name, image, image.input_hash(binary, parent.input_hash), {"BASE": parent.ref},
                            binary=binary, version=binary.parent.parent.name.rpartition("-")[2])
        else:
            image = DOCKERFILE_IMAGES[name]
            parents = {arg: visit(dep) for arg, dep in image.bases.items()}
            target = Target(name, image, image.input_hash({a: t.input_hash for a, t in parents.items()}, wheels),
                            {a: t.ref for a, t in parents.items()})
        done[name] = target
        return target

    for name in names:
        if name not in DOCKERFILE_IMAGES and name not in BINARY_IMAGES and name not in BASES:
            raise KeyError(f"no image named {name!r}: choose from {sorted({**DOCKERFILE_IMAGES, **BINARY_IMAGES})}")
        visit(name)
    return list(done.values())
