"""The state file that lets another process find a running dev cluster.

``<workdir>/state.json`` holds the server URL, ports, kubeconfig path, tool
paths and one :class:`ProcRecord` per server. It is rewritten after every
process start, so even a start that failed half-way can be torn down.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._procs import ProcRecord

STATE_FILE = "state.json"
_FORMAT = 1


def cache_home() -> Path:
    """``${HISPARSE_CACHE:-$HOME/.cache/hisparse}``: the project's caches outside the repository (tools, images,
    the real node's image store, the dev cluster)."""
    return Path(os.environ.get("HISPARSE_CACHE") or str(Path.home() / ".cache" / "hisparse"))


def default_workdir() -> Path:
    """``${HISPARSE_CACHE:-$HOME/.cache/hisparse}/dev``: where ``hisparse dev up`` keeps its cluster."""
    return cache_home() / "dev"


@dataclass
class ClusterState:
    workdir: Path
    server: str = ""
    kubeconfig: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    processes: list[ProcRecord] = field(default_factory=list)
    detached: bool = False

    @property
    def path(self) -> Path:
        return self.workdir / STATE_FILE

    def record(self, rec: ProcRecord) -> None:
        """Add or replace (by name) a process record and save."""
        self.processes = [p for p in self.processes if p.name != rec.name] + [rec]
        self.save()

    def proc(self, name: str) -> ProcRecord:
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(f"no process named {name!r} in {self.path}")

    def save(self) -> None:
        data: dict[str, Any] = {
            "format": _FORMAT,
            "workdir": str(self.workdir),
            "server": self.server,
            "kubeconfig": self.kubeconfig,
            "ports": self.ports,
            "tools": self.tools,
            "detached": self.detached,
            "processes": [p.to_json() for p in self.processes],
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)  # readers never see a half-written file

    @classmethod
    def load(cls, workdir: Path) -> ClusterState | None:
        path = workdir / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        if data.get("format") != _FORMAT:
            raise ValueError(f"{path}: unknown state format {data.get('format')!r}")
        return cls(
            workdir=Path(data["workdir"]),
            server=data["server"],
            kubeconfig=data["kubeconfig"],
            ports={k: int(v) for k, v in data["ports"].items()},
            tools=dict(data["tools"]),
            processes=[ProcRecord.from_json(p) for p in data["processes"]],
            detached=bool(data.get("detached", False)),
        )
