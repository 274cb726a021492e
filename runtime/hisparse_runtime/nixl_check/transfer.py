"""Reading every part of a published buffer over NIXL, with a deadline, then verifying it.

The reader posts at most ``max_in_flight`` part transfers at a time and counts a part done only when
NIXL reports it DONE. Any error, an ERR state or the deadline ends the read with one ``CheckFailure``;
the bytes are accepted only if every part is done and every checksum matches.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hisparse_runtime.nixl_check.agent import CheckFailure, register_dram
from hisparse_runtime.nixl_check.models import PublishedBuffer

log = logging.getLogger(__name__)

PartCallback = Callable[[int], None]
"""Called with a part's index when NIXL reports it DONE (progress, and a hook for fault tests)."""

_POLL_S = 0.0005


@dataclass
class Progress:
    """What a read achieved so far; the caller reads it after success or failure alike."""

    parts_done: int = 0
    first_post: float | None = None
    last_done: float | None = None
    done: set[int] = field(default_factory=set)

    @property
    def seconds(self) -> float:
        if self.first_post is None or self.last_done is None:
            return 0.0
        return max(self.last_done - self.first_post, 0.0)


def attach_peer(agent: Any, document: PublishedBuffer) -> str:
    """Add the publisher's agent from its metadata; returns the remote agent name."""
    try:
        metadata = base64.b64decode(document.agent_metadata_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CheckFailure("bad_metadata", f"published agent metadata is not valid base64: {exc}") from exc
    try:
        name = agent.add_remote_agent(metadata)
    except Exception as exc:
        raise CheckFailure(
            "bad_metadata",
            f"NIXL rejected the publisher's agent metadata ({exc}). The publisher may run a different"
            " NIXL version, or the document was corrupted in transit.",
        ) from exc
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name != document.agent_name:
        raise CheckFailure(
            "bad_metadata",
            f"metadata names agent {name!r} but the document claims {document.agent_name!r}",
        )
    return name


def read_parts(
    agent: Any,
    remote: str,
    document: PublishedBuffer,
    dst: np.ndarray,
    progress: Progress,
    *,
    deadline: float,
    max_in_flight: int = 4,
    on_part_done: PartCallback | None = None,
) -> None:
    """READ every part of ``document`` into ``dst`` (same layout); raises CheckFailure on any problem."""
    handles: dict[int, Any] = {}
    base = dst.ctypes.data
    offsets = []
    off = 0
    for part in document.parts:
        offsets.append(off)
        off += part.length
    if off != dst.nbytes:
        raise ValueError("destination size does not match the document")

    reg = register_dram(agent, dst)
    pending = list(range(len(document.parts)))
    try:
        while pending or handles:
            while pending and len(handles) < max_in_flight:
                i = pending.pop(0)
                if progress.first_post is None:
                    progress.first_post = time.monotonic()
                handles[i] = _post(agent, remote, document, i, base + offsets[i])
            for i in list(handles):
                state = _state(agent, handles[i], i)
                if state == "DONE":
                    _release(handles.pop(i))
                    progress.done.add(i)
                    progress.parts_done += 1
                    progress.last_done = time.monotonic()
                    if on_part_done is not None:
                        on_part_done(i)
            if handles and time.monotonic() > deadline:
                raise CheckFailure(
                    "timeout",
                    f"{progress.parts_done}/{len(document.parts)} parts done when the deadline passed;"
                    " the publisher may be overloaded or the transport stalled (check UCX_TLS and the"
                    " network path between the pods).",
                )
            if handles:
                time.sleep(_POLL_S)
    finally:
        for h in handles.values():
            _release(h)
        try:
            agent.deregister_memory(reg)
        except Exception:
            log.debug("deregister failed", exc_info=True)


def verify(document: PublishedBuffer, dst: np.ndarray) -> None:
    """Compare every part's SHA-256 with the published one; raise naming the parts that differ."""
    bad = []
    off = 0
    for i, part in enumerate(document.parts):
        if hashlib.sha256(dst[off : off + part.length].data).hexdigest() != part.sha256:
            bad.append(i)
        off += part.length
    if bad:
        raise CheckFailure(
            "checksum_mismatch",
            f"parts {bad} of {len(document.parts)} arrived with different bytes than published;"
            " the transport corrupted data or the publisher changed the buffer during the read.",
        )


def _post(agent: Any, remote: str, document: PublishedBuffer, i: int, local_addr: int) -> Any:
    part = document.parts[i]
    try:
        local = agent.get_xfer_descs([(local_addr, part.length, 0)], "DRAM")
        far = agent.get_xfer_descs([(part.addr, part.length, part.dev_id)], "DRAM")
        handle = agent.initialize_xfer("READ", local, far, remote)
    except Exception as exc:
        kind = "bad_metadata" if "NOT_FOUND" in str(exc) else "transfer_failed"
        why = (
            "the published descriptors do not match memory the publisher registered"
            if kind == "bad_metadata"
            else "NIXL could not create the transfer"
        )
        raise CheckFailure(kind, f"part {i}: {why} ({exc})") from exc
    try:
        state = agent.transfer(handle)
    except Exception as exc:
        _release(handle)
        raise _transfer_failure(i, exc) from exc
    if state == "ERR":
        _release(handle)
        raise _transfer_failure(i, "NIXL returned ERR on post")
    return handle


def _state(agent: Any, handle: Any, i: int) -> str:
    try:
        state = agent.check_xfer_state(handle)
    except Exception as exc:
        raise _transfer_failure(i, exc) from exc
    if state == "ERR":
        raise _transfer_failure(i, "NIXL reported ERR")
    return str(state)


def _transfer_failure(i: int, cause: object) -> CheckFailure:
    hint = (
        " The publisher went away mid-transfer: check that the prefill pod is running."
        if "DISCONNECT" in str(cause).upper()
        else " Check UCX_TLS and that both pods can reach each other on the UCX ports."
    )
    return CheckFailure("transfer_failed", f"part {i}: transfer failed ({cause}).{hint}")


def _release(handle: Any) -> None:
    # Releasing an unfinished transfer aborts it and may raise; the check has already failed then.
    try:
        handle.release()
    except Exception:
        log.debug("release of transfer handle failed", exc_info=True)
