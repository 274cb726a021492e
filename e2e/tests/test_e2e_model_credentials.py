"""A model credential on a real kubelet: the download Job's pod runs on the real node (containerd, runc),
so a missing Secret is the kubelet's own ``CreateContainerConfigError``, which the operator reports as
``ModelReady`` False, reason ``CredentialsMissing``, naming the Secret, while no serving workload exists.
Once the Secret exists the pod starts; the image here is busybox, which has no fetcher, so the download
fails, and that is ``DownloadFailed`` with the runtime's message after the Job's retries, not a crash loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from e2e_helpers import apply_crds, eventually, exists, get_json
from e2e_realnode import BUSYBOX_IMAGE, busybox_archive
from hisparse_devcluster import Cluster, Tools
from hisparse_devcluster.realnode import NODE_LABEL, NODE_NAME, NODE_TAINT, RealNode
from test_e2e_operator import CRD, EXAMPLES, Operator

pytestmark = pytest.mark.host

SECRET = "hf-token"
NAME = "dsv32"


@pytest.fixture(scope="module")
def node(cluster: Cluster, tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    n = RealNode(cluster, tools=tools).start()
    taint = f"{NODE_TAINT['key']}={NODE_TAINT['value']}:{NODE_TAINT['effect']}"
    try:
        assert n.import_image(busybox_archive(tmp_path_factory.mktemp("images") / "busybox.tar")) == [BUSYBOX_IMAGE]
        # The download Job's pod carries no toleration of the real node's taint (nothing the operator
        # renders is meant for a dev node): lift it for this module; the volume below pins the pod here.
        cluster.kubectl("taint", "node", NODE_NAME, f"{taint}-")
        yield n
    finally:
        cluster.kubectl("taint", "node", NODE_NAME, taint, "--overwrite", check=False)
        n.stop()


@pytest.fixture(scope="module")
def operator(cluster: Cluster, node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    apply_crds(cluster, CRD)
    op = Operator(cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()


def _model_ready(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    status = get_json(cluster, "hsd", NAME, "-n", namespace).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "ModelReady"), None)


def test_a_missing_secret_is_credentials_missing_and_nothing_serves(cluster: Cluster, operator: Operator,
                                                                    namespace: str) -> None:
    doc = yaml.safe_load((EXAMPLES / "deepseek-v32-single-node.yaml").read_text())
    doc["metadata"].update(namespace=namespace, name=NAME)
    doc["spec"]["model"].update(cache={"mode": "SharedVolume"}, credentials={"secretName": SECRET})
    doc["spec"].setdefault("engine", {}).update(image=BUSYBOX_IMAGE, imagePullPolicy="Never")
    claim = f"{NAME}-model-cache"
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{namespace}-{claim}"[:253]},
              "spec": {"capacity": {"storage": "2000Gi"}, "accessModes": ["ReadWriteMany"],
                       "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                       "claimRef": {"namespace": namespace, "name": claim},
                       "hostPath": {"path": f"/tmp/hisparse-e2e-model-cache/{namespace}", "type": "DirectoryOrCreate"},
                       "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                           {"key": NODE_LABEL[0], "operator": "In", "values": [NODE_LABEL[1]]}]}]}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(volume))
    try:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
        missing = eventually(lambda: (c := _model_ready(cluster, namespace)) and c["reason"] == "CredentialsMissing" and c,
                             what="ModelReady CredentialsMissing", timeout=180)
        assert missing["status"] == "False" and f'secret "{SECRET}" not found' in missing["message"], missing
        assert f"Create the Secret {SECRET} in namespace {namespace}" in missing["message"]
        pods = get_json(cluster, "pods", "-n", namespace, "-l", "app.kubernetes.io/component=model-fetch")["items"]
        assert pods and all(p["spec"]["nodeName"] == NODE_NAME for p in pods), "the kubelet of the real node decided"
        waiting = pods[0]["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["reason"] == "CreateContainerConfigError", waiting
        for role in ("prefill", "decode"):
            assert not exists(cluster, "deployment", f"{NAME}-{role}", "-n", namespace), "nothing serves before the cache"
        ready = next(c for c in get_json(cluster, "hsd", NAME, "-n", namespace)["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "False" and "ModelReady" in ready["message"]

        # The Secret appears: the pod starts, and (busybox has no fetcher) the download fails for real.
        cluster.kubectl("create", "secret", "generic", SECRET, "-n", namespace, "--from-literal=HF_TOKEN=hf_e2e_not_real")
        failed = eventually(lambda: (c := _model_ready(cluster, namespace)) and c["reason"] == "DownloadFailed" and c,
                            what="ModelReady DownloadFailed after the Job's retries", timeout=300)
        assert "hisparse-runtime" in failed["message"], failed["message"]
        assert "hf_e2e_not_real" not in json.dumps(get_json(cluster, "hsd", NAME, "-n", namespace)), "no token in status"
        pods = get_json(cluster, "pods", "-n", namespace, "-l", "app.kubernetes.io/component=model-fetch")["items"]
        assert all(p["status"]["phase"] == "Failed" for p in pods), [p["status"].get("phase") for p in pods]
        for role in ("prefill", "decode"):
            assert not exists(cluster, "deployment", f"{NAME}-{role}", "-n", namespace)
    finally:
        cluster.kubectl("delete", "hsd", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        cluster.kubectl("delete", "pv", volume["metadata"]["name"], "--wait=false", check=False)
