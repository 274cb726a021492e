"""docs/getting-started/existing-cluster.md, run as its reader runs it, with the local cluster standing in for
theirs and a real registry for their registry.

The registry is Debian's docker-registry on loopback, serving TLS with a CA of its own
(:mod:`hisparse_devcluster.registry`): skopeo on the host trusts that CA through
``/etc/containers/certs.d``, the real node's containerd through its registry configuration (``hosts.toml``),
as a cluster's nodes are configured for a private registry. The page's commands run in the page's order,
with ``REGISTRY`` and ``TAG`` naming that registry: the images are pushed by ``hisparse dev images --push``,
the chart is installed from the registry's operator image and checked with ``helm test``, the CPU example
is applied with its images from the registry (edited as the page says) and serves a completion through
llm-d, and the production example is applied on KWOK GPU nodes and converges to Ready. The node's containerd
pulled every image the pods run from the registry: the registry's own log names containerd fetching each
manifest, and each pod's image ID is the digest the registry serves.

Every command of the page's shell blocks is either run here or listed in :data:`NOT_RUN` with the reason: a
command added to the page fails this module until it is one or the other.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import e2e_fleet
import pytest
import yaml
from e2e_helpers import CRD_NAME, doc_commands, doc_line, eventually, get_json, let_helm_adopt_crd
from e2e_realnode import via_envoy_standin
from hisparse_devcluster import Cluster, cpu_example, storage
from hisparse_devcluster.realnode import RealNode, real_node_placement
from hisparse_devcluster.registry import LoopbackRegistry
from hisparse_operator.api import labels as L

pytestmark = [pytest.mark.host, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started" / "existing-cluster.md"
TAG = "0.1.0"
RELEASE, RELEASE_NAMESPACE = "hisparse", "hisparse-system"
CPU = yaml.safe_load((REPO / "examples" / "cpu-tiny.yaml").read_text())
PRODUCTION = yaml.safe_load((REPO / "examples" / "hisparse-deployment.yaml").read_text())
NOT_RUN = {
    "docker build -f operator/Dockerfile -t $REGISTRY/hisparse-operator:$TAG .":
        "no Docker engine on this machine; hisparse dev images builds the same operator/Dockerfile with buildah",
    "docker build -f runtime/Dockerfile -t $REGISTRY/hisparse-runtime:$TAG-vllm0.33.0 .":
        "the GPU runtime starts from vllm/vllm-openai (CUDA), which this machine cannot fetch; the CPU runtime "
        "shares every other step of runtime/Dockerfile",
    "docker push $REGISTRY/hisparse-operator:$TAG": "no Docker engine; skopeo pushes (hisparse dev images --push)",
    "docker push $REGISTRY/hisparse-runtime:$TAG-vllm0.33.0": "no Docker engine and no GPU runtime image (above)",
}
"""Commands of the page not run here, with why."""
WATCHES = ("kubectl get hsd cpu-tiny -w", "kubectl get hsd -n inference -w")
"""Watches: waited on until the resource is Ready, then run once without ``-w``."""


def test_the_page_parser_reads_commands_as_bash_does() -> None:
    text = "x\n```bash\nA=1   # one\nhelm install a b \\\n  --set c=$A\n# only a comment\n```\n```yaml\nno: 1\n```\n"
    assert doc_commands(text) == ["A=1", "helm install a b --set c=$A"]
    assert doc_line(text, "helm install a b --set c=$A").split() == ["helm", "install", "a", "b", "--set", "c=$A"]


@pytest.fixture(scope="module")
def registry(node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackRegistry]:
    reg = LoopbackRegistry(tmp_path_factory.mktemp("registry")).start()
    try:
        reg.expose_in(node)
        yield reg
    finally:
        reg.stop()


class Reader:
    """Runs the page's commands as its reader would, in a directory holding the repository's chart and the
    examples as the page says to edit them, with ``REGISTRY`` and ``TAG`` set and the cluster's tools on PATH."""

    def __init__(self, cluster: Cluster, registry: LoopbackRegistry, workdir: Path) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.registry = f"{registry.host}/inference"
        (workdir / "charts").symlink_to(REPO / "charts")
        (workdir / "examples").mkdir()
        tools = {Path(str(cluster.kubectl_path)).parent, Path(str(cluster.helm_path)).parent, REPO / ".venv" / "bin"}
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "REGISTRY": self.registry, "TAG": TAG,
                    "PATH": os.pathsep.join([*map(str, tools), os.environ.get("PATH", "")])}
        self.ran: list[str] = []
        self.nodes: list[str] = []

    def run(self, words: str, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """The page's line for ``words`` (a command of :data:`RUN`), run as written, with ``extra`` words
        appended (what this cluster adds); a watch (:data:`WATCHES`) runs once, without ``-w``."""
        line = doc_line(PAGE.read_text(), words)
        if words in WATCHES:
            line = line.replace(" -w", "")
        res = subprocess.run(["bash", "-c", " ".join([line, *map(shlex.quote, extra)])], cwd=self.workdir,
                             env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        assert res.returncode == 0, f"{line}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        self.ran.append(words)
        return res


def _ready(cluster: Cluster, namespace: str, name: str) -> bool:
    res = cluster.kubectl("get", "hsd", name, "-n", namespace, "-o", "json", check=False)
    st = (json.loads(res.stdout).get("status") or {}) if res.returncode == 0 else {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])


def _manifest_digest(registry: LoopbackRegistry, ref: str) -> str:
    """The digest the registry serves for ``ref`` (``host/path:tag``), as a client resolving it sees it."""
    host, _, rest = ref.partition("/")
    path, _, tag = rest.rpartition(":")
    request = urllib.request.Request(f"https://{host}/v2/{path}/manifests/{tag}", method="HEAD", headers={"Accept": ", ".join((
        "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"))})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cadata=registry.ca_pem.decode()),
                                timeout=10) as r:
        return str(r.headers["Docker-Content-Digest"])


def _pulled_from_registry(cluster: Cluster, registry: LoopbackRegistry, namespace: str, selector: str) -> list[str]:
    """The images the selected pods' containers run, each checked to be the registry's bytes: the reference
    names the registry and the image ID is the digest the registry serves for it."""
    seen = []
    for pod in get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]:
        # (llm-d's routing sidecar is a native sidecar: an init container that keeps running.)
        for c in (pod["status"].get("initContainerStatuses") or []) + (pod["status"].get("containerStatuses") or []):
            if not c["image"].startswith(registry.host + "/"):
                continue
            digest = c["imageID"].rpartition("@")[2]
            assert digest == _manifest_digest(registry, c["image"]), (c["image"], c["imageID"])
            seen.append(c["image"])
    return seen


@pytest.fixture(scope="module")
def page(cluster: Cluster, node: RealNode, registry: LoopbackRegistry,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    reader = Reader(cluster, registry, tmp_path_factory.mktemp("reader"))
    try:
        yield reader
    finally:
        for ns, name in ((CPU["metadata"]["namespace"], CPU["metadata"]["name"]),
                         (PRODUCTION["metadata"]["namespace"], PRODUCTION["metadata"]["name"])):
            cluster.kubectl("delete", "hsd", name, "-n", ns, "--ignore-not-found", "--wait=true", "--timeout=120s",
                            check=False)
        cpu_example.remove(cluster)
        cluster.kubectl("delete", "namespace", PRODUCTION["metadata"]["namespace"], "--wait=false", check=False)
        subprocess.run([str(cluster.helm_path), "uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", "--timeout=120s"],
                       env=reader.env, capture_output=True, check=False)
        cluster.kubectl("delete", "namespace", RELEASE_NAMESPACE, "--wait=false", check=False)
        if reader.nodes:
            cluster.kubectl("delete", "node", *reader.nodes, "--wait=false", check=False)
        volumes = [v["metadata"]["name"] for v in storage.model_cache_volumes(PRODUCTION)]
        cluster.kubectl("delete", "persistentvolume", *volumes, "--ignore-not-found", "--wait=false", check=False)


def test_every_command_of_the_page_is_run_or_says_why_not() -> None:
    commands = doc_commands(PAGE.read_text())
    assert set(NOT_RUN) <= set(commands), sorted(set(NOT_RUN) - set(commands))
    assert set(WATCHES) <= set(commands), sorted(set(WATCHES) - set(commands))
    assert set(commands) - set(NOT_RUN) == set(RUN), sorted(set(commands) - set(NOT_RUN) ^ set(RUN))


RUN = (
    "REGISTRY=registry.example.com/inference",
    "TAG=0.1.0",
    "hisparse dev images --only operator --only runtime --only epp --only sidecar --push $REGISTRY --tag $TAG",
    "helm install hisparse charts/hisparse --namespace hisparse-system --create-namespace --wait --set "
    "image.repository=$REGISTRY/hisparse-operator --set image.tag=$TAG",
    "helm test hisparse -n hisparse-system",
    "hisparse validate examples/cpu-tiny.yaml",
    "kubectl apply -f examples/cpu-tiny.yaml",
    "kubectl get hsd cpu-tiny -w",
    "kubectl create namespace inference",
    "kubectl create secret generic hf-token -n inference --from-literal=HF_TOKEN=...",
    "kubectl get nodes -o yaml > nodes.yaml",
    "hisparse validate examples/hisparse-deployment.yaml --nodes nodes.yaml",
    "hisparse render examples/hisparse-deployment.yaml --argv",
    "kubectl apply -f examples/hisparse-deployment.yaml",
    "kubectl get hsd -n inference -w",
)
"""The page's commands this module runs, in the page's order (the two assignments are the reader's values:
here ``REGISTRY`` and ``TAG`` are set to the loopback registry's)."""


def test_images_pushed_operator_installed_from_the_registry_and_helm_test_passes(
        cluster: Cluster, registry: LoopbackRegistry, page: Reader) -> None:
    pushed = page.run(RUN[2]).stdout
    for image in ("hisparse-operator:0.1.0", "hisparse-runtime-cpu:0.1.0", "llm-d-epp:v0.4.0", "llm-d-pd-sidecar:v0.5.1"):
        assert f"{page.registry}/{image}\tpushed" in pushed, pushed
        _manifest_digest(registry, f"{page.registry}/{image}")  # served
    let_helm_adopt_crd(cluster, RELEASE, RELEASE_NAMESPACE)  # the shared cluster has the CRD already (no reader's has)
    placement = page.workdir / "this-cluster.yaml"
    # What this cluster needs: the operator on the real node (the KWOK nodes run no container), one replica
    # on a 2-core machine.
    placement.write_text(yaml.safe_dump({**real_node_placement(), "replicas": 1}))
    page.run(RUN[3], "-f", str(placement))
    page.run(RUN[4])
    images = _pulled_from_registry(cluster, registry, RELEASE_NAMESPACE, f"{L.APP_INSTANCE}={RELEASE}")
    assert set(images) == {f"{page.registry}/hisparse-operator:{TAG}"}, images
    assert get_json(cluster, "crd", CRD_NAME)["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE


def test_the_cpu_example_serves_from_the_registry(cluster: Cluster, node: RealNode, registry: LoopbackRegistry,
                                                  page: Reader) -> None:
    cpu_example.prepare(cluster, node)  # the model hub stand-in, the parity prompts, the cache volume, the GPUs
    doc = json.loads(json.dumps(CPU))
    # Edited as the page says: the images pushed in step 1, pulled (imagePullPolicy left to its default).
    doc["spec"]["engine"]["image"] = f"{page.registry}/hisparse-runtime-cpu:{TAG}"
    doc["spec"]["engine"].pop("imagePullPolicy", None)
    doc["spec"]["routing"]["eppImage"] = f"{page.registry}/llm-d-epp:v0.4.0"
    doc["spec"]["routing"]["sidecarImage"] = f"{page.registry}/llm-d-pd-sidecar:v0.5.1"
    (page.workdir / "examples" / "cpu-tiny.yaml").write_text(yaml.safe_dump(doc))
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    page.run(RUN[5])
    page.run(RUN[6])
    eventually(lambda: _ready(cluster, ns, name), what=f"{name} Ready from the registry's images", timeout=600)
    shown = page.run(RUN[7])
    assert re.search(rf"^{name}\s+1/1\s+1/1\s+True\s", shown.stdout, re.M), shown.stdout
    images = set(_pulled_from_registry(cluster, registry, ns, f"{L.APP_INSTANCE}={name}"))
    assert images == {doc["spec"]["engine"]["image"], doc["spec"]["routing"]["eppImage"],
                      doc["spec"]["routing"]["sidecarImage"]}, images
    agents = {(f["uri"].split("/manifests/")[0], f["useragent"].split("/")[0]) for f in registry.fetches()
              if "/manifests/" in f["uri"] and f["method"] in ("GET", "HEAD") and f["status"] == "200"}
    for image in ("hisparse-runtime-cpu", "llm-d-epp", "llm-d-pd-sidecar", "hisparse-operator"):
        assert (f"/v2/inference/{image}", "containerd") in agents, sorted(agents)
    res = via_envoy_standin(cluster, node, ns, doc["spec"]["model"]["servedModelName"], "the quick brown fox", 4,
                            pool=name)
    assert res["status"] == 200 and res["body"]["choices"][0]["text"], res


def test_the_production_example_converges_on_kwok_gpu_nodes(cluster: Cluster, page: Reader) -> None:
    # Adapted as the page says (its nodeSelector, for this cluster's node pools); the images stay the page's:
    # KWOK nodes run no container.
    doc = e2e_fleet.manifest(PRODUCTION["metadata"]["namespace"], PRODUCTION["metadata"]["name"])
    page.nodes += e2e_fleet.add_nodes(cluster, 1, prefix="gs-")
    (page.workdir / "examples" / "hisparse-deployment.yaml").write_text(yaml.safe_dump(doc))
    for words in RUN[8:12]:
        out = page.run(words).stdout
    assert "fits" in out or "valid" in out, out  # validate against the nodes just listed
    listed = {n["metadata"]["name"] for n in yaml.safe_load((page.workdir / "nodes.yaml").read_text())["items"]}
    assert set(page.nodes) <= listed, sorted(set(page.nodes) - listed)
    argv = yaml.safe_load_all(page.run(RUN[12]).stdout)
    assert any(a and a.get("argv", [])[:2] == ["vllm", "serve"] for a in argv)
    storage.provide_model_cache(cluster, doc)  # no ReadWriteMany provisioner here: a static volume stands in
    page.run(RUN[13])
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    eventually(lambda: _ready(cluster, ns, name), what=f"{name} Ready on KWOK GPU nodes", timeout=300)
    shown = page.run(RUN[14])
    assert re.search(rf"^{name}\s+8/8\s+1/1\s+True\s", shown.stdout, re.M), shown.stdout
    assert page.ran == list(RUN[2:]), page.ran  # the page's order, every command once
