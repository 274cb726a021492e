"""Which of our ops serves which of vLLM 0.33's HiSparse ops (pure data: no torch import).

vLLM's decode calls ``torch.ops._C_cache_ops.hisparse_*`` (its wheel's ``_C_stable_libtorch``). Each
of ours in ``torch.ops.hisparse`` takes the same schema and semantics (``reference/vllm_ops.py``), so
the runtime can register ours under vLLM's names. The schema test, the differential harness and the
runtime's registration read this table.
"""

from __future__ import annotations

from typing import Final

__all__ = ["OURS_FOR_VLLM", "OUR_NAMESPACE", "VLLM_NAMESPACE"]

VLLM_NAMESPACE: Final = "_C_cache_ops"
OUR_NAMESPACE: Final = "hisparse"

OURS_FOR_VLLM: Final[dict[str, str]] = {
    "hisparse_resolve_residency": "vllm_resolve_residency",
    "hisparse_gather_compact": "vllm_gather_compact",
    "hisparse_gather_plan": "vllm_gather_plan",
    "hisparse_invalidate_written_slots": "vllm_invalidate_written_slots",
}
"""vLLM's op name -> ours (both without namespace)."""
