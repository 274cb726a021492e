"""``hisparse rollout status|promote|abort|retry|pause|resume NAME`` (also ``kubectl hisparse rollout``).

A control is the annotation ``serving.hisparse.dev/rollout-action: <action>@<id>`` on the resource
(users and GitOps tools can set it themselves); the operator acts on each distinct value once and
records it in ``status.canary.handledAction``. The commands need only ``patch`` on the resource.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

rollout_app = typer.Typer(help="Steer a canary rollout: status, promote, abort, retry, pause, resume.",
                          no_args_is_help=True)

NameArg = Annotated[str, typer.Argument(help="HiSparseDeployment name")]
NamespaceOpt = Annotated[str | None, typer.Option("--namespace", "-n", help="Namespace (default: the kubeconfig's)")]
ContextOpt = Annotated[str | None, typer.Option("--context", help="kubeconfig context")]

_HELP = {
    "promote": "Continue past a pause, a hold or an inconclusive analysis (never past the parity gate).",
    "abort": "Roll the candidate back now (before promotion).",
    "retry": "Start a rolled-back revision again, with a new parity Job.",
    "pause": "Hold the rollout where it is (traffic and replicas stay).",
    "resume": "Undo a pause.",
}


def _labels() -> Any:
    """The API's names, imported when a command runs (the CLI starts without the API models)."""
    from .api import labels

    return labels


def _api(context: str | None) -> tuple[Any, str]:
    from kubernetes import client, config

    try:
        config.load_kube_config(context=context)
        _, active = config.list_kube_config_contexts()
        namespace = (active or {}).get("context", {}).get("namespace") or "default"
    except config.ConfigException:
        config.load_incluster_config()
        namespace = "default"
    return client.CustomObjectsApi(), namespace


def _get(api: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    L = _labels()
    try:
        return api.get_namespaced_custom_object(L.GROUP, L.VERSION, namespace, L.PLURAL, name)
    except ApiException as exc:
        typer.echo(f"error: {L.KIND} {namespace}/{name}: {exc.reason} ({exc.status})", err=True)
        raise typer.Exit(1) from None


def describe(obj: dict[str, Any]) -> str:
    """The rollout in a few lines (what ``hisparse rollout status`` prints)."""
    st = obj.get("status") or {}
    c = st.get("canary") or {}
    name = (obj.get("metadata") or {}).get("name") or "-"
    lines = [f"stable revision: {st.get('stableRevision') or '-'} (fleet {st.get('stableFleet') or name})"]
    if c:
        lines.append(f"canary: revision {c.get('revision')} attempt {c.get('attempt', 1)}: {c.get('phase')}"
                     f"{' (paused)' if c.get('paused') else ''}, step {c.get('step', 0)}, {c.get('weight', 0)}% of requests"
                     + (f" (fleet {c['fleet']})" if c.get("fleet") else ""))
        for role, r in (c.get("replicas") or {}).items():
            lines.append(f"  {role}: {r.get('stable', 0)} stable + {r.get('candidate', 0)} candidate replicas")
        if c.get("message"):
            lines.append(f"  {c['message']}")
    p = st.get("parity")
    if p:
        lines.append(f"parity: {'passed' if p.get('passed') else 'failed'} ({p.get('reason', '')}) for {p.get('revision')}: "
                     f"{p.get('prompts', 0)} prompts, {p.get('diverged', 0)} diverged, {p.get('nearTies', 0)} near-ties"
                     + (f"; first {p['firstDivergence']}" if p.get("firstDivergence") else ""))
    for cond in st.get("conditions") or []:
        if cond.get("type") in ("Progressing", "Degraded") and cond.get("status") == "True" or cond.get("reason") == "RolloutHeld":
            lines.append(f"{cond['type']}={cond['status']} {cond['reason']}: {cond.get('message', '')}")
    return "\n".join(lines)


@rollout_app.command("status")
def status(name: NameArg, namespace: NamespaceOpt = None, context: ContextOpt = None,
           output: Annotated[str, typer.Option("--output", "-o", help="text or json")] = "text") -> None:
    """Where the rollout stands."""
    api, default_ns = _api(context)
    obj = _get(api, namespace or default_ns, name)
    typer.echo(json.dumps(obj.get("status") or {}, indent=2) if output == "json" else describe(obj))


def _control(action: str) -> Any:
    def command(name: NameArg, namespace: NamespaceOpt = None, context: ContextOpt = None) -> None:
        L = _labels()
        api, default_ns = _api(context)
        ns = namespace or default_ns
        _get(api, ns, name)
        value = f"{action}@{time.time_ns()}"
        api.patch_namespaced_custom_object(L.GROUP, L.VERSION, ns, L.PLURAL, name,
                                           {"metadata": {"annotations": {L.ROLLOUT_ACTION: value}}})
        typer.echo(f"{L.KIND} {ns}/{name}: {action} requested ({L.ROLLOUT_ACTION}={value})")

    command.__doc__ = _HELP[action]
    return command


for _action in _HELP:  # the actions of api.labels.ROLLOUT_ACTIONS (a test keeps the two equal)
    rollout_app.command(_action, help=_HELP[_action])(_control(_action))
