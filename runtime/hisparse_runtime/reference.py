"""What the runtime exposes to users, as JSON: the ``hisparse-runtime`` commands and options (from its
argparse parser) and the vLLM plugin's metric families (from a fresh registry).

The docs reference (``python -m hisparse_operator.docs_reference``) runs ``python -m
hisparse_runtime.reference``: the operator may import only the runtime's engine core, not its CLI or plugin.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _default(action: argparse.Action) -> Any:
    value = action.default
    if value is None or value is argparse.SUPPRESS or action.nargs == 0:
        return None
    return value if isinstance(value, (str, int, float, bool, list)) else str(value)


def _kind(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "flag"
    if action.choices:
        return " | ".join(str(c) for c in action.choices)
    kind = getattr(action.type, "__name__", None) or "string"
    kind = {"str": "string", "int": "integer", "float": "number", "Path": "path"}.get(kind, kind)
    return f"{kind} (repeatable)" if isinstance(action, argparse._AppendAction) else kind


def commands() -> list[dict[str, Any]]:
    """Every subcommand (and sub-subcommand) with its options, in the parser's order."""
    from hisparse_runtime.cli import build_parser

    out: list[dict[str, Any]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                options = [{"flags": list(a.option_strings) or [a.metavar or a.dest], "positional": not a.option_strings,
                            "kind": _kind(a), "required": bool(a.required), "default": _default(a), "help": a.help or ""}
                           for a in sub._actions
                           if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
                out.append({"path": [*path, name], "help": helps.get(name) or sub.description or "", "options": options,
                            "subcommands": any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)})
                walk(sub, [*path, name])

    walk(build_parser(), [])
    return out


def metrics() -> list[dict[str, Any]]:
    """The plugin's metric families as the exposition names them (without the multiprocess variant)."""
    from prometheus_client import CollectorRegistry

    from hisparse_runtime.plugin.metrics import HiSparseMetrics

    m = HiSparseMetrics.create(CollectorRegistry())
    return [{"name": obj._name, "kind": obj._type, "help": obj._documentation, "labels": list(obj._labelnames)}
            for obj in vars(m).values()]


def main() -> int:
    json.dump({"commands": commands(), "metrics": metrics()}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
