"""The docs are code: the site builds with `mkdocs build --strict` (a missing page, a broken link or a link
to an anchor that no page has fails), the README's relative links resolve, links into this repository name
files that exist, and every CRD field path, chart value and `hisparse` command or flag the pages name exists."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsupport import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"
REPO_URL = "https://github.com/hisparse/hisparse/"
PAGES = sorted(DOCS.rglob("*.md"))


def _prose() -> Iterator[tuple[Path, str]]:
    for path in [README, *PAGES]:
        yield path, path.read_text()


def test_the_site_builds_strict(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    assert (tmp_path / "site" / "reference" / "crd" / "index.html").is_file()
    assert (tmp_path / "site" / "runbooks" / "HiSparseParityFailed" / "index.html").is_file()


def test_the_build_fails_on_a_missing_anchor(tmp_path: Path) -> None:
    """The negative control: a page linking to a CRD field that does not exist breaks the build."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(DOCS), str(docs)], check=True)
    (docs / "index.md").write_text((docs / "index.md").read_text() +
                                   "\nSee [`spec.rollout.warmup`](reference/crd.md#spec.rollout.warmup).\n")
    config["docs_dir"] = str(docs)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(tmp_path / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert run.returncode != 0
    assert "does not contain an anchor '#spec.rollout.warmup'" in run.stdout + run.stderr


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_readme_resolves() -> None:
    links = [target for target in _LINK.findall(README.read_text()) if not re.match(r"[a-z]+:|#", target)]
    assert links, "the README links into the docs"
    missing = [t for t in links if not (REPO / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to {missing}, which do not exist"


def test_links_into_this_repository_name_files_that_exist() -> None:
    pattern = re.compile(re.escape(REPO_URL) + r"(?:blob|tree)/main/([^)\s#>\"'`]+)")
    missing = [f"{path.relative_to(REPO)}: {m}" for path, text in _prose() for m in pattern.findall(text)
               if not (REPO / m).exists()]
    assert not missing, missing


def test_the_readme_keeps_its_two_commands_first() -> None:
    lines = README.read_text().splitlines()
    assert lines[5:9] == [
        "```bash",
        "./scripts/demo    # set everything up (cached), run the production example on a local cluster, and the CPU example for real",
        "./scripts/test    # run every test that runs without a GPU (what CI runs: .ci/run)",
        "```"]
    assert len(lines) <= 160, "the README is the front page: details belong in docs/"


# --- names the pages use exist -------------------------------------------------------------------------


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load((REPO / "crds" / "serving.hisparse.dev_hisparsedeployments.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _has_path(schema: dict[str, Any], parts: list[str], resolve=lambda s: s) -> bool:  # type: ignore[no-untyped-def]
    node = resolve(schema)
    for part in parts:
        while isinstance(node.get("items"), dict):
            node = resolve(node["items"])
        if node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties"):
            return True
        props = node.get("properties") or {}
        if part in props:
            node = resolve(props[part])
        elif isinstance(node.get("additionalProperties"), dict) or node.get("additionalProperties") is True:
            node = resolve(node["additionalProperties"]) if isinstance(node["additionalProperties"], dict) else {}
        else:
            return False
    return True


_FIELD = re.compile(r"(?<![\w./-])((?:spec|status)(?:\.[A-Za-z][A-Za-z0-9]*(?:\[\])?)+)")


def test_every_field_path_the_docs_name_is_in_the_crd() -> None:
    schema = _crd_schema()
    unknown = []
    for path, text in _prose():
        for found in set(_FIELD.findall(text)):
            parts = found.replace("[]", "").split(".")
            if not _has_path(schema, parts):
                unknown.append(f"{path.relative_to(REPO)}: {found}")
    assert not unknown, f"fields named in the docs that the CRD does not have: {sorted(unknown)}"


def _values_resolver() -> Any:
    schema = json.loads((REPO / "charts" / "hisparse" / "values.schema.json").read_text())

    def resolve(s: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in s:
            s = {**schema["$defs"][s["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in s.items() if k != "$ref"}}
        branches = [b for b in s.get("anyOf", []) if b.get("type") != "null"]
        if len(branches) == 1:
            s = {**resolve(branches[0]), **{k: v for k, v in s.items() if k != "anyOf"}}
        return s

    return schema, resolve


_SET = re.compile(r"--set(?:-string|-json)?[ =]'?([A-Za-z][\w.]*)=")


def test_every_chart_value_the_docs_set_is_in_the_values_schema() -> None:
    schema, resolve = _values_resolver()
    found = {(path, key) for path, text in _prose() for key in _SET.findall(text)}
    assert any(key == "monitoring.prometheusRule.enabled" for _, key in found)
    unknown = [f"{p.relative_to(REPO)}: --set {key}" for p, key in found if not _has_path(schema, key.split("."), resolve)]
    assert not unknown, f"chart values set in the docs that the chart does not have: {sorted(unknown)}"


def _commands() -> Any:
    import typer.main

    from hisparse_operator import cli

    return typer.main.get_command(cli.app)


_INVOCATION = re.compile(r"(?<![\w.-])hisparse((?: +[^\s`|;&>#\\]+)+)")


def test_every_hisparse_command_and_flag_the_docs_use_exists() -> None:
    root = _commands()
    checked, unknown = 0, []
    for path, text in _prose():
        for line in text.splitlines():
            for m in _INVOCATION.finditer(line):
                tokens, cmd, consumed = m.group(1).split(), root, []
                while tokens and tokens[0] in (getattr(cmd, "commands", None) or {}):
                    consumed.append(tokens[0])
                    cmd = cmd.commands[tokens.pop(0)]
                if not consumed:
                    continue  # "helm install hisparse charts/hisparse", a release name, prose
                checked += 1
                flags = {f for p in cmd.params for f in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}
                for token in tokens:
                    if token.startswith("--") and token.split("=")[0] not in flags | {"--help"}:
                        unknown.append(f"{path.relative_to(REPO)}: hisparse {' '.join(consumed)} {token}")
    assert checked > 20, checked
    assert not unknown, f"flags used in the docs that the CLI does not have: {sorted(set(unknown))}"


@pytest.mark.parametrize(("schema_path", "ok", "bad"), [
    ("crd", "spec.rollout.steps[].analysis.queries[].maxRatioToStable", "spec.rollout.steps[].analysis.maxRatio"),
    ("crd", "spec.decode.nodeSelector.anyKey", "spec.decode.hisparse.hostPool"),
])
def test_the_field_check_tells_a_field_from_a_typo(schema_path: str, ok: str, bad: str) -> None:
    schema = _crd_schema()
    assert _has_path(schema, ok.replace("[]", "").split("."))
    assert not _has_path(schema, bad.replace("[]", "").split("."))
