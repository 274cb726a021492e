"""Read YAML that upstream projects ship inside their Go modules.

``go mod download -json MODULE@VERSION`` fetches a module into the Go module
cache (once; later calls are offline) and prints its directory. Upstream CRDs
and KWOK's default Stages are read from there at runtime, so the repository
never carries copies that could drift from the pinned versions.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


class GoModuleError(RuntimeError):
    """A Go module could not be downloaded or lacks an expected file."""


@functools.cache
def module_dir(module: str, version: str) -> Path:
    go = shutil.which("go")
    if go is None:
        raise GoModuleError(f"'go' is not on PATH; it is needed to fetch {module}@{version}")
    # Outside any module, so no go.mod (or -mod flag) changes what is resolved.
    env = {**os.environ, "GOFLAGS": ""}
    out = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True, text=True, cwd="/", env=env, check=False, timeout=600,
    )
    try:
        info = json.loads(out.stdout)
    except json.JSONDecodeError:
        info = {"Error": out.stderr.strip() or f"exit status {out.returncode}"}
    if info.get("Error") or not info.get("Dir"):
        raise GoModuleError(f"go mod download {module}@{version}: {info.get('Error')}")
    return Path(info["Dir"])


def yaml_files(root: Path, paths: Iterable[str]) -> list[Path]:
    """Each path is a file or a directory whose ``*.yaml`` files are taken, sorted."""
    files: list[Path] = []
    for rel in paths:
        p = root / rel
        if p.is_dir():
            files.extend(sorted(p.glob("*.yaml")))
        elif p.is_file():
            files.append(p)
        else:
            raise GoModuleError(f"{rel} not found in {root}")
    return files


# libyaml parses the multi-megabyte CRD files about ten times faster.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_documents(files: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for f in files:
        with open(f) as fh:
            docs.extend(d for d in yaml.load_all(fh, Loader=_LOADER) if isinstance(d, dict))
    return docs


def kustomize_resources(directory: Path) -> list[Path]:
    """The plain ``resources:`` files a kustomization lists (no patches or generators)."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}
    files: list[Path] = []
    for res in kust.get("resources", []):
        p = (directory / res).resolve()
        files.extend(kustomize_resources(p) if p.is_dir() else [p])
    return files
