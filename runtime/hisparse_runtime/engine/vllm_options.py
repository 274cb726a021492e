"""vLLM 0.33's ``vllm serve`` options, as its parser defines them, for checking ``extraArgs``.

``vllm_serve_options.json`` is generated from the installed vLLM by ``scripts/gen-vllm-options`` (a test
fails when it is stale). Scanning follows argparse and vLLM's ``FlexibleArgumentParser``: ``--a_b`` is
``--a-b``, ``--flag=value``, dotted JSON sub-keys (``-cc.cudagraph_mode=FULL``), unique prefixes of long
options (argparse abbreviations, which vLLM allows), and how many values each option takes. Every
token resolves to the option's ``dest``, so an alias or an abbreviation cannot dodge ownership rules.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

TABLE_FILE: Final = "vllm_serve_options.json"


@functools.cache
def table() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(TABLE_FILE).read_text())


def options() -> dict[str, dict[str, str]]:
    return table()["options"]


def dest_of(flag: str) -> str:
    """The argparse ``dest`` of a flag spelled exactly as vLLM defines it."""
    return options()[flag]["dest"]


@dataclass(frozen=True)
class ArgToken:
    """One option (with its values) or one stray token of an argv fragment."""

    index: int
    text: str
    option: str | None = None
    """The option as vLLM defines it (``--tensor-parallel-size`` for ``-tp=2``); ``None`` if unresolved."""
    dest: str | None = None
    problem: str | None = None


def _is_negative_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return token.startswith("-")


def _looks_like_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _is_negative_number(token)


def resolve(name: str) -> tuple[str | None, str | None]:
    """``(option, problem)`` for a flag name without its ``=value``."""
    opts = options()
    base = name.split(".", 1)[0]  # dotted JSON sub-key: --compilation-config.mode
    if base.startswith("--"):
        base = "--" + base[2:].replace("_", "-")
    if base in opts:
        return opts[base]["long"], None
    if base.startswith("--") and table().get("allow_abbrev", False):
        matches = sorted(o for o in opts if o.startswith(base) and o.startswith("--"))
        dests = {opts[m]["dest"] for m in matches}
        if len(dests) == 1:
            return matches[0], None
        if matches:
            return None, f"ambiguous abbreviation of {', '.join(matches[:4])}"
    return None, f"vLLM {table()['vllm']} has no option {base}"


def scan(args: list[str]) -> list[ArgToken]:
    """Split an argv fragment into options with their values, reporting what vLLM would refuse."""
    out: list[ArgToken] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not _looks_like_flag(token):
            out.append(ArgToken(i, token, problem=f"{token!r} is a value without an option before it"))
            i += 1
            continue
        name, has_value = token.split("=", 1)[0], "=" in token
        option, problem = resolve(name)
        if option is None:
            out.append(ArgToken(i, token, problem=problem))
            i += 1
            continue
        nargs = options()[option]["nargs"]
        dest = dest_of(option)
        following = 0
        if not has_value and nargs != "0":
            while i + 1 + following < len(args) and not _looks_like_flag(args[i + 1 + following]):
                following += 1
                if nargs in ("1", "?"):
                    break
            if nargs in ("1", "+") and following == 0:
                problem = f"{option} needs a value"
        elif has_value and nargs == "0" and "." not in name:
            problem = f"{option} takes no value"
        out.append(ArgToken(i, token, option, dest, problem))
        i += 1 + following
    return out
