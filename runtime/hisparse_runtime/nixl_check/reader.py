"""The decode side: fetch a publisher's document, READ its buffer over NIXL, verify, report once."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
from pydantic import ValidationError

from hisparse_runtime.nixl_check.agent import CheckFailure, new_agent
from hisparse_runtime.nixl_check.models import BUFFER_PATH, PROTOCOL, LinkCheckResult, PublishedBuffer
from hisparse_runtime.nixl_check.transfer import PartCallback, Progress, attach_peer, read_parts, verify

log = logging.getLogger(__name__)

_GRACE_S = 5.0
"""Extra time the watchdog allows past the transfer deadline for setup and teardown."""


def fetch_document(url: str, *, timeout_s: float = 5.0, wait_s: float = 0.0) -> PublishedBuffer:
    """GET the publisher's document, retrying connection errors for up to ``wait_s`` seconds."""
    target = url.rstrip("/") + BUFFER_PATH
    give_up = time.monotonic() + wait_s
    while True:
        try:
            response = httpx.get(target, timeout=timeout_s)
            break
        except httpx.TransportError as exc:
            if time.monotonic() >= give_up:
                raise CheckFailure(
                    "peer_unreachable",
                    f"no NIXL check publisher answered at {target} ({type(exc).__name__}: {exc}). Check the"
                    " peer address and port, and that the prefill pod runs `hisparse-runtime nixl-check"
                    " publish`.",
                ) from exc
            time.sleep(min(0.5, max(give_up - time.monotonic(), 0.01)))
    if response.status_code != 200:
        raise CheckFailure(
            "peer_unreachable",
            f"{target} answered HTTP {response.status_code}; it is not a NIXL check publisher of this version.",
        )
    try:
        raw = response.json()
    except ValueError as exc:
        raise CheckFailure("bad_metadata", f"{target} did not return JSON: {exc}") from exc
    if isinstance(raw, dict) and raw.get("protocol") != PROTOCOL:
        raise CheckFailure(
            "bad_metadata", f"publisher speaks {raw.get('protocol')!r}, this reader speaks {PROTOCOL!r}"
        )
    try:
        return PublishedBuffer.model_validate(raw)
    except ValidationError as exc:
        raise CheckFailure("bad_metadata", f"published document is invalid: {exc}") from exc


def read_peer(
    url: str,
    *,
    backends: list[str] | None = None,
    timeout_s: float = 30.0,
    http_timeout_s: float = 5.0,
    wait_s: float = 0.0,
    max_in_flight: int = 4,
    on_part_done: PartCallback | None = None,
) -> LinkCheckResult:
    """Run the decode side of the link check against the publisher at ``url``. Never raises."""
    backends = list(backends or ["UCX"])
    progress = Progress()
    holder: dict[str, Any] = {}

    def work() -> None:
        document = fetch_document(url, timeout_s=http_timeout_s, wait_s=wait_s)
        holder["document"] = document
        agent = new_agent("decode", backends)
        remote = attach_peer(agent, document)
        try:
            dst = np.zeros(document.total_bytes, dtype=np.uint8)
            read_parts(
                agent, remote, document, dst, progress,
                deadline=time.monotonic() + timeout_s,
                max_in_flight=max_in_flight, on_part_done=on_part_done,
            )  # fmt: skip
            verify(document, dst)
        finally:
            try:
                agent.remove_remote_agent(remote)
            except Exception:
                log.debug("remove_remote_agent failed", exc_info=True)

    budget = wait_s + http_timeout_s + timeout_s + _GRACE_S
    failure = run_bounded(work, budget)
    return build_result("read", url, backends, holder.get("document"), progress, failure)


def run_bounded(work: Callable[[], None], budget_s: float) -> CheckFailure | None:
    """Run ``work`` on a daemon thread; return its CheckFailure, or a timeout if it overruns.

    NIXL calls are C calls that Python cannot interrupt; the watchdog guarantees the caller an answer
    within the budget even if one of them blocks, and the late thread's outcome is discarded.
    """
    outcome: list[CheckFailure | None] = []

    def target() -> None:
        try:
            work()
            outcome.append(None)
        except CheckFailure as exc:
            outcome.append(exc)
        except Exception as exc:  # anything unexpected still yields one classified report
            log.debug("link check crashed", exc_info=True)
            outcome.append(CheckFailure("transfer_failed", f"unexpected error: {type(exc).__name__}: {exc}"))

    thread = threading.Thread(target=target, name="nixl-check", daemon=True)
    thread.start()
    thread.join(budget_s)
    if thread.is_alive() or not outcome:
        return CheckFailure(
            "timeout",
            f"the link check did not finish within {budget_s:.1f}s; a NIXL call is blocked (check that the"
            " peer is alive and reachable on its UCX ports).",
        )
    return outcome[0]


def build_result(
    mode: str,
    peer: str,
    backends: list[str],
    document: PublishedBuffer | None,
    progress: Progress,
    failure: CheckFailure | None,
) -> LinkCheckResult:
    total = document.total_bytes if document is not None else 0
    parts_total = len(document.parts) if document is not None else 0
    ok = failure is None and document is not None and progress.parts_done == parts_total
    seconds = progress.seconds
    verified = total if ok else 0
    return LinkCheckResult(
        ok=ok,
        mode=mode,  # type: ignore[arg-type]
        peer=peer,
        backends=backends,
        parts_total=parts_total,
        parts_done=progress.parts_done,
        bytes_total=total,
        bytes_verified=verified,
        transfer_seconds=seconds,
        bandwidth_bytes_per_s=(verified / seconds) if ok and seconds > 0 else 0.0,
        failure=None if ok else (failure.kind if failure else "transfer_failed"),  # type: ignore[arg-type]
        error=None if ok else (failure.message if failure else "the read ended without completing every part"),
    )
