"""The buffer a publisher exposes: allocated, filled, registered with NIXL, described for readers."""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Any

from hisparse_runtime.nixl_check.agent import new_agent, pattern_bytes, register_dram
from hisparse_runtime.nixl_check.models import PartDescriptor, PublishedBuffer

log = logging.getLogger(__name__)


def split_evenly(total: int, parts: int) -> list[tuple[int, int]]:
    """(offset, length) of ``parts`` contiguous pieces covering ``total`` bytes; the last takes the rest."""
    if parts < 1 or total < parts:
        raise ValueError(f"cannot split {total} bytes into {parts} non-empty parts")
    base = total // parts
    pieces = [(i * base, base) for i in range(parts - 1)]
    pieces.append(((parts - 1) * base, total - (parts - 1) * base))
    return pieces


class SourceBuffer:
    """A registered host buffer of pseudo-random bytes and the document that lets a peer READ it.

    Keep the object alive for as long as peers may read: closing deregisters the memory.
    """

    def __init__(self, size_bytes: int, parts: int, *, backends: list[str], seed: int = 0) -> None:
        self.agent: Any = new_agent("prefill", backends)
        self.data = pattern_bytes(size_bytes, seed)
        self._reg = register_dram(self.agent, self.data)
        base = self.data.ctypes.data
        descs = [
            PartDescriptor(
                addr=base + off,
                length=length,
                sha256=hashlib.sha256(self.data[off : off + length].data).hexdigest(),
            )
            for off, length in split_evenly(size_bytes, parts)
        ]
        self.document = PublishedBuffer(
            agent_name=self.agent.name,
            agent_metadata_b64=base64.b64encode(self.agent.get_agent_metadata()).decode("ascii"),
            backends=list(backends),
            parts=descs,
        )

    def close(self) -> None:
        if self._reg is not None:
            try:
                self.agent.deregister_memory(self._reg)
            except Exception:  # teardown must not mask the check's own outcome
                log.debug("deregister failed", exc_info=True)
            self._reg = None

    def __enter__(self) -> SourceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

