"""The CEL runtime, without its interactive shell.

``import cel`` also imports the package's REPL (prompt_toolkit, ~200 ms), which every ``hisparse``
command and webhook call would pay. The evaluator is the package's compiled extension ``cel.cel``;
load just that when the package is not imported yet, and register it under its own name, so a later
``import cel`` reuses it. The load holds a lock: it bypasses the import system's own locking, and a
second initialisation of the extension panics (its logger is process-wide), which the operator's
concurrent first reconciles would otherwise hit."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any


_LOAD = threading.Lock()


def _core() -> ModuleType:
    if "cel.cel" in sys.modules:
        return sys.modules["cel.cel"]
    with _LOAD:
        if "cel.cel" in sys.modules:
            return sys.modules["cel.cel"]
        return _load()


def _load() -> ModuleType:
    spec = importlib.util.find_spec("cel")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the CEL runtime (common-expression-language) is not installed")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        so = Path(spec.submodule_search_locations[0]) / f"cel{suffix}"
        if so.exists():
            loader = importlib.machinery.ExtensionFileLoader("cel.cel", str(so))
            module = importlib.util.module_from_spec(importlib.util.spec_from_loader("cel.cel", loader))
            loader.exec_module(module)
            sys.modules["cel.cel"] = module
            return module
    import cel  # an unusual layout: fall back to the package (slower import, same evaluator)

    return cel


def evaluate(expression: str, context: dict[str, Any]) -> Any:
    return _core().evaluate(expression, context)


def compile_expression(expression: str) -> Any:
    return _core().compile(expression)
