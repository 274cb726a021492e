"""NIXL link check: prove that NIXL moves bytes, in-process (preflight) or from prefill to decode.

- ``check_loopback()``: two agents in this process, through the configured backends (UCX).
- ``SourceBuffer`` + ``publish()``: the prefill side registers a buffer and serves its NIXL agent
  metadata and part descriptors on a small HTTP port of our own (``DEFAULT_PORT``, 5590).
- ``read_peer(url)``: the decode side fetches that document, READs every part, verifies checksums and
  returns one ``LinkCheckResult`` (bandwidth, or a single classified failure) within bounded time.
"""

from __future__ import annotations

from hisparse_runtime.nixl_check.loopback import check_loopback
from hisparse_runtime.nixl_check.models import (
    BUFFER_PATH,
    DEFAULT_PORT,
    EXIT_CODES,
    PROTOCOL,
    FailureKind,
    LinkCheckResult,
    PartDescriptor,
    PublishedBuffer,
)
from hisparse_runtime.nixl_check.publisher import Publisher, publish
from hisparse_runtime.nixl_check.reader import fetch_document, read_peer
from hisparse_runtime.nixl_check.source import SourceBuffer

__all__ = [
    "BUFFER_PATH",
    "DEFAULT_PORT",
    "EXIT_CODES",
    "PROTOCOL",
    "FailureKind",
    "LinkCheckResult",
    "PartDescriptor",
    "PublishedBuffer",
    "Publisher",
    "SourceBuffer",
    "check_loopback",
    "fetch_document",
    "publish",
    "read_peer",
]
