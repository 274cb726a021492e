"""Preflight form of the link check: two agents in this process move bytes through the backends.

It proves the NIXL package and its UCX backend load on this node and that a registered DRAM buffer
can be READ part by part with identical bytes, without needing a peer pod.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from hisparse_runtime.nixl_check.agent import new_agent
from hisparse_runtime.nixl_check.models import LinkCheckResult, PublishedBuffer
from hisparse_runtime.nixl_check.reader import build_result, run_bounded
from hisparse_runtime.nixl_check.source import SourceBuffer
from hisparse_runtime.nixl_check.transfer import Progress, attach_peer, read_parts, verify

log = logging.getLogger(__name__)


def check_loopback(
    *,
    size_bytes: int = 8 << 20,
    parts: int = 8,
    backends: list[str] | None = None,
    timeout_s: float = 30.0,
    max_in_flight: int = 4,
) -> LinkCheckResult:
    """Run the in-process link check. Never raises; the result says what failed and what to do."""
    backends = list(backends or ["UCX"])
    progress = Progress()
    holder: dict[str, PublishedBuffer] = {}
    # The source must outlive the worker thread if the watchdog gives up on it.
    keep: list[Any] = []

    def work() -> None:
        source = SourceBuffer(size_bytes, parts, backends=backends, seed=int(time.time()))
        keep.append(source)
        holder["document"] = source.document
        reader = new_agent("decode", backends)
        remote = attach_peer(reader, source.document)
        try:
            dst = np.zeros(source.document.total_bytes, dtype=np.uint8)
            read_parts(
                reader, remote, source.document, dst, progress,
                deadline=time.monotonic() + timeout_s, max_in_flight=max_in_flight,
            )  # fmt: skip
            verify(source.document, dst)
        finally:
            try:
                reader.remove_remote_agent(remote)
            except Exception:
                log.debug("remove_remote_agent failed", exc_info=True)
            source.close()

    failure = run_bounded(work, timeout_s + 10.0)
    return build_result("loopback", "in-process", backends, holder.get("document"), progress, failure)
