"""What the CPU-sized example (``examples/cpu-tiny.yaml``) needs on the real node beside the operator.

- Its images in the node's containerd: the CPU runtime image (``localhost/hisparse-runtime-cpu:dev``),
  llm-d's EPP and routing sidecar built here (:mod:`.images`).
- ``nvidia.com/gpu`` on the node: the rendered pods request GPUs exactly as on a GPU node, so the real node
  advertises that extended resource (a STAND-IN: no device is behind it; the runtime image's CPU engine
  serves instead of vLLM, and its preflight says so).
- The model, as production gets it: the example's source is ``hf://hisparse-dev/tiny-dsa``, downloaded by
  the operator's download Job into the deployment's shared model cache and loaded from there. No hub can be
  reached here, so a STAND-IN serves it: :mod:`hisparse_runtime.testing.hub_server` as a pod of the
  node (``model-hub``, the example's ``model.endpoint``), speaking the hub's file API over the tiny DSA
  checkpoint (``config.json`` + ``model.safetensors`` of a seed, real weights) written into the cluster's
  workdir. The cache claim the operator renders gets a ``hostPath`` volume on the real node (no
  provisioner runs here), owned by the runtime's user, who downloads into it.

Planning is pure (:func:`hub_objects`, :func:`hub_commit`, :func:`gpu_capacity_patch`); :func:`prepare`
does the I/O.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from hisparse_operator.api.facts import GPU_RESOURCE
from hisparse_runtime.engine.versions import RUNTIME_UID

from . import storage
from ._tools import REPO_ROOT

if TYPE_CHECKING:
    from .cluster import Cluster
    from .realnode import RealNode

__all__ = ["EXAMPLE", "GPU_RESOURCE", "HUB_NAME", "IMAGES", "MODEL_SEED", "advertise_gpus", "gpu_capacity_patch",
           "hub_commit", "hub_objects", "model_dir", "prepare", "remove", "write_model"]

EXAMPLE: Final = REPO_ROOT / "examples" / "cpu-tiny.yaml"
MODEL_SEED: Final = 0
"""The tiny DSA weights' seed: ``TinyDSA(config, seed=MODEL_SEED)`` computes the same tokens in-process."""
ADVERTISED_GPUS: Final = 8
"""Extended resource count the real node advertises (enough for a canary of each role beside the stable)."""
IMAGES: Final = ("hisparse-runtime-cpu", "llm-d-epp", "llm-d-pd-sidecar")
HUB_NAME: Final = "model-hub"
"""The hub stand-in's Deployment and Service: the example's ``model.endpoint`` is ``http://model-hub:8080``."""
HUB_PORT: Final = 8080
HUB_MOUNT: Final = "/hub"

Echo = Callable[[str], None]


def gpu_capacity_patch(count: int = ADVERTISED_GPUS) -> list[dict[str, Any]]:
    """The JSON patch of the node's status that advertises ``count`` GPUs (the documented way to add an
    extended resource: the kubelet keeps it in allocatable across its syncs and restarts)."""
    return [{"op": "add", "path": "/status/capacity/" + GPU_RESOURCE.replace("/", "~1"), "value": str(count)}]


def hub_commit(host_dir: Path) -> str:
    """The commit id the stand-in gives the checkpoint (40 hex digits, as the hub's): a hash of its files'
    names and bytes, so another checkpoint is another commit."""
    h = hashlib.sha1()
    for f in sorted(p for p in host_dir.rglob("*") if p.is_file()):
        h.update(f.relative_to(host_dir).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def hub_objects(doc: dict[str, Any], namespace: str, host_dir: Path, commit: str, image: str) -> list[dict[str, Any]]:
    """The hub stand-in: a Deployment on the real node serving ``doc``'s ``hf://`` repository from
    ``host_dir`` (read-only) at ``commit``, with the example's revision naming that commit, and its Service."""
    from .realnode import NODE_LABEL, NODE_TAINT

    model = doc["spec"]["model"]
    repo = model["source"].removeprefix("hf://")
    labels = {"app.kubernetes.io/name": HUB_NAME, "app.kubernetes.io/part-of": "hisparse-dev"}
    args = ["--repo", repo, "--commit", f"{commit}={HUB_MOUNT}/{commit}", "--port", str(HUB_PORT)]
    if model["revision"] != commit:
        args += ["--ref", f"{model['revision']}={commit}"]
    pod = {
        "nodeSelector": dict([NODE_LABEL]),
        "tolerations": [{**NODE_TAINT, "operator": "Equal"}],
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "hub", "image": image, "imagePullPolicy": "Never",
            "command": ["python3", "-m", "hisparse_runtime.testing.hub_server"], "args": args,
            "ports": [{"name": "http", "containerPort": HUB_PORT}],
            "readinessProbe": {"tcpSocket": {"port": HUB_PORT}, "periodSeconds": 2},
            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "repo", "mountPath": f"{HUB_MOUNT}/{commit}", "readOnly": True}],
        }],
        "volumes": [{"name": "repo", "hostPath": {"path": str(host_dir), "type": "Directory"}}],
    }
    meta = {"name": HUB_NAME, "namespace": namespace, "labels": labels}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"selector": labels, "ports": [{"name": "http", "port": HUB_PORT, "targetPort": "http"}]}},
    ]


def model_cache_dir(workdir: Path) -> Path:
    """Where the real node's model cache volumes live (``<dir>/<namespace>/<claim>``)."""
    return workdir / "model-cache"


def model_dir(workdir: Path, namespace: str) -> Path:
    """Where the hub stand-in's checkpoint for ``namespace`` lives in the cluster's workdir."""
    return workdir / "models" / namespace / "tiny-dsa"


def parity_prompts_config_map(namespace: str) -> dict[str, Any]:
    """The example's parity prompts (its ``rollout.parity.promptsConfigMap``): the built-in set's short
    prompts, which fit the tiny model's 2048 tokens (its long contexts, ~10K tokens, do not)."""
    from hisparse_runtime.engine.parity import PROMPTS_FILE
    from hisparse_runtime.parity import builtin_prompts

    parity = example_doc()["spec"]["rollout"]["parity"]
    short = [p for p in builtin_prompts(4 * parity["prompts"]) if len(p.prompt) < 512][: 2 * parity["prompts"]]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": parity["promptsConfigMap"], "namespace": namespace},
            "data": {PROMPTS_FILE: "".join(p.model_dump_json(exclude_none=True) + "\n" for p in short)}}


def write_model(host_dir: Path, *, seed: int = MODEL_SEED) -> Path:
    """The tiny DSA checkpoint, readable by the serving pods' non-root user."""
    from hisparse_runtime.cpu_engine import write_checkpoint

    if not (host_dir / "config.json").is_file():
        write_checkpoint(host_dir, seed=seed)
    for p in [host_dir, *host_dir.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return host_dir


def advertise_gpus(cluster: Cluster, node_name: str, count: int = ADVERTISED_GPUS, timeout: float = 60.0) -> None:
    cluster.kubectl("patch", "node", node_name, "--subresource=status", "--type=json",
                    "-p", json.dumps(gpu_capacity_patch(count)))
    deadline = time.monotonic() + timeout
    while True:
        node = json.loads(cluster.kubectl("get", "node", node_name, "-o", "json").stdout)
        if node["status"].get("allocatable", {}).get(GPU_RESOURCE) == str(count):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {node_name} does not show {GPU_RESOURCE}: {count} in allocatable")
        time.sleep(0.5)


def example_doc() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text()))


def prepare(cluster: Cluster, node: RealNode, *, namespace: str | None = None, echo: Echo = print) -> dict[str, str]:
    """Everything the CPU example needs that is not the operator's: images loaded (and tagged ``:dev``),
    GPUs advertised, the model written and offered as its claim. Returns image name -> reference."""
    from . import images
    from .realnode import NODE_NAME

    namespace = namespace or example_doc()["metadata"]["namespace"]

    def tag(ref: str, alias: str) -> None:
        node.ctr("images", "tag", "--force", ref, alias)

    from .realnode import NODE_LABEL

    refs = images.load(node.import_image, IMAGES, tag_image=tag, echo=echo)
    advertise_gpus(cluster, NODE_NAME)
    doc = example_doc()
    doc["metadata"]["namespace"] = namespace
    host_dir = write_model(model_dir(cluster.workdir, namespace))
    cache = model_cache_dir(cluster.workdir)
    volumes = storage.model_cache_volumes(doc, node_label=NODE_LABEL, host_dir=str(cache))
    for v in volumes:  # the download runs as the runtime's user: its volume must be that user's
        path = Path(v["spec"]["hostPath"]["path"])
        path.mkdir(parents=True, exist_ok=True)
        rel = path.relative_to(cache).parts
        for i in range(len(rel) + 1):
            os.chown(cache.joinpath(*rel[:i]), RUNTIME_UID, RUNTIME_UID)
    commit = hub_commit(host_dir)
    runtime_image = doc["spec"]["engine"]["image"]
    cluster.kubectl("create", "namespace", namespace, check=False)
    cluster.apply([*volumes, *hub_objects(doc, namespace, host_dir, commit, runtime_image),
                   parity_prompts_config_map(namespace)])
    echo(f"cpu example: images {sorted(refs.values())}, {ADVERTISED_GPUS} {GPU_RESOURCE} advertised on {NODE_NAME}, "
         f"{doc['spec']['model']['source']} at {commit[:12]} served by the hub stand-in {namespace}/{HUB_NAME} "
         f"from {host_dir}, model cache volume(s) {[v['metadata']['name'] for v in volumes]}")
    return refs


def remove(cluster: Cluster, *, namespace: str | None = None, timeout: float = 120.0) -> None:
    """Undo :func:`prepare` in ``namespace`` once the example itself is gone: the hub stand-in (waiting for
    its pod, so that no pod of it is left for a later node of the same cluster), the parity prompts and the
    model cache volumes (a released volume would not bind a new claim of the same name)."""
    namespace = namespace or example_doc()["metadata"]["namespace"]
    doc = example_doc()
    doc["metadata"]["namespace"] = namespace
    cluster.kubectl("delete", "deployment,service", HUB_NAME, "-n", namespace, "--ignore-not-found",
                    "--cascade=foreground", "--wait=true", f"--timeout={int(timeout)}s", check=False)
    cluster.kubectl("delete", "configmap", doc["spec"]["rollout"]["parity"]["promptsConfigMap"], "-n", namespace,
                    "--ignore-not-found", check=False)
    volumes = [v["metadata"]["name"] for v in storage.model_cache_volumes(doc)]
    if volumes:
        cluster.kubectl("delete", "persistentvolume", *volumes, "--ignore-not-found", "--wait=false", check=False)
    # What the downloads wrote goes too: a later prepare of this cluster starts from an empty cache, as the
    # first did (a test of the download would otherwise find the model cached by an earlier module).
    from .realnode import NODE_LABEL

    for v in storage.model_cache_volumes(doc, node_label=NODE_LABEL, host_dir=str(model_cache_dir(cluster.workdir))):
        shutil.rmtree(v["spec"]["hostPath"]["path"], ignore_errors=True)
