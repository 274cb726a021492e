"""``hisparse``: render, validate and inspect HiSparseDeployments (and, later, run the operator)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from .yamlio import Document

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="HiSparse P/D deployments: render what the operator applies, validate before you apply.",
)

EXIT_INVALID = 1
EXIT_UNREADABLE = 2

FileArg = Annotated[Path, typer.Argument(help="hisparse-deployment.yaml ('-' for stdin)", allow_dash=True)]
NodesOpt = Annotated[
    Path | None,
    typer.Option("--nodes", help="`kubectl get nodes -o yaml` output: also check the host pool fits the nodes decode can use"),
]
PrometheusOpt = Annotated[
    str | None,
    typer.Option("--prometheus-url", help="The operator's HISPARSE_PROMETHEUS_URL (chart value prometheusUrl), which "
                                          "analysis steps without a prometheusUrl query; unset: it has none"),
]


def _read(path: Path) -> bytes:
    """At most one byte over the loader's limit, so a huge file is refused without reading it all."""
    from .yamlio import MAX_BYTES

    if str(path) == "-":
        return sys.stdin.buffer.read(MAX_BYTES + 1)
    with path.open("rb") as f:
        return f.read(MAX_BYTES + 1)


def _load_documents(path: Path) -> list[Document]:
    """Every document of FILE, each a mapping; exits 2 (naming the document) when the stream is unreadable."""
    from .yamlio import YamlInputError, load_documents

    try:
        docs = load_documents(_read(path))
    except OSError as exc:
        typer.echo(f"{path}: cannot read: {exc.strerror or exc}", err=True)
        raise typer.Exit(EXIT_UNREADABLE) from exc
    except YamlInputError as exc:
        typer.echo(f"{path}: cannot read: {exc}", err=True)
        raise typer.Exit(EXIT_UNREADABLE) from exc
    bad = [d for d in docs if not isinstance(d.data, dict)]
    for d in bad:
        typer.echo(f"{path}: {d.label}: expected a YAML mapping (a HiSparseDeployment manifest), got a "
                   f"{type(d.data).__name__}", err=True)
    if not docs:
        typer.echo(f"{path}: expected one or more YAML mappings (HiSparseDeployment manifests), found no document", err=True)
    if bad or not docs:
        raise typer.Exit(EXIT_UNREADABLE)
    return docs


def _facts(nodes: Path | None):  # -> ClusterFacts | None
    if nodes is None:
        return None
    from .api import ClusterFacts

    items = []
    for doc in _load_documents(nodes):
        listed = doc.data.get("items") if doc.data.get("kind") != "Node" else [doc.data]
        if not isinstance(listed, list) or not all(isinstance(n, dict) for n in listed):
            typer.echo(f"{nodes}: {doc.label}: expected a Node or a List of Nodes (`kubectl get nodes -o yaml`)", err=True)
            raise typer.Exit(EXIT_UNREADABLE)
        items += listed
    try:
        return ClusterFacts.from_nodes(items)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        typer.echo(f"{nodes}: not usable node facts: {exc}", err=True)
        raise typer.Exit(EXIT_UNREADABLE) from exc


ArgvOpt = Annotated[
    bool,
    typer.Option("--argv", help="print, instead of the objects, the exact `vllm serve` argv and the env of each "
                               "serving pod (each LeaderWorkerSet index), as the pod entrypoint will run it"),
]


@app.command()
def render(file: FileArg, nodes: NodesOpt = None, prometheus_url: PrometheusOpt = None, argv: ArgvOpt = False) -> None:
    """Print every Kubernetes object for FILE as a YAML stream (what the operator applies)."""
    from .render import InvalidSpec, render as render_objects

    facts = _facts(nodes)
    out: list[dict[str, Any]] = []
    failed = False
    for doc in _load_documents(file):
        try:
            out += render_objects(doc.data, facts, doc.spelled, prometheus_url=prometheus_url)
        except InvalidSpec as exc:
            failed = True
            for e in exc.errors:
                typer.echo(f"{file} {doc.label}: {e}", err=True)
    if failed:
        raise typer.Exit(EXIT_INVALID)
    from .yamlio import dump_all

    if argv:
        from .pod_commands import pod_commands

        out = [c.model_dump(mode="json", by_alias=True) for c in pod_commands(out)]
    sys.stdout.write(dump_all(out))


@app.command()
def validate(file: FileArg, nodes: NodesOpt = None, prometheus_url: PrometheusOpt = None) -> None:
    """Check FILE against the API and every engine constraint; one line per error, with its field path."""
    from .api import validate as validate_doc

    facts = _facts(nodes)
    count = 0
    for doc in _load_documents(file):
        _, errors = validate_doc(doc.data, facts, doc.spelled, prometheus_url=prometheus_url)
        for e in errors:
            typer.echo(f"{file} {doc.label}: {e}", err=True)
        count += len(errors)
    if count:
        raise typer.Exit(EXIT_INVALID)
    typer.echo(f"{file}: valid")


@app.command()
def crd() -> None:
    """Print the HiSparseDeployment CustomResourceDefinition."""
    from .crd import crd_yaml

    sys.stdout.write(crd_yaml())


operator_app = typer.Typer(help="Run the operator.", no_args_is_help=True)
app.add_typer(operator_app, name="operator")


@operator_app.command("run")
def operator_run(
    namespace: Annotated[list[str] | None, typer.Option("--namespace", "-n", help="Watch only these namespaces (default: all)")] = None,
    liveness: Annotated[str | None, typer.Option(help="Serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")] = None,
) -> None:
    """Reconcile HiSparseDeployments (kubeconfig or in-cluster credentials). Settings come from HISPARSE_*
    environment variables (controller/settings.py): the webhook (HISPARSE_WEBHOOK_PORT, _SERVICE or _HOST,
    _SECRET, ...), HISPARSE_METRICS_PORT, HISPARSE_PEERING, HISPARSE_RETRY_*, HISPARSE_WORKERS, ..."""
    import logging

    import kopf

    from .controller import handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kopf.run(clusterwide=not namespace, namespaces=namespace or (), liveness_endpoint=liveness)


@app.command("chart-test")
def chart_test(
    service: Annotated[str, typer.Option(help="DNS name of the chart's Service, which the webhook certificate must name")],
    webhook_port: Annotated[int, typer.Option(min=1, max=65535)] = 9443,
    metrics_port: Annotated[int, typer.Option(min=1, max=65535)] = 8080,
    address: Annotated[str | None, typer.Option(help="Connect here instead of the Service name")] = None,
) -> None:
    """What `helm test` runs: the webhook answers TLS for its Service and refuses a bad spec; metrics are served."""
    from .chart_test import ChartTestError, Target, run

    try:
        for line in run(Target(service=service, webhook_port=webhook_port, metrics_port=metrics_port, address=address)):
            typer.echo(line)
    except ChartTestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INVALID) from exc


dev_app = typer.Typer(help="A local control plane with the operator and an example: try it without a cluster.",
                      no_args_is_help=True)
app.add_typer(dev_app, name="dev")

WorkdirOpt = Annotated[
    Path | None,
    typer.Option("--workdir", envvar="HISPARSE_DEV_WORKDIR",
                 help="Where the cluster and operator keep state and logs (default ${HISPARSE_CACHE:-~/.cache/hisparse}/dev)"),
]


def _dev(action: Any) -> None:
    """Run a ``dev`` action; known failures become one readable error and exit 1."""
    from hisparse_devcluster.dev import DevError
    from hisparse_devcluster import ClusterError, ToolsNotBuiltError

    try:
        action()
    except (DevError, ClusterError, ToolsNotBuiltError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INVALID) from exc


def _workdir(workdir: Path | None) -> Path:
    from hisparse_devcluster import default_workdir

    return workdir or default_workdir()


@dev_app.command("up")
def dev_up(
    workdir: WorkdirOpt = None,
    gpu_nodes: Annotated[int | None, typer.Option(
        min=1, help="KWOK GPU nodes (8 H200 each) to have (default: 2, or what a multi-node example needs)")] = None,
    example: Annotated[Path | None, typer.Option(help="HiSparseDeployment to apply (default: the single-node DeepSeek example)")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each step")] = 240.0,
    real_node: Annotated[bool, typer.Option(
        "--real-node/--no-real-node",
        help="Also run one real node (containerd, kubelet) beside the KWOK nodes, where the host can")] = True,
    operator_process: Annotated[bool, typer.Option(
        "--operator-process",
        help="Run the operator as a host process even with the real node up (default there: the operator image, "
             "built here, installed by `helm install` as a pod on the real node)")] = False,
    cpu_example: Annotated[bool, typer.Option(
        "--cpu-example/--no-cpu-example",
        help="With the real node up, also serve examples/cpu-tiny.yaml there for real (builds and loads the CPU "
             "runtime and llm-d images; the first time takes tens of minutes)")] = True,
) -> None:
    """Start (or reuse) the local cluster and operator, apply the example and wait until it is Ready."""
    from hisparse_devcluster import dev

    _dev(lambda: dev.up(_workdir(workdir), gpu_nodes=gpu_nodes, example=example or dev.DEFAULT_EXAMPLE,
                        timeout=timeout, real_node=real_node, operator_pod=not operator_process,
                        cpu_example=cpu_example, echo=typer.echo))


@dev_app.command("status")
def dev_status(workdir: WorkdirOpt = None) -> None:
    """Show the cluster's processes, the operator and `kubectl get hsd -A`; exit 1 unless all run."""
    from hisparse_devcluster import dev

    ok: list[bool] = []
    _dev(lambda: ok.append(dev.status(_workdir(workdir), echo=typer.echo)))
    if not all(ok):
        raise typer.Exit(EXIT_INVALID)


@dev_app.command("down")
def dev_down(
    workdir: WorkdirOpt = None,
    clean: Annotated[bool, typer.Option(help="Also delete certificates, data and logs")] = False,
) -> None:
    """Stop the operator and the cluster; fails if any process is left."""
    from hisparse_devcluster import dev

    _dev(lambda: dev.down(_workdir(workdir), clean=clean, echo=typer.echo))


@dev_app.command("images")
def dev_images(
    only: Annotated[list[str] | None, typer.Option(
        "--only", help="operator, runtime, epp or sidecar (repeatable; default all)")] = None,
    rebuild: Annotated[bool, typer.Option(help="Build the images again even when the cached archive matches (bases in the store are reused)")] = False,
    push: Annotated[str | None, typer.Option(
        "--push", metavar="REGISTRY", help="Then push each image to REGISTRY (host[:port][/path]) with skopeo")] = None,
    tag: Annotated[str | None, typer.Option(
        help="With --push: the tag of the operator and runtime images (default: dev; llm-d's keep their versions)")] = None,
) -> None:
    """Build the operator and CPU runtime images here from their Dockerfiles, and llm-d's EPP and sidecar from
    build.sh's binaries (buildah, Debian-made bases), cached by input hash; print each image's reference and
    docker-archive path, or with --push the reference pushed."""
    from hisparse_devcluster import images

    names = [images.SHORT_NAMES.get(n, n) for n in (only or images.SHORT_NAMES)]
    tag = tag or images.DEV_TAG
    try:
        if push:
            images.check_target(push, tag)  # a bad registry or tag is refused before any build
        built = images.ensure(names, rebuild=rebuild, echo=typer.echo)
        pushed = images.push(built, push, tag=tag) if push else {}
    except images.ImageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INVALID) from exc
    for name, image in built.items():
        typer.echo(f"{pushed[name]}\tpushed" if name in pushed else f"{image.ref}\t{image.archive}")


from .rollout_cli import rollout_app  # noqa: E402 (after the app it joins)

app.add_typer(rollout_app, name="rollout")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
