"""Which of our ops serves which of vLLM 0.33's HiSparse ops, and both sides' schema strings (no torch import).

vLLM's decode calls ``torch.ops._C_cache_ops.hisparse_*`` (its wheel's ``_C_stable_libtorch``). Each
of ours in ``torch.ops.hisparse`` takes the same schema and semantics (``reference/vllm_ops.py``), so
the runtime can register ours under vLLM's names. The schema test, the differential harness and the
runtime's registration read this table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

__all__ = ["OURS_FOR_VLLM", "OUR_NAMESPACE", "REGISTRATION", "VLLM_NAMESPACE", "our_schema", "wheel_schema"]

REGISTRATION: Final = Path(__file__).resolve().parent.parent / "csrc" / "registration.cpp"
"""Where our op schemas are defined (``TORCH_LIBRARY(hisparse, m)``)."""

VLLM_NAMESPACE: Final = "_C_cache_ops"
OUR_NAMESPACE: Final = "hisparse"

OURS_FOR_VLLM: Final[dict[str, str]] = {
    "hisparse_resolve_residency": "vllm_resolve_residency",
    "hisparse_gather_compact": "vllm_gather_compact",
    "hisparse_gather_plan": "vllm_gather_plan",
    "hisparse_invalidate_written_slots": "vllm_invalidate_written_slots",
}
"""vLLM's op name -> ours (both without namespace)."""


def wheel_schema(so: Path, op: str) -> str | None:
    """vLLM's schema string for ``op`` as its compiled ops (``_C_stable_libtorch.abi3.so`` at ``so``)
    register it, whitespace collapsed; None when the file holds no such string."""
    match = re.search(rb"\b" + op.encode() + rb"\(Tensor[^\x00]*?-> \(\)", so.read_bytes())
    return re.sub(r"\s+", " ", match.group().decode()) if match else None


def our_schema(op: str) -> str:
    """Our schema string for ``op`` as ``csrc/registration.cpp`` defines it."""
    text = REGISTRATION.read_text()
    if f'"{op}(' not in text:
        raise KeyError(f"{op} is not defined in {REGISTRATION}")
    body = re.search(r'm\.def\(\s*((?:"[^"]*"\s*)+)\)', text[text.index(f'"{op}(') - 40:])
    if body is None:
        raise KeyError(f"{op}'s m.def in {REGISTRATION} could not be read")
    return "".join(re.findall(r'"([^"]*)"', body.group(1)))
