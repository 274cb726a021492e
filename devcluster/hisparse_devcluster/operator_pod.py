"""The operator as a pod on the real node: the operator image built here, imported into the node's
containerd, and ``charts/hisparse`` installed by Helm with that image and the node's placement.

    release = OperatorRelease(cluster)
    ref = release.load_image(node)                # images.ensure + RealNode.import_image
    release.install(ref)                          # helm upgrade --install ... --wait; webhook answering
    release.pods(); release.logs()
    release.install(ref, {"resyncSeconds": 120})  # helm upgrade with a changed value
    release.uninstall()

The apiserver calls the webhook through the chart's Service like on any cluster; it reaches the
Service inside the node's network namespace through its egress proxy (see :mod:`.realnode.plan`).
Every failure raises :class:`OperatorPodError`, naming the step, the cause and the fix.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from .cluster import ClusterError
from .realnode import real_node_placement

if TYPE_CHECKING:
    from .cluster import Cluster
    from .realnode import RealNode

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = REPO_ROOT / "charts" / "hisparse"
CHART_NAME: Final = "hisparse"
RELEASE: Final = "hisparse"
NAMESPACE: Final = "hisparse-system"
IMAGE: Final = "hisparse-operator"
"""The image's name in :mod:`.images`."""
PROBE_MANIFEST: Final = REPO_ROOT / "examples" / "invalid" / "hot-buffer-below-topk.yaml"
"""A manifest only the webhook refuses (the CRD's schema accepts it): a server-side dry run of it is
refused with ``denied the request`` exactly when the webhook answers."""
CRD_NAME: Final = "hisparsedeployments.serving.hisparse.dev"

Echo = Callable[[str], None]


class OperatorPodError(ClusterError):
    """The operator pod could not be installed, upgraded or removed."""

    def __init__(self, step: str, cause: str, fix: str) -> None:
        self.step, self.cause, self.fix = step, cause, fix
        super().__init__(f"operator pod: {step} failed: {cause}\nfix: {fix}")


def split_ref(ref: str) -> tuple[str, str]:
    """``(repository, tag)`` of an image reference with a tag (``localhost/name:tag``)."""
    repository, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag or not repository:
        raise OperatorPodError("read the image reference", f"{ref!r} has no tag",
                               "pass the reference hisparse dev images prints (repository:tag)")
    return repository, tag


def chart_values(ref: str, *, replicas: int = 1) -> dict[str, Any]:
    """The chart values that run the operator from the local image on the real node: the image by its
    local reference (``Never`` pulled: nothing can be pulled here), the node's label as
    ``nodeSelector`` and its taint tolerated. One replica by default: one node, and a 2-core machine."""
    repository, tag = split_ref(ref)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "replicas": replicas,
        **real_node_placement(),
    }


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class OperatorRelease:
    """One Helm release of the chart on the dev cluster."""

    cluster: Cluster
    release: str = RELEASE
    namespace: str = NAMESPACE
    timeout: float = 300.0
    """Seconds for each Helm command (``--wait``) and for the webhook to answer."""
    _values_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self._values_dir = self.cluster.workdir / "helm"

    # ---- names --------------------------------------------------------------------------------------

    @property
    def fullname(self) -> str:
        """The chart's ``hisparse.fullname``: every object's name, the ServiceAccount's included."""
        name = self.release if CHART_NAME in self.release else f"{self.release}-{CHART_NAME}"
        return name[:63].rstrip("-")

    @property
    def service_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/name={CHART_NAME},app.kubernetes.io/instance={self.release}"

    @property
    def cluster_name(self) -> str:
        """The chart's ``hisparse.clusterName``: cluster-scoped objects are ``<namespace>-<fullname>``, cut to
        54 characters plus 8 hex of the whole name's sha256 when longer than 63."""
        full = f"{self.namespace}-{self.fullname}"
        return full if len(full) <= 63 else f"{full[:54].rstrip('-')}-{hashlib.sha256(full.encode()).hexdigest()[:8]}"

    @property
    def webhook_configuration(self) -> str:
        return f"{self.cluster_name}.{CRD_NAME}"

    # ---- helm ---------------------------------------------------------------------------------------

    def helm(self, *args: str, check: bool = True, step: str = "helm") -> subprocess.CompletedProcess[str]:
        helm = self.cluster.helm_path
        if helm is None:
            raise OperatorPodError(step, "helm is not built", "run e2e/tools/build.sh helm (scripts/setup does)")
        res = subprocess.run([str(helm), f"--kubeconfig={self.cluster.kubeconfig}", *args], capture_output=True,
                             text=True, timeout=self.timeout + 60, check=False)
        if check and res.returncode:
            raise OperatorPodError(step, f"helm {' '.join(args)} exited {res.returncode}: "
                                   f"{(res.stderr or res.stdout).strip()}\n{self._diagnosis()}",
                                   "see the pod's events and log above; `helm status "
                                   f"{self.release} -n {self.namespace}` and `kubectl -n {self.namespace} "
                                   "describe pods`")
        return res

    def load_image(self, node: RealNode, echo: Echo = print) -> str:
        """Build the operator image if its inputs changed (cached) and import it into the node."""
        from . import images

        try:
            return images.load(node.import_image, [IMAGE], echo=echo)[IMAGE]
        except images.ImageError as e:
            raise OperatorPodError("build and load the operator image", str(e), e.fix) from e

    def adopt_crd(self) -> None:
        """Let the release take over a CRD that exists but is not its own (applied by kubectl, or by an
        earlier host-process operator), as docs/guides/upgrading.md says."""
        if self.cluster.kubectl("get", "crd", CRD_NAME, "--ignore-not-found", "-o", "name").stdout.strip():
            self.cluster.kubectl("annotate", "--overwrite", "crd", CRD_NAME,
                                 f"meta.helm.sh/release-name={self.release}",
                                 f"meta.helm.sh/release-namespace={self.namespace}")
            self.cluster.kubectl("label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")

    def install(self, ref: str, values: dict[str, Any] | None = None, *, replicas: int = 1, chart: Path = CHART) -> None:
        """``helm upgrade --install`` of ``chart`` with the local image on the real node (plus ``values``),
        wait for the rollout, then until the webhook answers from the pod."""
        self._values_dir.mkdir(parents=True, exist_ok=True)
        path = self._values_dir / f"{self.release}.values.yaml"
        path.write_text(yaml.safe_dump(deep_merge(chart_values(ref, replicas=replicas), values or {})))
        self.adopt_crd()
        self.helm("upgrade", "--install", self.release, str(chart), "--namespace", self.namespace,
                  "--create-namespace", "-f", str(path), "--wait", f"--timeout={int(self.timeout)}s",
                  step="helm upgrade --install")
        self.wait_webhook()

    def uninstall(self) -> None:
        self.helm("uninstall", self.release, "--namespace", self.namespace, "--wait",
                  f"--timeout={int(self.timeout)}s", step="helm uninstall")

    def installed(self) -> bool:
        res = self.helm("status", self.release, "--namespace", self.namespace, check=False)
        return res.returncode == 0

    # ---- the pod ------------------------------------------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-l", self.selector, "-o", "json").stdout
        return list(json.loads(out)["items"])

    def logs(self) -> str:
        """Every operator container's log, current and previous (a restarted container's too)."""
        parts = []
        for pod in self.pods():
            name = pod["metadata"]["name"]
            for previous in (True, False):
                res = self.cluster.kubectl("logs", "-n", self.namespace, name, f"--previous={str(previous).lower()}",
                                           check=False)
                if res.returncode == 0:
                    parts.append(res.stdout)
        return "\n".join(parts)

    def webhook_answers(self) -> tuple[bool, str]:
        """Whether the apiserver's call to the webhook is answered: a server-side dry run of a manifest
        only the webhook refuses comes back ``denied the request``."""
        doc = yaml.safe_load(PROBE_MANIFEST.read_text())
        # The release's own namespace: a single-namespace release's webhook sees no other.
        doc["metadata"]["namespace"] = self.namespace
        res = self.cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
        return "denied the request" in res.stderr, (res.stderr or res.stdout).strip()

    def wait_webhook(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            ok, last = self.webhook_answers()
            if ok:
                return
            if time.monotonic() > deadline:
                raise OperatorPodError("wait for the webhook", f"the apiserver's call to the webhook Service was "
                                       f"not answered within {self.timeout:.0f}s; last answer: {last}\n"
                                       f"{self._diagnosis()}",
                                       "see the operator pod's log, and the apiserver-egress log in the "
                                       f"cluster's logs/ ({self.cluster.workdir / 'logs'})")
            time.sleep(1.0)

    def _diagnosis(self) -> str:
        pods = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-o", "wide", check=False).stdout
        events = self.cluster.kubectl("get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp",
                                      check=False).stdout
        return f"pods:\n{pods}\nevents (last lines):\n{chr(10).join(events.splitlines()[-15:])}\n" \
               f"operator log (last lines):\n{chr(10).join(self.logs().splitlines()[-20:])}"
