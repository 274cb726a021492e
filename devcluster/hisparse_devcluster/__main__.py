"""``python -m hisparse_devcluster up|status|down``: a dev cluster that outlives the command.

The ``hisparse dev`` CLI wraps the same three functions. The cluster lives in
``--workdir`` (default ``${HISPARSE_CACHE:-$HOME/.cache/hisparse}/dev``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import Cluster, ClusterError, ToolsNotBuiltError, default_workdir


def up(workdir: Path, gpu_nodes: int) -> dict[str, object]:
    cluster = Cluster.start(workdir, detach=True)
    try:
        names = cluster.add_gpu_nodes(gpu_nodes) if gpu_nodes else []
    except BaseException:
        cluster.stop()  # all or nothing: no half-set-up cluster left behind
        raise
    return {"kubeconfig": str(cluster.kubeconfig), "server": cluster.server, "gpu_nodes": names}


def status(workdir: Path) -> dict[str, object]:
    cluster = Cluster.attach(workdir)
    running = cluster.status()
    return {
        "kubeconfig": str(cluster.kubeconfig),
        "server": cluster.server,
        "processes": {p.name: {"pid": p.pid, "running": running[p.name], "log": p.log}
                      for p in cluster.processes},
    }


def down(workdir: Path, clean: bool) -> dict[str, object]:
    Cluster.attach(workdir).stop(clean=clean)
    return {"stopped": str(workdir)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hisparse_devcluster")
    parser.add_argument("--workdir", type=Path, default=default_workdir())
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start a cluster in the background")
    p_up.add_argument("--gpu-nodes", type=int, default=2, help="KWOK GPU nodes to add (default 2)")
    sub.add_parser("status", help="show the running cluster")
    p_down = sub.add_parser("down", help="stop the cluster")
    p_down.add_argument("--clean", action="store_true", help="also delete certificates, data, logs")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            out = up(args.workdir, args.gpu_nodes)
        elif args.command == "status":
            out = status(args.workdir)
        else:
            out = down(args.workdir, args.clean)
    except (ClusterError, ToolsNotBuiltError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
