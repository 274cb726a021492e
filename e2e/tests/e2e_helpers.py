"""Small helpers shared by the e2e suites."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from hisparse_devcluster import Cluster

T = TypeVar("T")


def eventually(check: Callable[[], T | None], *, what: str, timeout: float = 60.0) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(0.25)


def rollout_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``hisparse rollout ...`` as a user runs it (``kubectl hisparse rollout ...`` is the same program)."""
    return subprocess.run([sys.executable, "-m", "hisparse_operator.cli", "rollout", *args], capture_output=True,
                          text=True, timeout=60, check=False, env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})


def get_json(cluster: Cluster, *args: str) -> Any:
    """``kubectl get ARGS -o json``, parsed."""
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def exists(cluster: Cluster, *args: str) -> bool:
    res = cluster.kubectl("get", *args, "--ignore-not-found", "-o", "name", check=False)
    assert res.returncode == 0, res.stderr
    return bool(res.stdout.strip())


def apply_invalid_example(cluster: Cluster, path: Path, namespace: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``kubectl apply`` one file of ``examples/invalid/`` into ``namespace``; returns kubectl's result and
    the field path the file says its refusal must name.

    The file's own bytes go to kubectl (only the namespace line changes), so kubectl's YAML reading, not
    PyYAML's, decides what the apiserver and the webhook see (``y`` is a boolean there). A file whose refusal
    is its namespace keeps it: moving it into the test's namespace would make it valid, and the apiserver
    then refuses it itself (no namespace of that name can exist), before any webhook is called.
    """
    text = path.read_text()
    match = re.search(r"^# expected-path: (.+)$", text, re.M)
    assert match, f"{path.name} names no '# expected-path:'"
    expected = match.group(1).strip()
    if expected != "metadata.namespace":
        if re.search(r"^  namespace: .*$", text, re.M):
            text = re.sub(r"^  namespace: .*$", f"  namespace: {namespace}", text, count=1, flags=re.M)
        else:
            text = re.sub(r"^metadata:\n", f"metadata:\n  namespace: {namespace}\n", text, count=1, flags=re.M)
    return cluster.kubectl("apply", "-f", "-", input=text, check=False), expected


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tls_listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TLS server answers a handshake on ``host:port`` (no verification: just up or not)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=2) as raw, ctx.wrap_socket(raw):
            return True
    except OSError:
        return False


GRACE_SECONDS = 30
"""A pod's default ``terminationGracePeriodSeconds`` (the chart keeps it): an operator that has not exited
this long after SIGTERM is SIGKILLed by the kubelet, and its peering lease is left to expire."""


def stop_operator(proc: subprocess.Popen[bytes], what: str, log_path: Path, sig: int = signal.SIGTERM) -> None:
    """Signal the operator's process group; after SIGTERM it must exit within :data:`GRACE_SECONDS`, as in a
    pod, or it is killed and this fails."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    limit = GRACE_SECONDS if sig == signal.SIGTERM else 60
    try:
        proc.wait(limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise AssertionError(f"{what} did not exit within {limit} s of {signal.Signals(sig).name} "
                             f"(log: {log_path})") from None


class OperatorProcess:
    """`hisparse operator run` as its own process (own process group), metrics on loopback, log in
    ``workdir``; ``env`` adds or overrides HISPARSE_* settings."""

    def __init__(self, cluster: Cluster, workdir: Path, env: dict[str, str] | None = None, name: str = "operator",
                 kubeconfig: Path | None = None) -> None:
        self.cluster, self.workdir, self.name = cluster, workdir, name
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.metrics_port = free_port()
        self.env = {"HISPARSE_METRICS_PORT": str(self.metrics_port), "HISPARSE_METRICS_ADDR": "127.0.0.1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}-{self.starts}.log"

    def spawn(self) -> None:
        self.starts += 1
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "hisparse_operator.cli", "operator", "run"], env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_serving(self, timeout: float = 90) -> None:
        """Metrics up and, when it serves one, the webhook answering TLS."""
        port = self.env.get("HISPARSE_WEBHOOK_PORT")

        def up() -> bool:
            assert self.running(), f"{self.name} exited:\n{self.log()[-3000:]}"
            return self.metric("hisparse_operator_reconciles_total") is not None and (not port or tls_listening(int(port)))

        eventually(up, what=f"{self.name} serving (log: {self.log_path})", timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.running():
            assert self.proc is not None
            stop_operator(self.proc, self.name, self.log_path, sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metric(self, name: str, **labels: str) -> float | None:
        """Sum of the samples of ``name`` whose labels include ``labels``; None when metrics are down."""
        try:
            return scrape_metric(self.metrics_port, name, **labels)
        except OSError:
            return None


def service_account_kubeconfig(cluster: Cluster, path: Path, account: str, namespace: str) -> Path:
    """A kubeconfig that authenticates as ``namespace/account`` (a bound token), trusting the cluster CA:
    what an operator pod of the chart runs as."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    base64.b64decode(ca, validate=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "dev", "cluster": {"server": cluster.server, "certificate-authority-data": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": "sa"}}],
    }))
    path.chmod(0o600)
    return path


CRD_NAME = "hisparsedeployments.serving.hisparse.dev"


def let_helm_adopt_crd(cluster: Cluster, release: str, namespace: str) -> None:
    """The upgrading guide's step (docs/guides/upgrading.md) for a CRD that exists but is not the release's
    (applied by kubectl, or by another release): annotate and label it so that the release's CRD template
    takes it over."""
    if not exists(cluster, "crd", CRD_NAME):
        return
    cluster.kubectl("annotate", "--overwrite", "crd", CRD_NAME, f"meta.helm.sh/release-name={release}",
                    f"meta.helm.sh/release-namespace={namespace}")
    cluster.kubectl("label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")


def apply_crds(cluster: Cluster, *paths: Path, names: tuple[str, ...] = ("hisparsedeployments.serving.hisparse.dev",),
               timeout: float = 60.0) -> None:
    """Server-side apply of CRD files, then wait until each of ``names`` is Established. Not `kubectl wait`:
    it fails at once while a new CRD has no status yet (as on a loaded apiserver)."""
    for path in paths:
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    for name in names:
        eventually(lambda: cluster.kubectl("get", f"crd/{name}", "-o",
                                           "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                                           check=False).stdout == "True", what=f"CRD {name} Established",
                   timeout=timeout)



def assert_left_alone(cluster: Cluster, namespace: str, docs: list[dict[str, Any]], *, owner: str,
                      settle: float = 15.0) -> None:
    """Apply ``docs`` (HiSparseDeployments, bad ones included) in ``namespace``, which a single-namespace
    operator of ``owner`` must not see: each is accepted (that release's webhook does not see it), gets
    no status and no children."""
    for doc in docs:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({**doc, "metadata": {**doc["metadata"],
                                                                                       "namespace": namespace}}))
    time.sleep(settle)
    for doc in docs:
        name = doc["metadata"]["name"]
        status = get_json(cluster, "hsd", name, "-n", namespace).get("status") or {}
        assert not status.get("conditions"), f"{namespace}/{name} got status from the {owner} operator: {status}"
    children = cluster.kubectl("get", "deployments,configmaps,services", "-n", namespace, "-l",
                               "serving.hisparse.dev/deployment", "-o", "name").stdout.split()
    assert children == [], children


@contextlib.contextmanager
def chart_operator(cluster: Cluster, namespace: str, fullname: str, workdir: Path) -> Iterator[tuple[Path, int]]:
    """The operator of the chart's release ``namespace/fullname`` run as the release's pod would run it: its
    Deployment's argv (the watched namespaces) and HISPARSE_* environment, its ServiceAccount's token, in
    service mode through the chart's Service and webhook configuration. There is no pod network: the Service
    becomes an ExternalName for 127.0.0.1, and the apiserver reaches the webhook there (still checking the
    Service's TLS name). Yields the log file and the metrics port once the webhook answers."""
    kubeconfig = service_account_kubeconfig(cluster, workdir / "kubeconfig", fullname, namespace)
    container = get_json(cluster, "deployment", fullname, "-n", namespace)["spec"]["template"]["spec"]["containers"][0]
    chart_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert container["args"][:2] == ["operator", "run"], container["args"]
    cluster.kubectl("patch", "service", fullname, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": {
        "type": "ExternalName", "externalName": "127.0.0.1", "clusterIP": None, "clusterIPs": None, "ipFamilies": None,
        "ipFamilyPolicy": None, "internalTrafficPolicy": None, "sessionAffinity": None, "selector": None}}))
    metrics_port = free_port()
    env = {**os.environ, **chart_env, "KUBECONFIG": str(kubeconfig), "POD_ID": f"{namespace}-operator",
           "HISPARSE_NAMESPACE": namespace, "HISPARSE_WEBHOOK_ADDR": "127.0.0.1",
           "HISPARSE_WEBHOOK_CERT_DIR": str(workdir / "certs"), "HISPARSE_WEBHOOK_CERT_CHECK_SECONDS": "2",
           "HISPARSE_METRICS_PORT": str(metrics_port), "HISPARSE_METRICS_ADDR": "127.0.0.1"}
    log_path = workdir / "operator.log"
    args = [a for a in container["args"] if not a.startswith("--liveness")]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "hisparse_operator.cli", *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def registered() -> bool:
            hooks = get_json(cluster, "validatingwebhookconfiguration", chart_env["HISPARSE_WEBHOOK_CONFIGURATION"])
            return bool(hooks["webhooks"][0]["clientConfig"].get("caBundle"))

        eventually(lambda: proc.poll() is None and registered() and tls_listening(int(chart_env["HISPARSE_WEBHOOK_PORT"])),
                   what=f"the webhook of {namespace}/{fullname} (log: {log_path})", timeout=90)
        yield log_path, metrics_port
    finally:
        stop_operator(proc, f"the operator of {namespace}/{fullname}", log_path)


def scrape_metric(port: int, name: str, *, timeout: float = 5, **labels: str) -> float:
    """Sum of the samples of ``name`` on ``127.0.0.1:port/metrics`` whose labels include ``labels``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{([^}}]*)}})? ([0-9.e+-]+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def helm(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``helm`` against ``cluster`` (the Helm that e2e/tools/build.sh built); fails on a non-zero exit unless
    ``check`` is off."""
    assert cluster.helm_path is not None, "helm is not built: run e2e/tools/build.sh"
    res = subprocess.run([str(cluster.helm_path), f"--kubeconfig={cluster.kubeconfig}", *args],
                         capture_output=True, text=True, timeout=300, check=False)
    assert not check or res.returncode == 0, f"helm {' '.join(args)}:\n{res.stdout}\n{res.stderr}"
    return res


def _doc_lines(text: str) -> Iterator[tuple[str, str]]:
    """(line as written, its words normalised) for each command line of a Markdown page's ``bash`` blocks:
    continuation lines joined, comments dropped, one space between words, as bash would split them."""
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                yield line, " ".join(words)


def doc_commands(text: str) -> list[str]:
    """The commands of a Markdown page's ``bash`` blocks, in order (see :func:`_doc_lines`)."""
    return [words for _, words in _doc_lines(text)]


def doc_line(text: str, words: str) -> str:
    """The page's own line whose words are ``words`` (see :func:`doc_commands`), to run as written."""
    for line, w in _doc_lines(text):
        if w == words:
            return line
    raise AssertionError(f"{words!r} is not on the page any more")
