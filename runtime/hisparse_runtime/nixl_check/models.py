"""Data that crosses the wire or leaves the process in the NIXL link check.

``PublishedBuffer`` is what the prefill side serves over HTTP; ``LinkCheckResult`` is the one report
the decode side (or the loopback preflight) produces.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PROTOCOL = "hisparse.nixl-check/v1"
"""Version tag of the published document; a reader refuses any other."""

BUFFER_PATH = "/nixl-check/v1/buffer"
"""HTTP path where the publisher serves its ``PublishedBuffer``."""

DEFAULT_PORT = 5590
"""Default port of the check's own HTTP endpoint: the engine's ``NixlSettings.link_check_port`` default,
below vLLM's side-channel range (5600 + global DP rank), so it never collides with a DP rank's port."""

FailureKind = Literal[
    "backend_unavailable",
    "peer_unreachable",
    "bad_metadata",
    "transfer_failed",
    "timeout",
    "checksum_mismatch",
]
"""Why a link check failed.

- ``backend_unavailable``: the NIXL package or a requested backend (UCX) cannot be loaded here.
- ``peer_unreachable``: the publisher's HTTP endpoint did not answer (wrong address, not started).
- ``bad_metadata``: the published document, agent metadata or buffer descriptors were rejected.
- ``transfer_failed``: NIXL reported an error while moving bytes (for example the peer died).
- ``timeout``: the transfer did not finish within the deadline.
- ``checksum_mismatch``: every part arrived but the bytes differ from the published checksums.
"""

EXIT_CODES: dict[FailureKind, int] = {
    "backend_unavailable": 10,
    "peer_unreachable": 11,
    "bad_metadata": 12,
    "transfer_failed": 13,
    "timeout": 14,
    "checksum_mismatch": 15,
}
"""Process exit code per failure kind (0 means the link check passed)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PartDescriptor(_Frozen):
    """One contiguous piece of the published buffer, read as its own NIXL transfer."""

    addr: int = Field(ge=0, description="Virtual address of the part in the publisher's process.")
    length: int = Field(gt=0, description="Length of the part in bytes.")
    dev_id: int = Field(default=0, ge=0, description="NIXL device id; 0 for host DRAM.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the part's bytes.")


class PublishedBuffer(_Frozen):
    """What the prefill side publishes so the decode side can READ its buffer over NIXL."""

    protocol: Literal["hisparse.nixl-check/v1"] = "hisparse.nixl-check/v1"
    agent_name: str = Field(min_length=1, description="NIXL agent name inside the metadata.")
    agent_metadata_b64: str = Field(min_length=1, description="Base64 of nixl_agent.get_agent_metadata().")
    mem_type: Literal["DRAM"] = "DRAM"
    backends: list[str] = Field(default_factory=lambda: ["UCX"], description="Backends the publisher loaded.")
    parts: list[PartDescriptor] = Field(min_length=1, description="Parts in buffer order.")

    @property
    def total_bytes(self) -> int:
        return sum(p.length for p in self.parts)


class LinkCheckResult(BaseModel):
    """The single outcome of one link check. ``ok`` is true only when every part arrived and verified."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    mode: Literal["loopback", "read"]
    peer: str = Field(description="Publisher URL, or 'in-process' for loopback.")
    backends: list[str]
    parts_total: int = Field(ge=0)
    parts_done: int = Field(ge=0, description="Parts NIXL reported DONE before the check ended.")
    bytes_total: int = Field(ge=0)
    bytes_verified: int = Field(
        ge=0, description="Bytes accepted after checksum; 0 unless every part verified (all or nothing)."
    )
    transfer_seconds: float = Field(ge=0, description="From the first post to the last completion.")
    bandwidth_bytes_per_s: float = Field(ge=0, description="bytes_verified / transfer_seconds.")
    failure: FailureKind | None = None
    error: str | None = Field(default=None, description="What went wrong and what to do; None when ok.")

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else EXIT_CODES[self.failure or "transfer_failed"]
