"""Loading NIXL and creating agents with the backends the check was asked for.

The vLLM image ships NIXL as ``nixl``; the PyPI wheels are ``nixl_cu12`` / ``nixl_cu13``. All expose the
same ``_api`` module, so we try them in that order.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import uuid
from types import ModuleType
from typing import Any

import numpy as np

_NIXL_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")


class CheckFailure(Exception):
    """A classified failure of the link check; ``kind`` is a ``FailureKind``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def load_nixl() -> ModuleType:
    """Import the NIXL Python API, or raise ``CheckFailure('backend_unavailable')``."""
    # UCX logs to stdout by default; our commands keep stdout for their one JSON result.
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    errors = []
    for name in _NIXL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
            continue
        _logs_to_stderr()
        return module
    raise CheckFailure(
        "backend_unavailable",
        "NIXL is not importable (" + "; ".join(errors) + "). Install the nixl package that matches the"
        " image's CUDA (the vLLM image ships it), or run the check from the runtime image.",
    )


def _logs_to_stderr() -> None:
    # NIXL's logging config writes to stdout; our commands keep stdout for their one JSON result.
    for handler in logging.getLogger("nixl").handlers:
        if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is sys.stdout:
            handler.setStream(sys.stderr)


def new_agent(role: str, backends: list[str]) -> Any:
    """A fresh agent with a unique name and every requested backend loaded, or a CheckFailure."""
    api = load_nixl()
    name = f"hisparse-check-{role}-{uuid.uuid4().hex[:12]}"
    try:
        agent = api.nixl_agent(name, api.nixl_agent_config(backends=list(backends)))
    except Exception as exc:  # the binding raises its own error types
        tls = os.environ.get("UCX_TLS")
        raise CheckFailure(
            "backend_unavailable",
            f"NIXL agent with backends {list(backends)} could not start ({exc})."
            + (f" UCX_TLS={tls!r} may name no transport this node has." if tls else ""),
        ) from exc
    # nixl_agent skips a missing backend plugin with only a warning; a check must not.
    missing = [b for b in backends if b not in agent.backends]
    if missing:
        raise CheckFailure(
            "backend_unavailable",
            f"NIXL backend(s) {missing} did not load (plugins found: {sorted(agent.get_plugin_list())})."
            " Check that UCX is installed in the image and that UCX_TLS names transports this node has.",
        )
    return agent


def register_dram(agent: Any, array: np.ndarray) -> Any:
    """Register a contiguous host array with every loaded backend; returns the registration list."""
    if not array.flags.c_contiguous:
        raise ValueError("NIXL registration needs a C-contiguous array")
    return agent.register_memory([(array.ctypes.data, array.nbytes, 0, "")], "DRAM")


def pattern_bytes(size: int, seed: int) -> np.ndarray:
    """Deterministic pseudo-random bytes, so a stuck-at or shifted copy cannot match by accident."""
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)
