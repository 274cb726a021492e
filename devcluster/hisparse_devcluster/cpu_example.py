"""What the CPU-sized example (``examples/cpu-tiny.yaml``) needs on the real node beside the operator.

- Its images in the node's containerd: the CPU runtime image (``localhost/hisparse-runtime-cpu:dev``),
  llm-d's EPP and routing sidecar built here (:mod:`.images`).
- ``nvidia.com/gpu`` on the node: the rendered pods request GPUs exactly as on a GPU node, so the real node
  advertises that extended resource (a STAND-IN: no device is behind it; the runtime image's CPU engine
  serves instead of vLLM, and its preflight says so).
- The model: the tiny DSA checkpoint (``config.json`` + ``model.safetensors`` of a seed, real weights) in a
  directory of the cluster's workdir, offered as a ``hostPath`` PersistentVolume bound to the claim the
  example's ``pvc://tiny-dsa`` names.

Planning is pure (:func:`model_objects`, :func:`gpu_capacity_patch`); :func:`prepare` does the I/O.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from hisparse_operator.api.facts import GPU_RESOURCE

from ._tools import REPO_ROOT

if TYPE_CHECKING:
    from .cluster import Cluster
    from .realnode import RealNode

__all__ = ["EXAMPLE", "GPU_RESOURCE", "IMAGES", "MODEL_CLAIM", "MODEL_SEED", "advertise_gpus", "gpu_capacity_patch",
           "model_dir", "model_objects", "prepare", "write_model"]

EXAMPLE: Final = REPO_ROOT / "examples" / "cpu-tiny.yaml"
MODEL_CLAIM: Final = "tiny-dsa"
"""The claim ``spec.model.source: pvc://tiny-dsa`` names."""
MODEL_SEED: Final = 0
"""The tiny DSA weights' seed: ``TinyDSA(config, seed=MODEL_SEED)`` computes the same tokens in-process."""
ADVERTISED_GPUS: Final = 8
"""Extended resource count the real node advertises (enough for a canary of each role beside the stable)."""
IMAGES: Final = ("hisparse-runtime-cpu", "llm-d-epp", "llm-d-pd-sidecar")

Echo = Callable[[str], None]


def gpu_capacity_patch(count: int = ADVERTISED_GPUS) -> list[dict[str, Any]]:
    """The JSON patch of the node's status that advertises ``count`` GPUs (the documented way to add an
    extended resource: the kubelet keeps it in allocatable across its syncs and restarts)."""
    return [{"op": "add", "path": "/status/capacity/" + GPU_RESOURCE.replace("/", "~1"), "value": str(count)}]


def model_objects(namespace: str, host_dir: Path, *, claim: str = MODEL_CLAIM, size: str = "1Gi") -> list[dict[str, Any]]:
    """A ``hostPath`` PersistentVolume of ``host_dir`` and the ReadOnlyMany claim bound to it."""
    pv_name = f"hisparse-dev-{namespace}-{claim}"[:63]
    pv = {"apiVersion": "v1", "kind": "PersistentVolume",
          "metadata": {"name": pv_name, "labels": {"app.kubernetes.io/part-of": "hisparse-dev"}},
          "spec": {"capacity": {"storage": size}, "accessModes": ["ReadOnlyMany"],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "claimRef": {"namespace": namespace, "name": claim},
                   "hostPath": {"path": str(host_dir), "type": "Directory"}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": namespace},
           "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv_name,
                    "resources": {"requests": {"storage": size}}}}
    return [pv, pvc]


def model_dir(workdir: Path, namespace: str, claim: str = MODEL_CLAIM) -> Path:
    """Where the checkpoint of ``namespace``'s claim lives in the cluster's workdir."""
    return workdir / "models" / namespace / claim


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

    refs = images.load(node.import_image, IMAGES, tag_image=tag, echo=echo)
    advertise_gpus(cluster, NODE_NAME)
    host_dir = write_model(model_dir(cluster.workdir, namespace))
    cluster.kubectl("create", "namespace", namespace, check=False)
    cluster.apply([*model_objects(namespace, host_dir), parity_prompts_config_map(namespace)])
    echo(f"cpu example: images {sorted(refs.values())}, {ADVERTISED_GPUS} {GPU_RESOURCE} advertised on {NODE_NAME}, "
         f"model {host_dir} as claim {namespace}/{MODEL_CLAIM}")
    return refs
