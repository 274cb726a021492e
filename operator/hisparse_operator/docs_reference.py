"""The documentation site's reference and troubleshooting pages, generated from the code so they cannot drift.

    python -m hisparse_operator.docs_reference [DOCS_DIR]     # rewrites the pages; prints the ones that changed

Each page is a pure function of :class:`Sources`, which :meth:`Sources.load` reads from what the product
itself uses:

- ``reference/crd.md``: every field of the CRD's openAPI schema (``crds/``: type, default, bounds, CEL rules);
- ``reference/values.md``: every chart value (``charts/hisparse/values.schema.json``);
- ``reference/cli.md``: every ``hisparse`` command and option (the typer app of ``hisparse_operator.cli``);
- ``reference/metrics.md``: the operator's prometheus-client objects (``controller/metrics.py``);
- ``reference/alerts.md``: the alert rules (``charts/hisparse/files/alerts.yaml``), each linking its runbook;
- ``reference/conditions.md``: the condition types (``api/status.py``) and every reason the operator writes
  (the constants of ``controller/conditions.py``, the model fetcher's reasons, the parity verdicts, the
  candidate-failure reasons);
- ``troubleshooting/reasons.md`` and ``troubleshooting/exit-codes.md``: what to check and how to fix each
  of those reasons and each exit code of the serving container (``engine/exit_codes.py``) and the fetcher.

The advice is written here, keyed by the names the code defines; generating fails when the code has a
reason or exit code without advice, or advice names one the code no longer has. ``operator/tests/
test_docs_reference.py`` regenerates every page and fails when one on disk differs.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import yaml

from hisparse_runtime.engine.versions import RUNTIME_UID

from .controller.model import POLL_SECONDS

REPO: Final = Path(__file__).resolve().parents[2]
DOCS_DIR: Final = REPO / "docs"
CRD_PATH: Final = REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml"
VALUES_SCHEMA_PATH: Final = REPO / "charts" / "hisparse" / "values.schema.json"
ALERTS_PATH: Final = REPO / "charts" / "hisparse" / "files" / "alerts.yaml"
PACKAGE: Final = Path(__file__).resolve().parent
RUNTIME_ENGINE: Final = REPO / "runtime" / "hisparse_runtime" / "engine"


# --- what the pages are made from ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Metric:
    """One prometheus-client object, as the exposition shows it."""

    name: str
    """The family name, as the exposition's ``# TYPE`` line names it (a counter's without ``_total``)."""
    kind: str
    """counter, gauge, histogram, summary, info, ..."""
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @classmethod
    def of(cls, obj: Any) -> Metric:
        buckets = tuple(b for b in getattr(obj, "_upper_bounds", ()) if b != float("inf"))
        return cls(obj._name, obj._type, obj._documentation, tuple(obj._labelnames), buckets)

    @property
    def series(self) -> tuple[str, ...]:
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "histogram":
            return tuple(f"{self.name}_{s}" for s in ("bucket", "sum", "count"))
        if self.kind == "summary":
            return tuple(f"{self.name}_{s}" for s in ("sum", "count"))
        if self.kind == "info":
            return (f"{self.name}_info",)
        return (self.name,)


@dataclasses.dataclass(frozen=True)
class Reason:
    """A reason constant of ``controller/conditions.py``: its Python name, value and docstring."""

    constant: str
    value: str
    doc: str = ""


@dataclasses.dataclass(frozen=True)
class Sources:
    crd: dict[str, Any]
    values_schema: dict[str, Any]
    alerts: dict[str, Any]
    cli: Any
    """The ``hisparse`` command as a click command (typer's)."""
    metrics: tuple[Metric, ...]
    condition_types: tuple[tuple[str, str], ...]
    """(type, meaning) in the contract's order."""
    reasons: tuple[Reason, ...]
    fetch_exit_codes: dict[str, int]
    preflight_exit_codes: dict[str, int]
    bad_settings_exit_code: int
    parity_reasons: tuple[str, ...]
    failure_reasons: tuple[str, ...]
    runtime: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``python -m hisparse_runtime.reference``: the in-pod commands and the vLLM plugin's metrics."""

    @classmethod
    def load(cls) -> Sources:
        import typer.main
        from prometheus_client.metrics import MetricWrapperBase

        from hisparse_runtime.engine import exit_codes
        from hisparse_runtime.engine.model import FETCH_EXIT_CODES

        from . import cli
        from .controller import failure, metrics

        return cls(
            crd=yaml.safe_load(CRD_PATH.read_text()),
            values_schema=json.loads(VALUES_SCHEMA_PATH.read_text()),
            alerts=yaml.safe_load(ALERTS_PATH.read_text()),
            cli=typer.main.get_command(cli.app),
            metrics=tuple(Metric.of(v) for v in vars(metrics).values() if isinstance(v, MetricWrapperBase)),
            condition_types=condition_types((PACKAGE / "api" / "status.py").read_text()),
            reasons=reasons((PACKAGE / "controller" / "conditions.py").read_text()),
            fetch_exit_codes=dict(FETCH_EXIT_CODES),
            preflight_exit_codes=dict(exit_codes.PREFLIGHT_EXIT_CODES),
            bad_settings_exit_code=exit_codes.BAD_SETTINGS_EXIT_CODE,
            parity_reasons=parity_reasons((RUNTIME_ENGINE / "parity.py").read_text(),
                                          (PACKAGE / "controller" / "rollout.py").read_text()),
            failure_reasons=tuple(sorted(failure.FAILING_WAITING_REASONS)) + failure_extra_reasons(
                (PACKAGE / "controller" / "failure.py").read_text()),
            runtime=runtime_reference(),
        )


def runtime_reference() -> dict[str, Any]:
    """The runtime's own description of its commands and metrics, from a child process: the operator may not
    import the runtime's CLI or plugin (import-linter's first contract)."""
    import os
    import subprocess

    # Some defaults follow the pod's variables (the side-channel host, ports): the page shows the unset ones.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HISPARSE_"))}
    env["VLLM_TARGET_DEVICE"] = "cpu"
    out = subprocess.run([sys.executable, "-m", "hisparse_runtime.reference"], capture_output=True, text=True,
                         check=True, env=env)
    return dict(json.loads(out.stdout))


def reasons(source: str) -> tuple[Reason, ...]:
    """Every ``NAME: Final = "Value"`` of ``conditions.py``, with the docstring that follows it."""
    body = ast.parse(source).body
    out = []
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else ""
            out.append(Reason(node.target.id, node.value.value, _one_paragraph(str(doc))))
    return tuple(out)


def condition_types(source: str) -> tuple[tuple[str, str], ...]:
    """The ``ConditionType`` literal of ``api/status.py`` and, per type, its bullet in the docstring below it."""
    body = ast.parse(source).body
    for i, node in enumerate(body):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ConditionType" for t in node.targets):
            names = [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            doc = body[i + 1].value.value  # type: ignore[attr-defined]
            bullets = {}
            for item in re.split(r"\n- ", "\n" + doc.split("\n- ", 1)[1]) if "\n- " in doc else []:
                head = re.match(r"\s*((?:``\w+``(?:\s*/\s*)?)+)(:\s*)?", item)
                if head:
                    for name in re.findall(r"``(\w+)``", head.group(1)):
                        bullets[name] = _one_paragraph(item[head.end():])
            return tuple((n, bullets.get(n, "")) for n in names)
    raise ValueError("api/status.py has no ConditionType")


def parity_reasons(engine_parity: str, rollout: str) -> tuple[str, ...]:
    """Reasons a parity verdict fails with: the rules ``engine.parity.judge`` returns, and the operator's own
    (``Verdict("failed", ...)`` and the deadline's ``reason="TimedOut"``)."""
    judged = re.findall(r'return "([A-Z]\w+)", ', engine_parity)
    own = re.findall(r'Verdict\("failed", "([A-Z]\w+)"', rollout) + re.findall(r'_parity\([^)]*reason="([A-Z]\w+)"', rollout)
    found = tuple(dict.fromkeys(judged + own))
    if len(judged) < 3 or len(own) < 2:
        raise ValueError(f"the parity reasons moved (found {found}): update docs_reference.parity_reasons")
    return found


def failure_extra_reasons(source: str) -> tuple[str, ...]:
    """The reasons ``controller/failure.py`` gives besides the kubelet's waiting reasons."""
    found = tuple(dict.fromkeys(r for line in source.splitlines() if "return PodFailure(" in line
                                for r in re.findall(r'"([A-Z][A-Za-z]+)"', line)))
    if not found:
        raise ValueError("controller/failure.py names no PodFailure reason: update docs_reference.failure_extra_reasons")
    return found


# --- Markdown helpers ----------------------------------------------------------------------------------

_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_ESCAPE = str.maketrans({"\\": "\\\\", "*": "\\*", "[": "\\[", "]": "\\]", "{": "\\{", "}": "\\}",
                         "<": "&lt;", ">": "&gt;"})


def _one_paragraph(text: str) -> str:
    return " ".join(text.split())


def md(text: str | None) -> str:
    """Prose from the code as one Markdown paragraph: code spans kept (RST's double backticks too),
    everything else escaped, so that ``<name>`` or ``VLLM_*`` is shown as written."""
    text = _one_paragraph(text or "")
    out, pos = [], 0
    for m in _CODE.finditer(text):
        out.append(text[pos:m.start()].translate(_ESCAPE))
        out.append(code(m.group(2)))
        pos = m.end()
    out.append(text[pos:].translate(_ESCAPE))
    return "".join(out)


def code(value: Any) -> str:
    """An inline code span holding ``value`` exactly (backticks inside are fenced by longer runs)."""
    text = value if isinstance(value, str) and value else json.dumps(value, separators=(", ", ": "))
    run = max((len(r) for r in re.findall(r"`+", text)), default=0) + 1
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{'`' * run}{pad}{text}{pad}{'`' * run}"


def cell(text: str) -> str:
    """Text inside a table cell: pipes escaped (code spans included: Python-Markdown's tables read them)."""
    return text.replace("|", "\\|").replace("\n", " ")


def anchor(ident: str) -> str:
    return f'<a id="{ident}"></a>'


def header(*sources: str) -> str:
    where = ", ".join(f"`{s}`" for s in sources)
    return (f"<!-- Generated by `python -m hisparse_operator.docs_reference` from {where}. Do not edit: change the "
            "source and regenerate (operator/tests/test_docs_reference.py fails when this page is stale). -->\n\n")


# --- CRD -------------------------------------------------------------------------------------------------


def _type_of(s: dict[str, Any]) -> str:
    if s.get("x-kubernetes-int-or-string"):
        return "integer or string"
    if s.get("x-kubernetes-preserve-unknown-fields") and not s.get("properties"):
        return "object (any fields)"
    t = s.get("type", "any")
    if t == "array":
        return f"array of {_type_of(s.get('items') or {})}"
    if t == "object" and isinstance(s.get("additionalProperties"), dict):
        return f"map of string to {_type_of(s['additionalProperties'])}"
    return str(t)


def _bounds(s: dict[str, Any]) -> list[str]:
    out = []
    for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in s and not isinstance(s[key], bool):
            out.append(f"{word} {code(s[key])}")
    if s.get("exclusiveMinimum") is True and "minimum" in s:  # draft-4 style
        out[0] = f"> {code(s['minimum'])}"
    for key, word in (("minLength", "at least {} characters"), ("maxLength", "at most {} characters"),
                      ("minItems", "at least {} items"), ("maxItems", "at most {} items"),
                      ("minProperties", "at least {} keys"), ("maxProperties", "at most {} keys")):
        if key in s:
            out.append(word.format(s[key]))
    if "enum" in s:
        out.append("one of " + ", ".join(code(v) for v in s["enum"]))
    if "pattern" in s:
        out.append(f"matches {code(s['pattern'])}")
    if s.get("x-kubernetes-list-type"):
        keys = s.get("x-kubernetes-list-map-keys")
        out.append(f"list type {code(s['x-kubernetes-list-type'])}" + (f" keyed by {', '.join(code(k) for k in keys)}" if keys else ""))
    return out


@dataclasses.dataclass(frozen=True)
class Field:
    path: str
    """Shown, e.g. ``spec.rollout.steps[].weight``."""
    ident: str
    """Anchor: the path without ``[]``, e.g. ``spec.rollout.steps.weight``."""
    schema: dict[str, Any]
    required: bool
    depth: int


def crd_fields(schema: dict[str, Any], path: str, ident: str, depth: int = 0) -> Iterator[Field]:
    """Every field under ``schema`` (its properties, array items' properties, map values' properties)."""
    required = set(schema.get("required") or [])
    for name, child in (schema.get("properties") or {}).items():
        p, i = f"{path}.{name}" if path else name, f"{ident}.{name}" if ident else name
        yield Field(p, i, child, name in required, depth)
        yield from _nested(child, p, i, depth + 1)


def _nested(s: dict[str, Any], path: str, ident: str, depth: int) -> Iterator[Field]:
    if s.get("properties"):
        yield from crd_fields(s, path, ident, depth)
    items = s.get("items")
    if isinstance(items, dict):
        yield from _nested(items, f"{path}[]", ident, depth)
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _nested(extra, f"{path}.<key>", f"{ident}.key", depth)


def _field_block(f: Field, level: str) -> str:
    s = f.schema
    facts = [code(_type_of(s)), "required" if f.required else "optional"]
    if "default" in s:
        facts.append(f"default {code(s['default'])}")
    lines = [f"{level} {code(f.path)} {{#{f.ident}}}", "", " · ".join(facts), ""]
    if s.get("description"):
        lines += [md(s["description"]), ""]
    bounds = _bounds(s) + (_bounds(s["items"]) if isinstance(s.get("items"), dict) and not s["items"].get("properties") else [])
    if isinstance(s.get("additionalProperties"), dict) and not s["additionalProperties"].get("properties"):
        bounds += [f"values: {b}" for b in _bounds(s["additionalProperties"])]
    for b in bounds:
        lines.append(f"- {b}")
    for rule in s.get("x-kubernetes-validations") or []:
        where = f" (at {code(f.path + rule['fieldPath'])})" if rule.get("fieldPath") else ""
        lines.append(f"- rule {code(rule['rule'])}{where}: {md(rule.get('message') or rule.get('messageExpression') or '')}")
    if bounds or s.get("x-kubernetes-validations"):
        lines.append("")
    return "\n".join(lines)


def crd_page(src: Sources) -> str:
    crd = src.crd
    names = crd["spec"]["names"]
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    group = crd["spec"]["group"]
    out = [header(f"crds/{CRD_PATH.name}"), f"# {names['kind']} API reference\n\n"]
    out.append(f"`apiVersion: {group}/{version['name']}`, `kind: {names['kind']}`, {crd['spec']['scope'].lower()}; "
               f"plural `{names['plural']}`, short names {', '.join(code(n) for n in names.get('shortNames', []))}. "
               f"{md(root.get('description'))} `kubectl explain {names['shortNames'][0]}.spec` shows the same "
               "descriptions in a cluster.\n\n")
    out.append("Each field below gives its type, whether it is required, its default and every rule the apiserver "
               "checks (bounds, patterns, enumerations and CEL rules with their messages). The admission webhook and "
               "`hisparse validate` check more (every engine constraint, and with node facts the fit of the host "
               "pool); those errors name the same paths.\n\n")
    cols = version.get("additionalPrinterColumns") or []
    if cols:
        out.append("## Columns of `kubectl get`\n\n| column | JSONPath | shown | description |\n|---|---|---|---|\n")
        for c in cols:
            shown = "with `-o wide`" if c.get("priority") else "always"
            out.append(f"| {c['name']} | {cell(code(c['jsonPath']))} | {shown} | {cell(md(c.get('description', '')))} |\n")
        out.append("\n")
    for top in ("spec", "status"):
        node = root["properties"].get(top)
        if not node:
            continue
        out.append(f"## `{top}`\n\n{md(node.get('description'))}\n\n")
        required = set(node.get("required") or [])
        for name, child in (node.get("properties") or {}).items():
            f = Field(f"{top}.{name}", f"{top}.{name}", child, name in required, 0)
            out.append(_field_block(f, "###") + "\n")
            for sub in _nested(child, f.path, f.ident, 1):
                out.append(_field_block(sub, "####") + "\n")
    return "".join(out).rstrip() + "\n"


# --- chart values ----------------------------------------------------------------------------------------


def _resolve(schema: dict[str, Any], s: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the schema ``s`` stands for, the ``$defs`` name it came from), folding ``anyOf [X, null]``."""
    ref = None
    if "$ref" in s:
        ref = s["$ref"].rsplit("/", 1)[-1]
        s = {**schema["$defs"][ref], **{k: v for k, v in s.items() if k != "$ref"}}
    branches = [b for b in s.get("anyOf", []) if b.get("type") != "null"]
    if "anyOf" in s and len(branches) == 1:
        inner, inner_ref = _resolve(schema, branches[0])
        s = {**inner, **{k: v for k, v in s.items() if k != "anyOf"}, "nullable": True}
        ref = ref or inner_ref
    return s, ref


def _value_type(schema: dict[str, Any], s: dict[str, Any]) -> str:
    s, _ = _resolve(schema, s)
    if "anyOf" in s:
        return " or ".join(_value_type(schema, b) for b in s["anyOf"])
    t = s.get("type", "any")
    if isinstance(t, list):
        t = " or ".join(t)
    if t == "array":
        return f"array of {_value_type(schema, s.get('items') or {})}"
    if t == "object" and isinstance(s.get("additionalProperties"), dict):
        return f"map of string to {_value_type(schema, s['additionalProperties'])}"
    return str(t) + (" or null" if s.get("nullable") else "")


def values_page(src: Sources) -> str:
    schema = src.values_schema
    out = [header(f"charts/hisparse/{VALUES_SCHEMA_PATH.name}"), "# Chart values\n\n"]
    out.append(f"{md(schema.get('description'))} Every key, from the chart's values schema "
               "(which Helm checks on `install`, `upgrade` and `template`: unknown keys and bad values are refused). "
               "Set them with `helm install --set` or a values file; each heading below is a key.\n\n")
    seen: dict[str, str] = {}

    def walk(s: dict[str, Any], path: str, level: int) -> Iterator[str]:
        for name, child in (s.get("properties") or {}).items():
            p = f"{path}.{name}" if path else name
            yield from entry(child, p, level)

    def entry(child: dict[str, Any], p: str, level: int) -> Iterator[str]:
        r, ref = _resolve(schema, child)
        heading = "##" if level == 0 else "####"
        facts = [code(_value_type(schema, child))]
        if "default" in r:
            facts.append(f"default {code(r['default'])}")
        block = [f"{heading} {code(p)} {{#{p}}}", "", " · ".join(facts), ""]
        if r.get("description"):
            block += [md(r["description"]), ""]
        for b in _bounds(r):
            block.append(f"- {b}")
        if r.get("additionalProperties") is False and r.get("properties"):
            block.append("- no other keys")
        block.append("")
        if ref and r.get("properties") and ref in seen and seen[ref] != p:
            block.insert(-1, f"- keys as under [{code(seen[ref])}](#{seen[ref]})")
            yield "\n".join(block) + "\n"
            return
        if ref and r.get("properties"):
            seen.setdefault(ref, p)
        yield "\n".join(block) + "\n"
        if r.get("properties"):
            yield from walk(r, p, level + 1)
        items = r.get("items")
        if isinstance(items, dict):
            ri, iref = _resolve(schema, items)
            if ri.get("properties"):
                if iref in seen:
                    yield f"Each item has the keys of [{code(seen[iref])}](#{seen[iref]}).\n\n"
                else:
                    if iref:
                        seen[iref] = f"{p}[]"
                    for name, grand in ri["properties"].items():
                        yield from entry(grand, f"{p}[].{name}", level + 1)

    # Anchors may not hold "[]": an item's key is anchored as "<list>.<key>".
    text = "".join(walk(schema, "", 0))
    text = re.sub(r"\{#([^}]*)\[\]([^}]*)\}", r"{#\1\2}", text)
    text = re.sub(r"\]\(#([^)]*)\[\]\)", r"](#\1)", text)
    out.append(text)
    return "".join(out).rstrip() + "\n"


# --- CLI -------------------------------------------------------------------------------------------------


def _commands(cmd: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, cmd
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        yield from _commands(sub, (*path, name))


def _param_type(p: Any) -> str:
    """The value's type as ``--help`` words it (typer keeps the annotation; click keeps a type object)."""
    import enum

    ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return " \\| ".join(code(m.value) for m in ann)
    name = {Path: "path", str: "text", int: "integer", float: "number", bool: "boolean"}.get(ann)  # type: ignore[call-overload]
    if name is None:
        t = getattr(p, "type", None)
        name = getattr(t, "name", None) or getattr(ann, "__name__", None) or str(ann)
    lo, hi = getattr(p, "min", None), getattr(p, "max", None)
    if lo is not None or hi is not None:
        name += f" {lo if lo is not None else ''}..{hi if hi is not None else ''}"
    return name


def cli_page(src: Sources) -> str:
    out = [header("operator/hisparse_operator/cli.py", "operator/hisparse_operator/rollout_cli.py"), "# `hisparse` CLI\n\n"]
    root = src.cli
    out.append(f"{md(root.help)} Installed as `hisparse` and as the kubectl plugin `kubectl-hisparse` "
               "(`kubectl hisparse rollout promote NAME`). `--help` on any command prints the same text.\n\n")
    out.append("Exit codes: 0 success; 1 a check failed or a command refused (every problem printed, one per "
               "line, with its field path); 2 the input cannot be read (a file, a YAML stream, a usage error).\n\n")
    for path, cmd in _commands(root, ("hisparse",)):
        if len(path) == 1:
            continue
        ident = "-".join(path)
        group = bool(getattr(cmd, "commands", None))
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        opts = [p for p in cmd.params if p.param_type_name == "option" and p.name != "help"]
        usage = " ".join(path) + (" COMMAND" if group else "") + (" [OPTIONS]" if opts else "") + "".join(
            f" {(a.metavar or a.name).upper()}" if a.required else f" [{(a.metavar or a.name).upper()}]" for a in args)
        out.append(f"## `{' '.join(path)}` {{#{ident}}}\n\n```\n{usage}\n```\n\n")
        help_text = (cmd.help or "").split("\f")[0]
        out.append(f"{md(help_text)}\n\n")
        if group:
            out.append("Commands: " + ", ".join(f"[`{n}`](#{ident}-{n})" for n in sorted(cmd.commands)) + ".\n\n")
        if args or opts:
            out.append("| argument or option | type | default | description |\n|---|---|---|---|\n")
        for a in args:
            out.append(f"| {anchor(f'{ident}-{a.name}')}`{(a.metavar or a.name).upper()}` | {cell(_param_type(a))} | "
                       f"{'required' if a.required else cell(code(a.default)) if a.default is not None else ''} | "
                       f"{cell(md(getattr(a, 'help', '') or ''))} |\n")
        for o in opts:
            spell = " / ".join(code(s) for s in [*o.opts, *o.secondary_opts])
            kind = "flag" if o.is_flag else _param_type(o) + (" (repeatable)" if o.multiple else "")
            default = "required" if o.required else (
                cell(code(o.default)) if o.default not in (None, (), []) and not callable(o.default) else "")
            env = f" Environment: {code(o.envvar)}." if o.envvar else ""
            flag = o.opts[0].lstrip("-")
            out.append(f"| {anchor(f'{ident}-{flag}')}{cell(spell)} | {cell(kind)} | {default} | "
                       f"{cell(md(o.help or ''))}{env} |\n")
        out.append("\n")
    return "".join(out).rstrip() + "\n"


# --- metrics ---------------------------------------------------------------------------------------------


def metrics_page(src: Sources) -> str:
    out = [header("operator/hisparse_operator/controller/metrics.py"), "# Operator metrics\n\n"]
    out.append("Served by every operator replica on the metrics port (chart value `metrics.port`), scraped by the "
               "chart's ServiceMonitor (`monitoring.serviceMonitor.enabled`). Series of one deployment carry "
               "`namespace` and `name` and are dropped when the deployment is deleted. The serving pods' own "
               "series (vLLM's `vllm:*`, the runtime plugin's `hisparse_*`, the EPP's) are scraped through the "
               "PodMonitors the operator renders; see [Monitoring and alerts](../guides/monitoring.md).\n\n")
    out.append("| series | type | labels | meaning |\n|---|---|---|---|\n")
    for m in src.metrics:
        names = "<br>".join(code(s) for s in m.series)
        labels = ", ".join(code(lbl) for lbl in m.labels) or "none"
        extra = f" Buckets (s): {', '.join(f'{b:g}' for b in m.buckets)}." if m.buckets else ""
        out.append(f"| {anchor(m.series[0])}{names} | {m.kind} | {labels} | {cell(md(m.help))}.{extra} |\n")
    return "".join(out).rstrip() + "\n"


def runtime_page(src: Sources) -> str:
    out = [header("runtime/hisparse_runtime/cli.py", "runtime/hisparse_runtime/plugin/metrics.py"),
           "# Runtime: `hisparse-runtime` and the plugin's metrics\n\n"]
    out.append("The runtime image's entrypoint and in-pod tools. The operator renders every call of it (the serving "
               "container's `serve`, the probes, the model download Job's `fetch-model`, the parity Job's `parity`); "
               "you run it yourself only to debug a pod (`kubectl exec POD -c vllm -- hisparse-runtime ...`). "
               "`--help` on any command prints the same text. Listed from its argparse parser by "
               "`python -m hisparse_runtime.reference`.\n\n")
    for c in src.runtime.get("commands", []):
        ident = "runtime-" + "-".join(c["path"])
        out.append(f"## `hisparse-runtime {' '.join(c['path'])}` {{#{ident}}}\n\n{md(c['help'])}\n\n")
        if c["subcommands"]:
            subs = [s["path"][-1] for s in src.runtime["commands"] if s["path"][:-1] == c["path"]]
            out.append("Commands: " + ", ".join(f"[`{s}`](#{ident}-{s})" for s in subs) + ".\n\n")
        if c["options"]:
            out.append("| argument or option | type | default | description |\n|---|---|---|---|\n")
        for o in c["options"]:
            spell = " / ".join(code(f) for f in o["flags"])
            default = "required" if o["required"] else (cell(code(o["default"])) if o["default"] not in (None, []) else "")
            out.append(f"| {anchor(ident + '-' + o['flags'][0].lstrip('-'))}{cell(spell)} | {cell(o['kind'])} | {default} | "
                       f"{cell(md(o['help']))} |\n")
        out.append("\n")
    out.append("## Metrics of the vLLM plugin {#runtime-metrics}\n\n")
    out.append("vLLM loads the plugin (`vllm.general_plugins`) in every serving process; its series are served on "
               "vLLM's own `/metrics` beside `vllm:*` and scraped through the PodMonitors the operator renders. "
               "`hisparse_build_info` carries `version`, `vllm_version` and `kernels_version`; under vLLM's "
               "multiprocess metrics (`PROMETHEUS_MULTIPROC_DIR`) it is a gauge of 1 with the same labels.\n\n")
    out.append("| series | type | labels | meaning |\n|---|---|---|---|\n")
    for raw in src.runtime.get("metrics", []):
        m = Metric(raw["name"], raw["kind"], raw["help"], tuple(raw["labels"]))
        names = "<br>".join(code(s) for s in m.series)
        labels = ", ".join(code(lbl) for lbl in m.labels) or "none"
        out.append(f"| {anchor(m.series[0])}{names} | {m.kind} | {labels} | {cell(md(m.help.rstrip('.')))}. |\n")
    return "".join(out).rstrip() + "\n"


# --- alerts ----------------------------------------------------------------------------------------------


def alerts_page(src: Sources) -> str:
    out = [header(f"charts/hisparse/files/{ALERTS_PATH.name}", f"charts/hisparse/{VALUES_SCHEMA_PATH.name}"),
           "# Alerts\n\n"]
    out.append("The chart's PrometheusRule (`monitoring.prometheusRule.enabled`) carries these rules. Each links its "
               "runbook through `runbook_url` (`monitoring.prometheusRule.runbookBaseURL` + `<alert>.md`). Per alert, "
               "[`monitoring.prometheusRule.alerts.<name>`](values.md#monitoring.prometheusRule.alerts) takes "
               "`enabled`, `severity`, `for` and, where the expression ends in a threshold, `threshold`.\n\n")
    tunable = {}
    alerts_def = (src.values_schema.get("$defs") or {}).get("Alerts") or {}
    for name, s in (alerts_def.get("properties") or {}).items():
        r, _ = _resolve(src.values_schema, s)
        tunable[s.get("alias", name)] = "threshold" in (r.get("properties") or {})
    for group in src.alerts.get("groups") or []:
        out.append(f"## {group['name']}\n\n")
        for rule in group.get("rules") or []:
            name = rule.get("alert")
            if not name:
                continue
            ann = rule.get("annotations") or {}
            facts = [f"severity {code((rule.get('labels') or {}).get('severity', 'none'))}",
                     f"for {code(rule['for'])}" if rule.get("for") else "fires at once"]
            if tunable.get(name):
                facts.append(f"threshold: `monitoring.prometheusRule.alerts.{name}.threshold`")
            out.append(f"### {name} {{#{name}}}\n\n{' · '.join(facts)} · [runbook](../runbooks/{name}.md)\n\n")
            out.append(f"**{md(ann.get('summary', ''))}**\n\n{md(ann.get('description', ''))}\n\n")
            out.append(f"```promql\n{rule['expr'].strip()}\n```\n\n")
    return "".join(out).rstrip() + "\n"


# --- conditions, reasons, exit codes: the advice ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Advice:
    where: str
    """Which condition (and status) or field shows it, and whether an Event carries it."""
    meaning: str
    check: str = ""
    fix: str = ""


_DESCRIBE = "`kubectl describe hsd NAME -n NS` (conditions, Events)"
_EVENTS = "`kubectl get events -n NS --field-selector involvedObject.name=NAME`"
_CANDIDATE_PODS = ("`kubectl get pods -n NS -l serving.hisparse.dev/deployment=$(kubectl get hsd NAME -n NS -o "
                   "jsonpath='{.status.canary.fleet}')` (the candidate's pods; `.status.stableFleet`, or `NAME` "
                   "when it is unset, names the stable fleet's)")
_POD_EXIT = (f"{_CANDIDATE_PODS} and, for a pod that restarts, "
             "`kubectl get pod POD -n NS -o jsonpath='{.status.containerStatuses[*].lastState.terminated.exitCode}'` "
             "(an exit code from 30 up is a preflight check: [exit codes](exit-codes.md))")

CONDITION_ADVICE: Final[dict[str, Advice]] = {
    "Valid": Advice("`ConfigValid=True`", "The spec passed the API schema and every engine constraint, with the "
                    "cluster's node facts."),
    "InvalidSpec": Advice(
        "`ConfigValid=False` and `Ready=False`; a Warning Event",
        "The spec breaks an engine constraint the apiserver cannot check (the webhook refuses these when it "
        "runs; a spec stored with `webhook.failurePolicy: Ignore`, or one whose nodes changed, lands here). "
        "Nothing new is rendered or applied; what runs keeps running.",
        "The condition's message lists every field path with the rule and the fix. Locally: `hisparse validate "
        "FILE --nodes nodes.yaml` with `kubectl get nodes -o yaml > nodes.yaml`.",
        "Change the fields named. A host pool that no longer fits because nodes were cordoned or removed turns "
        "valid again once they return."),
    "ReplicasReady": Advice("`PrefillReady=True` / `DecodeReady=True`", "Every replica of the role has all its pods "
                            "ready (for decode: with a proven prefill -> decode KV transfer)."),
    "ReplicasNotReady": Advice(
        "`PrefillReady=False` / `DecodeReady=False`; a Warning Event",
        "Some replica of the role has a pod that is not ready. Model loads take 10 to 30 minutes on GPU nodes, "
        "so this is normal for a while after a start.",
        f"{_POD_EXIT}; `kubectl describe pod POD` for scheduling, image pulls and probes; the vLLM container's log.",
        "Fix what the pod shows: an unschedulable pod needs nodes matching the role's `nodeSelector` and GPU "
        "requests; a preflight exit code names the check; a crash in vLLM is in its log."),
    "WaitingForKVTransfer": Advice(
        "`DecodeReady=False`; a Warning Event",
        "Decode pods exist but are not ready: a decode pod is ready only after its readiness probe read a "
        "buffer a prefill pod published over NIXL and completed a prompt through the routing sidecar.",
        "`kubectl describe pod DECODE_POD`: the probe's message names each prefill pod's failure. Are prefill "
        "pods ready (`PrefillReady`)? Preflight's `nixl_side_channel` and `ucx_transports` checks run at start.",
        "Make a prefill pod ready; check `spec.kvTransfer.nixl.ucxTls` against the node's transports and that "
        "NetworkPolicies of your own let decode reach prefill."),
    "RoleNotDeployed": Advice("`PrefillReady=True`", "The deployment has no `spec.prefill`: decode prefills "
                              "locally (a decode-only deployment)."),
    "EndpointPickerAvailable": Advice("`RouterReady=True`", "The InferencePool exists and the EPP has an available "
                                      "replica."),
    "EndpointPickerUnavailable": Advice(
        "`RouterReady=False`; a Warning Event",
        "The InferencePool or the endpoint picker (EPP) Deployment `NAME-epp` is missing or has no available "
        "replica: llm-d cannot route to the deployment.",
        "`kubectl get deploy NAME-epp -n NS` and its pod's events and log; `kubectl get inferencepool NAME -n NS` "
        "(the Inference Extension CRDs must be installed).",
        "Install the Gateway API Inference Extension CRDs if absent; fix the EPP pod's scheduling "
        "(`spec.supportPods`) or image (`spec.routing.eppImage`)."),
    "RoutingDisabled": Advice("`RouterReady=True`", "`spec.routing.enabled` is false, a decode-only deployment "
                              "(with a prefill role it is refused): no InferencePool or EPP; clients use the Service "
                              "`NAME-serving`."),
    "GatewayNamed": Advice("`GatewayAdmitted=True`", "The NetworkPolicies admit the gateway to decode's serving "
                           "port and the EPP; the message lists the pods (namespace and labels) and networks."),
    "GatewayUnnamed": Advice(
        "`GatewayAdmitted=False`",
        "Routing and `spec.networkPolicy` are on and nothing names the gateway, so the policies admit none: "
        "where the network enforces NetworkPolicies, no request of a gateway reaches decode or the EPP.",
        "Where do your gateway's proxies run (`kubectl get pods -A -l gateway.networking.k8s.io/gateway-name`)?",
        "Set `spec.routing.gatewayRef` (its proxies are then the pods of its namespace with Gateway API's label "
        "for that Gateway), or `spec.networkPolicy.gatewayNamespaces` (and `gatewayPodLabels`), or "
        "`gatewayCIDRs` for proxies that are not pods."),
    "NoGatewayPolicy": Advice("`GatewayAdmitted=True`", "Routing or `spec.networkPolicy` is off: no rendered policy "
                              "stands between a gateway and the pods."),
    "AllReady": Advice("`Ready=True`", "Every role, the router and the model are ready: the deployment serves."),
    "ComponentsNotReady": Advice(
        "`Ready=False`; a Warning Event", "Something the deployment needs is not ready.",
        "The message lists the conditions it waits for (`ModelReady`, `PrefillReady`, `DecodeReady`, "
        "`RouterReady`); look those up here.", "Fix the conditions named."),
    "RollingOut": Advice("`Progressing=True`", "A revision is being rolled out (a first start, a `Recreate` "
                         "rollout, or a new revision that waits for its model while the stable one serves)."),
    "Stable": Advice("`Progressing=False`", "The revision in `status.stableRevision` serves and nothing is "
                     "being rolled out."),
    "PartiallyAvailable": Advice(
        "`Degraded=True`; a Warning Event",
        "Some replicas serve and others are not ready.",
        "`PrefillReady` and `DecodeReady` say which role; then the pods as for `ReplicasNotReady`.",
        "As for `ReplicasNotReady`."),
    "Healthy": Advice("`Degraded=False`", "No degradation."),
    "CanaryStarting": Advice(
        "`Progressing=True`",
        "The candidate fleet is starting and the parity gate waits for it to be ready (within "
        "`spec.rollout.readyTimeoutSeconds`, which also counts the model download).",
        f"{_CANDIDATE_PODS}; `ModelReady`.",
        "Nothing while the model loads. A candidate that never gets ready is rolled back at the deadline, one "
        "that definitely fails after `spec.rollout.progressDeadlineSeconds`."),
    "CanaryParity": Advice(
        "`Progressing=True`",
        "The parity Job compares the candidate's greedy tokens with the stable revision's (no traffic yet).",
        "`kubectl get jobs -n NS` (the parity Job) and its pod's log.",
        "Nothing; it ends with a pass or a rollback within `spec.rollout.parity.timeoutSeconds`."),
    "CanaryShifting": Advice("`Progressing=True`", "Parity passed; the steps replace stable replicas and shift "
                             "traffic by ready capacity. The message gives the step and the weight."),
    "CanaryPromoting": Advice("`Progressing=True`; a Normal Event when it starts", "Only for a rollout an earlier "
                              "operator started (its status names no candidate fleet): the stable fleet takes the "
                              "candidate's spec and its replicas back while the candidate fleet shrinks. A rollout "
                              "this operator starts promotes without it (`CanaryPromoted`)."),
    "CanaryRolledBack": Advice(
        "`Degraded=True`; a Warning Event naming the reason",
        "The candidate was rolled back (parity failed, a definitely failing or never-ready pod, a failed "
        "analysis, no verdict in time, or `abort`). The stable revision serves unchanged.",
        "The Event and `status.canary.message`; for parity `status.parity` (and the ConfigMap "
        "`NAME-parity-report`); for a failing pod `status.canary.failure`; for analysis `status.canary.analysis`.",
        "Fix the cause and change the spec (a new revision), or `hisparse rollout retry NAME` to run the same "
        "revision again. Runbook: [HiSparseCanaryRolledBack](../runbooks/HiSparseCanaryRolledBack.md)."),
    "UpgradeQueued": Advice(
        "`Progressing=True`",
        "This operator renders the stable spec as another revision (an upgrade that changes rendered pods) and "
        "would canary it, but `upgradeCanaries` (`HISPARSE_UPGRADE_CANARIES`) deployments already canary theirs. "
        "The stable fleet keeps running exactly as the earlier operator rendered it.",
        "`kubectl get hsd -A -o jsonpath='{range .items[?(@.status.canary.upgrade)]}{.metadata.namespace}/{.metadata.name} {.status.canary.phase}{\"\\n\"}{end}'` lists the upgrade canaries.",
        "Nothing: it starts when one of them ends (looked at every 30 s). To let more run at once, raise the "
        "chart's `upgradeCanaries` (0: no limit)."),
    "CanaryPaused": Advice(
        "`Progressing=True`",
        "The rollout holds: a `pause` step, `hisparse rollout pause`, a step waiting for a promote, or an "
        "inconclusive analysis (`status.canary.holdReason`).",
        "`hisparse rollout status NAME -n NS`.",
        "`hisparse rollout resume` (after a pause), `promote` (past a pause step, a hold or an inconclusive "
        "analysis) or `abort`."),
    "CanaryAnalysis": Advice(
        "`Progressing=True`; Normal and Warning Events per measurement that fails, errs or passes",
        "An analysis step measures its PromQL queries at the current weight.",
        "`status.canary.analysis`: each query's measurements, failures, errors and inconclusive counts.",
        "A query that errs (Prometheus unreachable, not one number) is retried; more errors in a row than "
        "`consecutiveErrorLimit` roll back: check `prometheusUrl` and the query."),
    "CanaryPromotionStalled": Advice(
        "`Degraded=True` and `Progressing=True`; a Warning Event",
        "In the `Promoting` of a rollout an earlier operator started, promotion cannot finish: replicas asked "
        "for are not ready within `readyTimeoutSeconds`, or a pod "
        "definitely fails. Both fleets keep serving by ready capacity; a revision that passed is not rolled back.",
        "The message names the pod, container and reason (`status.canary.failure`).",
        "Fix the cause (capacity, image, node) so that the promoted replicas become ready: `abort` is refused "
        "while promoting, and a new spec waits until the promotion ends."),
    "CanaryWindingDown": Advice("`Progressing=True`", "After a rollback or a supersede, the candidate's replicas "
                                "go back to the stable fleet; traffic leaves the candidate no faster than stable "
                                "capacity returns."),
    "CanarySuperseded": Advice("A Normal Event", "A new spec (or a revert) replaced the running canary; the outcome "
                               "`superseded` is counted in `hisparse_operator_canary_outcomes_total`."),
    "CanaryPromoted": Advice("A Normal Event", "The candidate is now `status.stableRevision` and its fleet, as it "
                             "is, the stable fleet (`status.stableFleet`): no pod was recreated; the old fleet's "
                             "objects are pruned."),
    "Cached": Advice("`ModelReady=True`", "The download Job filled the shared model cache with the revision. A "
                     "canary's Job also removed every older revision but the stable fleet's; the message lists "
                     "what the cache keeps."),
    "Downloading": Advice(
        "`ModelReady=False`; a Warning Event",
        "The download Job (or, with `NodeCache` or `PodEphemeral`, the pods' init containers) is filling the cache; serving "
        "workloads of this revision wait for it. With an unbound claim the message carries the scheduler's.",
        "`kubectl get job,pvc -n NS`; the Job pod's log shows progress. An unbound `NAME-model-cache` claim "
        "needs a StorageClass with ReadWriteMany.",
        "Wait, or give the claim a class that binds (`spec.model.cache.storageClassName`), or use "
        "`spec.model.cache.mode: NodeCache` where there is none."),
    "CredentialsMissing": Advice(
        "`ModelReady=False`; a Warning Event",
        "The Secret named in `spec.model.credentials.secretName`, or one of its keys (`HF_TOKEN`; "
        "`AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`), does not exist: the download cannot start.",
        "`kubectl get secret SECRET -n NS -o jsonpath='{.data}'` for the key names.",
        f"Create the Secret with the key in the deployment's namespace; while the download waits the operator "
        f"looks again every {POLL_SECONDS:g} s."),
    "CredentialsRefused": Advice(
        "`ModelReady=False`; the download Job failed without retrying",
        "The model source refused the credentials (or they grant no access to the repository).",
        "The Job pod's log (its last line is in the condition's message).",
        "Fix the token in the Secret, then delete the failed Job `NAME-model-HASH` so it runs again."),
    "DownloadFailed": Advice(
        "`ModelReady=False`; the Job gave up after its retries",
        "The download failed for another reason (network, the hub, a file that changed mid-download).",
        "The condition's message (the fetcher's last line) and the Job pod's log.",
        "Fix the cause and delete the failed Job; a new one resumes what was downloaded."),
    "FetchedByPods": Advice("`ModelReady=True`", "`spec.model.cache.mode: NodeCache` or `PodEphemeral`: each serving "
                            "pod downloads the model in its `fetch-model` init container (with `NodeCache`, only "
                            "what its node's cache lacks); none is downloading now."),
    "ReadInPlace": Advice("`ModelReady=True`", "A `pvc://` or `s3://` source: the weights are read where they are, "
                          "nothing is cached."),
    "RolloutControl": Advice(
        "An Event (Normal when acted on, Warning when refused)",
        "A rollout control (`serving.hisparse.dev/rollout-action`) was handled: pause, resume, promote, abort, "
        "retry, or refused in the current phase.",
        "The Event's message; `status.canary.handledAction`.",
        "A refused control says why (`abort` in the `Promoting` of a rollout an earlier operator started, `promote` before parity passed, `retry` of a "
        "revision that was not rolled back)."),
    "RolloutHeld": Advice(
        "`Progressing=False`; a Warning Event",
        "The rollout cannot act safely: the stable revision's snapshot (ControllerRevision) is missing, or it no "
        "longer renders its revision and keeps no rendering of its pods that this operator can put in place "
        "(a snapshot an operator before chart 0.2.0 wrote, after an upgrade that changes rendered pods), or "
        "`status.canary` cannot be read. Nothing is applied or pruned.",
        "The message says what is wrong and the fix.",
        "After an operator upgrade over such a snapshot: patch `spec.rollout.strategy` to `Recreate`, let it roll, "
        "then set `Canary` back (see [Upgrading](../guides/upgrading.md)); `hisparse rollout promote` does not "
        "release this hold."),
}

FETCH_ADVICE: Final[dict[str, Advice]] = {
    "CredentialsRefused": CONDITION_ADVICE["CredentialsRefused"],
    "ModelNotFound": Advice(
        "`ModelReady=False`; the download Job failed without retrying",
        "The repository or the revision does not exist at the hub (`spec.model.endpoint`, else huggingface.co), "
        "or the credentials cannot see it. The stable revision keeps serving.",
        "`spec.model.source` and `spec.model.revision`; the Job pod's log.",
        "Correct the source or revision (a new revision), or the token; delete the failed Job to try again."),
    "DownloadFailed": CONDITION_ADVICE["DownloadFailed"],
    "CacheFull": Advice(
        "`ModelReady=False`",
        "The model cache volume has no room for the revision (claims are never resized down; a canary's Job "
        "removes older revisions only after its own download, and other strategies keep them).",
        "`kubectl get pvc NAME-model-cache -n NS`; `spec.model.sizeGiB` against the checkpoint's real size; with "
        "`NodeCache`, the node's disk under `spec.model.cache.nodePath`.",
        "Grow `spec.model.cache.sizeGiB` where the StorageClass allows expansion, then delete the failed Job."),
    "CacheNotWritable": Advice(
        "`ModelReady=False`; the serving pod's init container restarts with backoff",
        "`NodeCache`: the node's directory (`spec.model.cache.nodePath`, default `/var/lib/hisparse/model-cache`) "
        f"is missing (the kubelet then creates it owned by root) or not writable by the runtime's UID {RUNTIME_UID}.",
        "The condition's message names the path and the UID; `ls -ld PATH` on the node.",
        f"Create the directory on every node that may run serving pods, owned by {RUNTIME_UID}:{RUNTIME_UID} (the node setup in "
        "the model-artifacts guide); the init container succeeds at its next retry."),
}

PARITY_ADVICE: Final[dict[str, Advice]] = {
    "EndpointError": Advice("`status.parity.reason`", "Some prompts could not be compared: an endpoint of either "
                            "revision answered with an error.", "The report ConfigMap `NAME-parity-report` and "
                            "both fleets' decode and sidecar logs.", "Fix the failing side; `hisparse rollout retry`."),
    "Diverged": Advice("`status.parity.reason`", "The candidate's greedy tokens differ from the stable revision's "
                       "beyond a near-tie.", "`status.parity.firstDivergence` and the report ConfigMap.",
                       "Find what changes the numerics (model revision, dtype, kernels, attention backend, vLLM "
                       "build). See [HiSparseParityFailed](../runbooks/HiSparseParityFailed.md)."),
    "TooFewPrompts": Advice("`status.parity.reason`", "Fewer prompts were compared than "
                            "`spec.rollout.parity.prompts`.", "The report; a `promptsConfigMap` with fewer prompts.",
                            "Provide enough prompts, or lower `prompts`."),
    "NotEndToEnd": Advice("`status.parity.reason`", "With a prefill role, some comparison did not go prefill -> "
                          "NIXL -> decode through a prefill pod of its own revision.", "Both fleets' prefill pods and "
                          "the sidecar's log.", "Make prefill of both revisions ready and reachable from decode."),
    "TooManyNearTies": Advice("`status.parity.reason`", "More than `spec.rollout.parity.maxNearTieFraction` of the "
                              "prompts diverged at a near-tie: too frequent to be noise.", "`status.parity.nearTies`;"
                              " `parity.concurrency` above 1 on backends that are not batch invariant.",
                              "Lower `spec.rollout.parity.concurrency` to 1; otherwise treat it as a divergence."),
    "TooFewTokens": Advice("`status.parity.reason`", "Fewer tokens were compared than `spec.rollout.parity.minTokens` "
                           "(unset: a quarter of prompts x maxTokens): outputs too short to tell.",
                           "`status.parity.tokens`.", "Use prompts with longer answers or raise `maxTokens`."),
    "NoSummary": Advice("`status.parity.reason`", "The Job ended without a readable summary in its pod's "
                        "termination message: nothing counts as compared.", "The parity pod's log; its image "
                        "(`parity.image` in the chart, else the stable revision's).",
                        "Fix the parity image or its access to both fleets; `hisparse rollout retry`."),
    "JobFailed": Advice("`status.parity.reason`", "The Job failed although its summary broke no rule.",
                        "The Job's condition message and its pod's log.", "Fix the cause; `hisparse rollout retry`."),
    "TimedOut": Advice("`status.parity.reason`", "No verdict within `spec.rollout.parity.timeoutSeconds` of the "
                       "candidate being ready.", "Whether the parity Job's pod was scheduled (`supportPods`) and "
                       "how far its log got.", "Raise `timeoutSeconds`, lower `prompts` or `maxTokens`, or make "
                       "the Job's pod schedulable."),
}

FAILURE_ADVICE: Final[dict[str, Advice]] = {
    "CrashLoopBackOff": Advice("`status.canary.failure.reason`", "A candidate container keeps crashing.",
                               _POD_EXIT, "Fix the crash (a preflight exit code names the check)."),
    "CreateContainerConfigError": Advice("`status.canary.failure.reason`", "The kubelet cannot build the "
                                         "container's configuration (a missing Secret or ConfigMap key).",
                                         "`kubectl describe pod POD`.", "Create what is missing."),
    "CreateContainerError": Advice("`status.canary.failure.reason`", "The container runtime cannot create the "
                                   "container.", "`kubectl describe pod POD`.", "Fix what the message names."),
    "ErrImagePull": Advice("`status.canary.failure.reason`", "The image cannot be pulled.",
                           "The message names the image reference.", "Fix `spec.engine.image` or the pull Secret."),
    "ImagePullBackOff": Advice("`status.canary.failure.reason`", "Pulling the image keeps failing.",
                               "The message names the image reference.", "Fix `spec.engine.image` or the pull Secret."),
    "InvalidImageName": Advice("`status.canary.failure.reason`", "The image reference is malformed.",
                               "The message.", "Fix `spec.engine.image`."),
    "RepeatedExits": Advice("`status.canary.failure.reason`", "A container exited non-zero three times and is not "
                            "ready.", _POD_EXIT, "Fix the cause of the exits."),
    "Unschedulable": Advice("`status.canary.failure.reason`", "The scheduler cannot place a candidate pod.",
                            "The scheduler's message (in the failure).", "Free or add nodes matching the role's "
                            "`nodeSelector` and GPU requests; the canary needs room for `spec.rollout.canary` "
                            "replicas per role beside the stable fleet."),
}

PREFLIGHT_ADVICE: Final[dict[str, Advice]] = {
    "engine_rules": Advice("vLLM container", "The mounted settings break an engine rule (the same rules as admission; "
                           "a ConfigMap changed by hand, or an image of another version).",
                           "The container's log lists each rule.", "Let the operator render the ConfigMap again; use "
                           "the runtime image of the operator's release."),
    "model_config": Advice("vLLM container", "The model's `config.json` disagrees with the declared sparse facts "
                           "(`index_topk`, `index_topk_freq`, `indexer_types`, architecture), or is missing.",
                           "The log names each difference.", "Set `spec.model.indexTopk`, `indexTopkFreq`, "
                           "`indexerTypes` or `architecture` to the checkpoint's values."),
    "gpu": Advice("vLLM container", "Fewer GPUs visible than TP x local DP ranks, or a GPU this image does not "
                  "support (Hopper and Blackwell are).", "`nvidia-smi` on the node; the device plugin.",
                  "Request the GPUs the role needs; schedule on H100/H200/B200 nodes."),
    "compiled_ops": Advice("vLLM container", "vLLM's HiSparse ops or the project's compiled kernels do not load.",
                           "The log names the missing ops.", "Use the runtime image built for this vLLM release "
                           "(`runtime/Dockerfile`)."),
    "memlock": Advice("vLLM container", "`RLIMIT_MEMLOCK` is below the pinned host memory this pod needs and "
                      "the process holds no `CAP_IPC_LOCK`.", "The log gives the limit and the need.",
                      "Raise the container runtime's memlock limit (containerd `LimitMEMLOCK=infinity`), or keep "
                      "`spec.engine.ipcLock` on."),
    "host_memory": Advice("vLLM container", "The node's available memory (or the container's limit) is below the "
                          "host pools of the local DP ranks plus headroom.", "The log gives both numbers.",
                          "Lower `spec.decode.hisparse.hostPoolGiB`, or schedule on nodes with free memory."),
    "shm": Advice("vLLM container", "`/dev/shm` is smaller than needed.", "The log gives the size.",
                  "Raise the role's `shmSize`."),
    "nixl_side_channel": Advice("vLLM container", "`VLLM_NIXL_SIDE_CHANNEL_HOST` is a loopback address or not this "
                                "pod's address.", "The pod's environment.", "Do not override it: the render sets it "
                                "from the pod IP (downward API)."),
    "ucx_transports": Advice("vLLM container", "The transports in `UCX_TLS` are not available on the node, or NIXL "
                             "could not move bytes in-process.", "The log lists the available transports.",
                             "Set `spec.kvTransfer.nixl.ucxTls` to transports the node has, or fix its drivers."),
    "rdma_devices": Advice("vLLM container", "Fewer RDMA verbs devices in `/dev/infiniband` than `rdma.count` asks "
                           "for, or a device Mooncake's `deviceName` names is not among them.",
                           "The log lists the devices the pod sees; the node's RDMA device plugin and its resource.",
                           "Request the plugin's resource in `spec.<role>.rdma` (the device plugin mounts the devices), "
                           "or name the pod's devices in `spec.kvTransfer.mooncake.deviceName`."),
    "host_placement": Advice("vLLM container", "`HISPARSE_HOST_PLACEMENT` names an unknown policy, or this vLLM lacks "
                             "the host-pool hook it patches.", "The pod's environment.",
                             "Unset it, or use the runtime image built for vLLM 0.33."),
    "moe_backend": Advice("vLLM container", "The MoE backend was rendered for another GPU family than the pod got "
                          "(the role's `nodeSelector` `nvidia.com/gpu.product` and the node disagree), or it is "
                          "refused on this GPU.", "The log names the GPU and the backend.",
                          "Fix the role's `nodeSelector` or the node's labels."),
    "model_cache": Advice("vLLM container", "The cached model's marker is missing, names another revision, or lists "
                          "a file that changed.", "`ModelReady` on the deployment; the fetch-model Job's or init "
                          "container's log.", "Let the download finish; delete a failed Job to fill the cache again."),
    "decode_kernels": Advice("vLLM container (decode)", "`spec.decode.hisparse.kernels: hisparse` asks for the "
                             "project's kernels, and they cannot serve vLLM's HiSparse ops here (no GPU, a schema "
                             "difference, or the proving call failed).", "The log names the op and the difference.",
                             "Use the runtime image whose kernels were built for this vLLM release, or set "
                             "`spec.decode.hisparse.kernels: vllm`."),
}


def _require(kind: str, advice: dict[str, Advice], names: list[str] | tuple[str, ...]) -> None:
    missing, extra = [n for n in names if n not in advice], sorted(set(advice) - set(names))
    if missing or extra:
        raise ValueError(f"docs_reference: {kind} without advice {missing}, advice for unknown {kind} {extra}: "
                         "update the advice tables in hisparse_operator/docs_reference.py")


def conditions_page(src: Sources) -> str:
    reasons_ = [r.value for r in src.reasons]
    _require("condition reasons", CONDITION_ADVICE, reasons_)
    out = [header("operator/hisparse_operator/api/status.py", "operator/hisparse_operator/controller/conditions.py",
                  "runtime/hisparse_runtime/engine/model.py", "runtime/hisparse_runtime/engine/parity.py",
                  "operator/hisparse_operator/controller/failure.py"), "# Conditions and reasons\n\n"]
    out.append("`status.conditions` holds one condition of each type, each with `observedGeneration`. Every change of "
               "a condition's status or reason is also an Event on the HiSparseDeployment, with the condition's "
               "reason (Normal when healthy, Warning otherwise); the rollout adds Events of its own. "
               "[Troubleshooting](../troubleshooting/reasons.md) says what to check and how to fix each reason.\n\n")
    out.append("## Condition types\n\n| type | meaning |\n|---|---|\n")
    for name, meaning in src.condition_types:
        out.append(f"| {anchor(name)}`{name}` | {cell(md(meaning))} |\n")
    out.append("\n## Reasons of conditions and Events\n\n| reason | where it shows | meaning |\n|---|---|---|\n")
    for r in src.reasons:
        a = CONDITION_ADVICE[r.value]
        out.append(f"| [`{r.value}`](../troubleshooting/reasons.md#{r.value}) | {cell(md(a.where))} | "
                   f"{cell(md(a.meaning))} |\n")
    out.append("\n## Reasons of a failed model download\n\nThe first word of `hisparse-runtime fetch-model`'s "
               "termination message; the operator makes it `ModelReady`'s reason.\n\n| reason | exit code | meaning |\n"
               "|---|---|---|\n")
    for name, exit_code in src.fetch_exit_codes.items():
        out.append(f"| [`{name}`](../troubleshooting/reasons.md#fetch-{name}) | {exit_code} | "
                   f"{cell(md(FETCH_ADVICE[name].meaning))} |\n")
    out.append("\n## Reasons of a failed parity verdict (`status.parity.reason`)\n\n| reason | meaning |\n|---|---|\n")
    for name in src.parity_reasons:
        out.append(f"| [`{name}`](../troubleshooting/reasons.md#parity-{name}) | {cell(md(PARITY_ADVICE[name].meaning))} |\n")
    out.append("\n## Reasons of a definitely failing candidate pod (`status.canary.failure.reason`)\n\n"
               "| reason | meaning |\n|---|---|\n")
    for name in src.failure_reasons:
        out.append(f"| [`{name}`](../troubleshooting/reasons.md#failure-{name}) | "
                   f"{cell(md(FAILURE_ADVICE[name].meaning))} |\n")
    return "".join(out).rstrip() + "\n"


def _advice_block(ident: str, title: str, a: Advice, doc: str = "") -> str:
    lines = [f"### `{title}` {{#{ident}}}", "", f"*{md(a.where)}*", "", md(a.meaning)]
    if doc and _one_paragraph(doc) not in a.meaning:
        lines += ["", md(doc)]
    if a.check:
        lines += ["", f"**Check.** {md(a.check)}"]
    if a.fix:
        lines += ["", f"**Fix.** {md(a.fix)}"]
    return "\n".join(lines) + "\n\n"


def reasons_page(src: Sources) -> str:
    _require("condition reasons", CONDITION_ADVICE, [r.value for r in src.reasons])
    _require("fetch reasons", FETCH_ADVICE, list(src.fetch_exit_codes))
    _require("parity reasons", PARITY_ADVICE, src.parity_reasons)
    _require("candidate failure reasons", FAILURE_ADVICE, src.failure_reasons)
    out = [header("operator/hisparse_operator/controller/conditions.py", "runtime/hisparse_runtime/engine/model.py",
                  "runtime/hisparse_runtime/engine/parity.py", "operator/hisparse_operator/controller/failure.py",
                  "operator/hisparse_operator/docs_reference.py"), "# Reasons: what to check, how to fix\n\n"]
    out.append(f"Start with {_DESCRIBE} and {_EVENTS}. `NAME` and `NS` are the HiSparseDeployment's name and "
               "namespace. Reasons that only report progress or health have no fix.\n\n")
    out.append("## Conditions and Events\n\n")
    for r in src.reasons:
        out.append(_advice_block(r.value, r.value, CONDITION_ADVICE[r.value], r.doc))
    out.append("## Model download (`ModelReady`)\n\n")
    for name in src.fetch_exit_codes:
        out.append(_advice_block(f"fetch-{name}", name, FETCH_ADVICE[name]))
    out.append("## Parity verdicts (`status.parity.reason`)\n\nEach rolls the candidate back "
               "(`CanaryRolledBack`).\n\n")
    for name in src.parity_reasons:
        out.append(_advice_block(f"parity-{name}", name, PARITY_ADVICE[name]))
    out.append("## Definitely failing candidate pods (`status.canary.failure.reason`)\n\nFor "
               "`spec.rollout.progressDeadlineSeconds` without a break, these roll the candidate back in `Parity` and "
               "`Shifting`, and report `CanaryPromotionStalled` in the `Promoting` of a rollout an earlier operator "
               "started. A pod that runs and is not ready yet "
               "never counts.\n\n")
    for name in src.failure_reasons:
        out.append(_advice_block(f"failure-{name}", name, FAILURE_ADVICE[name]))
    return "".join(out).rstrip() + "\n"


def exit_codes_page(src: Sources) -> str:
    _require("preflight checks", PREFLIGHT_ADVICE, list(src.preflight_exit_codes))
    _require("fetch reasons", FETCH_ADVICE, list(src.fetch_exit_codes))
    out = [header("runtime/hisparse_runtime/engine/exit_codes.py", "runtime/hisparse_runtime/engine/model.py",
                  "operator/hisparse_operator/docs_reference.py"), "# Exit codes of the serving pods\n\n"]
    out.append("Before vLLM starts, `hisparse-runtime serve` runs preflight on the live node; a failed check exits "
               "with its code and vLLM never starts (all checks run, the first failing one in this order gives the "
               "code; the log lists every failure). The operator reads the code from the pod's last termination and "
               "exports it as [`hisparse_operator_preflight_failures`](../reference/metrics.md#"
               "hisparse_operator_preflight_failures) by role and check, which "
               "[HiSparsePreflightFailed](../reference/alerts.md#HiSparsePreflightFailed) alerts on.\n\n")
    out.append(f"{_POD_EXIT.replace(' (an exit code from 30 up is a preflight check: [exit codes](exit-codes.md))', '')} "
               "gives the code; `kubectl logs POD -c vllm --previous` the check's message, which names the "
               "value, the rule and the fix.\n\n")
    out.append(f"## Preflight\n\n### {src.bad_settings_exit_code}: unreadable settings {{#exit-{src.bad_settings_exit_code}}}\n\n"
               "The mounted settings cannot be read or break an engine rule before preflight starts. **Fix.** Let the "
               "operator render the engine ConfigMap again; use the runtime image of the operator's release.\n\n")
    for check, exit_code in src.preflight_exit_codes.items():
        a = PREFLIGHT_ADVICE[check]
        out.append(f"### {exit_code}: `{check}` {{#exit-{exit_code}}}\n\n*{md(a.where)}*\n\n{md(a.meaning)}\n\n"
                   f"**Check.** {md(a.check)}\n\n**Fix.** {md(a.fix)}\n\n")
    out.append("## Model download (`hisparse-runtime fetch-model`)\n\nThe download Job's (or, with `NodeCache` or `PodEphemeral`, the "
               "serving pods' init container's) exit codes; the reason is also `ModelReady`'s. The first two are "
               "not retried.\n\n| exit code | reason |\n|---|---|\n")
    for name, exit_code in src.fetch_exit_codes.items():
        out.append(f"| {exit_code} | [`{name}`](reasons.md#fetch-{name}) |\n")
    return "".join(out).rstrip() + "\n"


PAGES: Final[dict[str, Callable[[Sources], str]]] = {
    "reference/crd.md": crd_page,
    "reference/values.md": values_page,
    "reference/cli.md": cli_page,
    "reference/metrics.md": metrics_page,
    "reference/runtime.md": runtime_page,
    "reference/alerts.md": alerts_page,
    "reference/conditions.md": conditions_page,
    "troubleshooting/reasons.md": reasons_page,
    "troubleshooting/exit-codes.md": exit_codes_page,
}
"""Path under the docs directory -> the function that writes it."""


def generate(src: Sources | None = None) -> dict[str, str]:
    src = src or Sources.load()
    return {rel: page(src) for rel, page in PAGES.items()}


def stale(docs_dir: Path = DOCS_DIR, pages: dict[str, str] | None = None) -> list[str]:
    pages = generate() if pages is None else pages
    return [rel for rel, text in pages.items()
            if not (docs_dir / rel).is_file() or (docs_dir / rel).read_text() != text]


def write(docs_dir: Path = DOCS_DIR) -> list[str]:
    """Rewrite every page; returns the ones that changed."""
    pages = generate()
    changed = stale(docs_dir, pages)
    for rel in changed:
        (docs_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs_dir / rel).write_text(pages[rel])
    return changed


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS_DIR
    for rel in write(target):
        print(f"updated {target / rel}")
