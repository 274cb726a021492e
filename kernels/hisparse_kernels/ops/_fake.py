"""Fake (meta) implementations: every op mutates its arguments and returns nothing, so tracing needs
no output shapes, only the op's existence and its schema's mutation marks."""

from __future__ import annotations

__all__ = ["register"]

_OPS = (
    "resolve",
    "gather_plan",
    "vllm_gather_compact",
    "vllm_resolve_residency",
    "vllm_gather_plan",
    "vllm_invalidate_written_slots",
    "swap_in",
    "backup_newest_rows",
    "invalidate_slots",
    "bench_flat_gather",
    "bench_warp_gather",
    "bench_launch_only",
)


def _no_output(*args: object, **kwargs: object) -> None:
    return None


def register() -> None:
    import torch

    for name in _OPS:
        torch.library.register_fake(f"hisparse::{name}")(_no_output)
