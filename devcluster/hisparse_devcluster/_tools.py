"""Find the control-plane binaries that ``e2e/tools/build.sh`` put in the cache.

Each family's bin dir comes from ``HISPARSE_<FAMILY>_BIN`` when set, otherwise
from ``e2e/tools/build.sh --print-env`` (the script is the one place that knows
the cache layout). A missing binary is an error that says how to build it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import versions

# devcluster/hisparse_devcluster/_tools.py -> repository root
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "e2e" / "tools" / "build.sh"

# family -> (binaries, version the Python side expects)
_FAMILIES: dict[str, tuple[tuple[str, ...], str]] = {
    "kubernetes": (
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
         "kubelet", "kube-proxy", "pause"),
        versions.KUBERNETES_VERSION,
    ),
    "coredns": (("coredns",), versions.COREDNS_VERSION),
    "etcd": (("etcd",), versions.ETCD_VERSION),
    "kwok": (("kwok",), versions.KWOK_VERSION),
    "helm": (("helm",), versions.HELM_VERSION),
    "lws": (("lws-manager",), versions.LWS_VERSION),
    "prometheus": (("prometheus",), versions.PROMETHEUS_MODULE_VERSION),
    "prometheus_operator": (("prometheus-operator", "prometheus-config-reloader"),
                            versions.PROMETHEUS_OPERATOR_VERSION),
    "kube_router": (("kube-router",), versions.KUBE_ROUTER_VERSION),
}
_REQUIRED = ("kubernetes", "etcd", "kwok")
# Binaries of required families that only the real node needs: the control plane starts without them.
_NODE_ONLY = ("kubelet", "kube-proxy", "pause")


class ToolsNotBuiltError(RuntimeError):
    """A control-plane binary is missing: run ``e2e/tools/build.sh``."""


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the binaries the dev cluster runs."""

    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    etcd: Path
    kwok: Path
    helm: Path | None
    """Optional for the cluster itself; present once build.sh has built it."""
    lws_manager: Path | None = None
    """LeaderWorkerSet controller manager; needed only by ``Cluster.start(lws=True)``."""
    kubelet: Path | None = None
    """The real node's kubelet, kube-proxy, pause (the pod sandbox's init) and CoreDNS; needed only
    by :class:`~hisparse_devcluster.realnode.RealNode`."""
    kube_proxy: Path | None = None
    pause: Path | None = None
    coredns: Path | None = None
    kube_router: Path | None = None
    """The real node's NetworkPolicy enforcer (``RealNode.enforce_network_policies``)."""

    @classmethod
    def locate(cls) -> Tools:
        dirs, from_script = _bin_dirs()
        found: dict[str, Path | None] = {}
        missing: list[str] = []
        for family, (names, expected) in _FAMILIES.items():
            d = dirs.get(family)
            if d is not None and family in from_script:
                _check_version(family, d)
            for name in names:
                path = d / name if d is not None else None
                ok = path is not None and path.is_file() and os.access(path, os.X_OK)
                found[name] = path if ok else None
                if not ok and family in _REQUIRED and name not in _NODE_ONLY:
                    missing.append(str(path) if path is not None else f"{name} (no bin dir)")
        if missing:
            raise ToolsNotBuiltError(
                "control-plane binaries are missing:\n  "
                + "\n  ".join(missing)
                + f"\nBuild them with {_build_hint()} (about 15-40 minutes the first time, "
                "seconds afterwards), or point HISPARSE_<FAMILY>_BIN at existing bin dirs."
            )
        return cls(
            kube_apiserver=found["kube-apiserver"],  # type: ignore[arg-type]
            kube_controller_manager=found["kube-controller-manager"],  # type: ignore[arg-type]
            kube_scheduler=found["kube-scheduler"],  # type: ignore[arg-type]
            kubectl=found["kubectl"],  # type: ignore[arg-type]
            etcd=found["etcd"],  # type: ignore[arg-type]
            kwok=found["kwok"],  # type: ignore[arg-type]
            helm=found["helm"],
            lws_manager=found["lws-manager"],
            kubelet=found["kubelet"],
            kube_proxy=found["kube-proxy"],
            pause=found["pause"],
            coredns=found["coredns"],
            kube_router=found["kube-router"],
        )


def _check_version(family: str, d: Path) -> None:
    """build.sh names dirs <family>-<version>: one for another version than versions.py's is refused (an
    explicit HISPARSE_<FAMILY>_BIN override is trusted, so callers check only dirs build.sh named)."""
    expected = _FAMILIES[family][1]
    if not d.parent.name.endswith(f"-{expected}"):
        raise ToolsNotBuiltError(
            f"{family} bin dir {d} is not for {expected}, the version "
            "hisparse_devcluster.versions expects: keep versions.py and "
            f"e2e/tools/*/go.mod in step, then run {_build_hint()}"
        )


def _build_hint() -> str:
    return "e2e/tools/build.sh" if BUILD_SCRIPT.exists() else "the repository's e2e/tools/build.sh"


def locate_binary(family: str, name: str) -> Path:
    """One binary of one build.sh family, whether or not the other families are built yet: the chart
    tests need only Helm, which ``scripts/test`` builds first while the rest still compiles."""
    dirs, from_script = _bin_dirs((family,))
    d = dirs.get(family)
    if d is None:
        raise ToolsNotBuiltError(f"{_build_hint()} --print-env names no bin dir for the family {family!r}")
    if family in from_script and family in _FAMILIES:
        _check_version(family, d)
    path = d / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ToolsNotBuiltError(f"{path} is not built: run {_build_hint()} {family}")
    return path


def _bin_dirs(families: tuple[str, ...] = tuple(_FAMILIES)) -> tuple[dict[str, Path], set[str]]:
    """Bin dir per family, and the families whose dir came from build.sh."""
    env = {f: os.environ.get(f"HISPARSE_{f.upper()}_BIN") for f in families}
    dirs = {f: Path(v) for f, v in env.items() if v}
    from_script: set[str] = set()
    if len(dirs) == len(families) or not BUILD_SCRIPT.exists():
        return dirs, from_script
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-env"],
        capture_output=True, text=True, check=False, timeout=60,
    )
    if out.returncode != 0:
        raise ToolsNotBuiltError(f"{BUILD_SCRIPT} --print-env failed:\n{out.stderr.strip()}")
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        family = key.removeprefix("HISPARSE_").removesuffix("_BIN").lower()
        if key.endswith("_BIN") and family in families and family not in dirs:
            dirs[family] = Path(value)
            from_script.add(family)
    return dirs, from_script
