"""Static PersistentVolumes for the claims a HiSparseDeployment renders (its shared model cache).

The dev cluster runs no storage provisioner, so a claim would stay Pending and the model download Job,
and with it every serving workload the operator holds back until the Job completes, would never start.
KWOK pods mount nothing and KWOK's ``pod-complete`` stage completes pods that Jobs own, so a hostPath
volume pre-bound to the claim (and kept to KWOK nodes) is all a KWOK fleet needs to get past the download.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import yaml

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["model_cache_volumes", "provide_model_cache"]

HOST_DIR: Final = "/tmp/hisparse-dev-model-cache"
KWOK_NODE_LABEL: Final = ("type", "kwok")
"""The label every KWOK node carries (``nodes.py``): the real node, whose kubelet would mount the path, is left out."""


def model_cache_volumes(doc: dict[str, Any], *, node_label: tuple[str, str] = KWOK_NODE_LABEL,
                        host_dir: str = HOST_DIR) -> list[dict[str, Any]]:
    """One PersistentVolume per PersistentVolumeClaim ``doc`` renders, pre-bound to it, as large as it asks,
    at ``host_dir/<namespace>/<claim>`` on the nodes labelled ``node_label`` (KWOK's by default; the real
    node's for pods that really write and read it)."""
    from hisparse_operator.render import render

    out = []
    for claim in (o for o in render(doc) if o["kind"] == "PersistentVolumeClaim"):
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        spec = claim["spec"]
        out.append({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"{ns}-{name}"[:253], "labels": {"hisparse.dev/dev-volume": "true"}},
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": list(spec["accessModes"]),
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": spec.get("storageClassName", ""),
                "claimRef": {"namespace": ns, "name": name},
                "hostPath": {"path": f"{host_dir}/{ns}/{name}", "type": "DirectoryOrCreate"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": node_label[0], "operator": "In", "values": [node_label[1]]}]}]}},
            },
        })
    return out


def provide_model_cache(cluster: Cluster, doc: dict[str, Any]) -> list[str]:
    """Apply :func:`model_cache_volumes` of ``doc``; returns the volumes' names."""
    volumes = model_cache_volumes(doc)
    if volumes:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(volumes))
    return [v["metadata"]["name"] for v in volumes]
