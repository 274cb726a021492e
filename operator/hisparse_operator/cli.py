"""``hisparse``: render, validate and inspect HiSparseDeployments (and, later, run the operator)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

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


def _load_documents(path: Path) -> list[dict[str, Any]]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        typer.echo(f"{path}: cannot read: {exc}", err=True)
        raise typer.Exit(EXIT_UNREADABLE) from exc
    if not docs or not all(isinstance(d, dict) for d in docs):
        typer.echo(f"{path}: expected one or more YAML mappings (HiSparseDeployment manifests)", err=True)
        raise typer.Exit(EXIT_UNREADABLE)
    return docs


def _facts(nodes: Path | None):  # -> ClusterFacts | None
    if nodes is None:
        return None
    from .api import ClusterFacts

    data = _load_documents(nodes)
    items = [n for doc in data for n in (doc.get("items") or ([doc] if doc.get("kind") == "Node" else []))]
    return ClusterFacts.from_nodes(items)


@app.command()
def render(file: FileArg, nodes: NodesOpt = None) -> None:
    """Print every Kubernetes object for FILE as a YAML stream (what the operator applies)."""
    from .render import InvalidSpec, render as render_objects

    facts = _facts(nodes)
    out: list[dict[str, Any]] = []
    failed = False
    for doc in _load_documents(file):
        try:
            out += render_objects(doc, facts)
        except InvalidSpec as exc:
            failed = True
            name = (doc.get("metadata") or {}).get("name", "?")
            for e in exc.errors:
                typer.echo(f"{name}: {e}", err=True)
    if failed:
        raise typer.Exit(EXIT_INVALID)
    from .yamlio import dump_all

    sys.stdout.write(dump_all(out))


@app.command()
def validate(file: FileArg, nodes: NodesOpt = None) -> None:
    """Check FILE against the API and every engine constraint; one line per error, with its field path."""
    from .api import validate as validate_doc

    facts = _facts(nodes)
    count = 0
    for doc in _load_documents(file):
        _, errors = validate_doc(doc, facts)
        for e in errors:
            typer.echo(f"{file}: {e}", err=True)
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
) -> None:
    """Start (or reuse) the local cluster and operator, apply the example and wait until it is Ready."""
    from hisparse_devcluster import dev

    _dev(lambda: dev.up(_workdir(workdir), gpu_nodes=gpu_nodes, example=example or dev.DEFAULT_EXAMPLE,
                        timeout=timeout, real_node=real_node, echo=typer.echo))


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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
