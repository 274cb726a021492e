"""What each serving pod will run, read back from the rendered objects (``hisparse render --argv``).

The pods build their ``vllm serve`` argv at start from the engine ConfigMap (``hisparse-runtime serve
--role R --config FILE``), so the rendered objects never show it. This reads the same ConfigMap entry
back into the same settings model and calls the same function the entrypoint calls
(:func:`hisparse_runtime.engine.pod_argv`), once per LeaderWorkerSet index, so what it prints is what
the entrypoint would run; the environment is the container's, as rendered.
"""

from __future__ import annotations

from typing import Any

from hisparse_runtime.engine import RoleSettings, pod_argv
from hisparse_runtime.engine import env as E
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

LEADER_ADDRESS_PLACEHOLDER = "$(LWS_LEADER_ADDRESS)"
"""Shown where LeaderWorkerSet gives each worker its replica leader's address at run time."""


class PodCommand(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    workload: str
    """``Deployment/<name>`` or ``LeaderWorkerSet/<name>``."""
    role: str
    worker_index: int
    """The LeaderWorkerSet index (0: the leader, or the only pod of a single-node replica)."""
    argv: list[str]
    env: list[dict[str, Any]]
    """The container's environment as rendered (``valueFrom`` entries are resolved in the pod)."""


def _templates(o: dict[str, Any]) -> tuple[dict[str, Any], int] | None:
    spec = o.get("spec") or {}
    if o.get("kind") == "Deployment":
        return spec["template"], 1
    if o.get("kind") == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        return lwt["workerTemplate"], int(lwt.get("size") or 1)
    return None


def _serve(container: dict[str, Any]) -> tuple[str, str] | None:
    """(role, settings file) of a container that runs ``hisparse-runtime serve``."""
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if command[1:2] != ["serve"] or "--role" not in command or "--config" not in command:
        return None
    return command[command.index("--role") + 1], command[command.index("--config") + 1]


def pod_commands(objects: list[dict[str, Any]]) -> list[PodCommand]:
    config_maps = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o.get("data") or {}
                   for o in objects if o.get("kind") == "ConfigMap"}  # fmt: skip
    out: list[PodCommand] = []
    for o in objects:
        found = _templates(o)
        if found is None:
            continue
        template, size = found
        pod = template["spec"]
        for container in pod["containers"]:
            serve = _serve(container)
            if serve is None:
                continue
            role, path = serve
            settings = _settings(pod, container, path, o["metadata"].get("namespace"), config_maps)
            for index in range(size):
                environ = {E.LWS_WORKER_INDEX: str(index)} if size > 1 else {}
                if size > 1:
                    environ[E.LWS_LEADER_ADDRESS] = LEADER_ADDRESS_PLACEHOLDER
                out.append(PodCommand(workload=f"{o['kind']}/{o['metadata']['name']}", role=role, worker_index=index,
                                      argv=pod_argv(settings, environ), env=list(container.get("env") or [])))  # fmt: skip
    return out


def _settings(pod: dict[str, Any], container: dict[str, Any], path: str, namespace: str | None,
              config_maps: dict[tuple[str | None, str], dict[str, str]]) -> RoleSettings:
    """The settings file as the pod sees it: through the container's mount of a ConfigMap volume."""
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        prefix = mount["mountPath"].rstrip("/") + "/"
        source = volumes.get(mount["name"], {}).get("configMap")
        if source and path.startswith(prefix):
            data = config_maps[(namespace, source["name"])]
            return RoleSettings.model_validate_json(data[path[len(prefix):]])
    raise ValueError(f"{path} is not in a ConfigMap the container mounts")
