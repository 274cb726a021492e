"""Stand-ins for vLLM's HiSparse ops and ours on CPU, for the kernel-swap tests (plugin and preflight).

vLLM's ops need a CUDA driver to load and ours a CUDA build, so each side is a test namespace that
carries the real schemas: vLLM's four as its wheel registers them (the strings in the installed
``_C_stable_libtorch.abi3.so``), ours as ``csrc/registration.cpp`` defines them, both parsed by torch.
vLLM's stand-in kernels record ``vllm`` and compute nothing; ours record ``ours`` and compute with the
NumPy reference (``hisparse_kernels.reference.vllm_ops``). Variants of ours differ in one argument's
schema, or compute the wrong state, so that every check of the swap can be shown to fail.

A plain module (not conftest): torch keeps op definitions for the life of the process, so they are
defined once, on first use, and shared by every test file that imports this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hisparse_kernels.ops import vllm_names as names
from hisparse_kernels.ops.vllm_names import OURS_FOR_VLLM
from hisparse_kernels.reference import vllm_ops as ref


VLLM_NS = "hisparse_test_vllm"
"""Stands in for ``_C_cache_ops``: the wheel's four schemas, kernels that record ``vllm``."""
OURS_NS = "hisparse_test_ours"
"""Stands in for ``hisparse``: our four schemas, reference kernels that record ``ours``."""
UNWRITTEN_NS = "hisparse_test_ours_unwritten"
"""Ours, but ``vllm_invalidate_written_slots`` does not mark ``device_global_indices`` as written."""
RENAMED_NS = "hisparse_test_ours_renamed"
"""Ours, but ``vllm_gather_compact``'s ``miss_counts`` is named ``counts``."""
WRONG_STATE_NS = "hisparse_test_ours_wrong_state"
"""Ours with the right schemas, but invalidation reads the request row instead of the state row."""


def wheel_schema(op: str) -> str:
    """vLLM's schema string for ``op``, read from its installed compiled ops."""
    import vllm

    so = Path(vllm.__file__).parent / "_C_stable_libtorch.abi3.so"
    schema = names.wheel_schema(so, op)
    assert schema, f"{op}'s schema string not found in {so}"
    return schema


our_schema = names.our_schema


@dataclass
class Standins:
    """The test namespaces, what their kernels saw, and the libraries that keep them defined."""

    seen: list[tuple[str, str]] = field(default_factory=list)
    """(who, op) per call: ``vllm`` for vLLM's stand-ins, ``ours`` for ours (any variant)."""
    libraries: list[Any] = field(default_factory=list)

    def take(self) -> list[tuple[str, str]]:
        out, self.seen[:] = list(self.seen), []
        return out


def _bound(schema: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name (the dispatcher passes what the caller gave, positionally)."""
    out = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    out.update(zip((a.name for a in schema.arguments), args))
    out.update(kwargs)
    return out


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.numpy()  # CPU tensors: the array shares their memory


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy()


def _reference(op: str, a: dict[str, Any], *, wrong_state: bool = False) -> None:
    if op == "vllm_invalidate_written_slots":
        rsi = a["request_state_indices"]
        if wrong_state:  # a plausible bug: the request row taken for the state row
            rsi = torch.arange(len(rsi), dtype=rsi.dtype)
        ref.invalidate_written_slots_ref(_np(a["device_global_indices"]), _np(rsi), _np(a["req_id_per_token"]),
                                         _np(a["written_slots"]))  # fmt: skip
    elif op == "vllm_gather_compact":
        ref.gather_compact_ref(_bytes(a["host_cache"]), _bytes(a["hot_cache"]), _np(a["miss_global_indices"]),
                               _np(a["miss_hot_indices"]), _np(a["miss_counts"]))  # fmt: skip
    elif op == "vllm_gather_plan":
        ref.gather_plan_ref(_bytes(a["host_cache"]), _bytes(a["hot_cache"]), _np(a["global_indices"]),
                            _np(a["hot_indices"]), _np(a["miss_mask"]), _np(a["request_state_indices"]),
                            _np(a["attention_indices"]), a["attention_block_stride"])  # fmt: skip
    elif op == "vllm_resolve_residency":
        host, hot = a.pop("host_cache"), a.pop("hot_cache")
        ref.resolve_residency_ref(ref.VllmResolveArgs(
            host_rows=host.shape[0], hot_block_size=hot.shape[1] if hot.dim() == 3 else 1,
            **{k: _np(v) if isinstance(v, torch.Tensor) or v is None else v for k, v in a.items()}))
    else:
        raise AssertionError(f"no reference for {op}")


def _define(s: Standins, ns: str, schemas: dict[str, str], kernel: Callable[[str, Any], Callable[..., Any]]) -> None:
    lib = torch.library.Library(ns, "DEF")
    for name, schema in schemas.items():
        lib.define(schema)
        lib.impl(name, kernel(name, getattr(getattr(torch.ops, ns), name).default._schema), "CPU")
    s.libraries.append(lib)


@functools.cache
def standins() -> Standins:
    """Define the namespaces (once per process) and return them."""
    s = Standins()

    def vllm_kernel(name: str, schema: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: s.seen.append(("vllm", name))

    def our_kernel(wrong_state: bool) -> Callable[[str, Any], Callable[..., Any]]:
        def make(name: str, schema: Any) -> Callable[..., Any]:
            def kernel(*args: Any, **kwargs: Any) -> None:
                s.seen.append(("ours", name))
                _reference(name, _bound(schema, args, kwargs), wrong_state=wrong_state)
            return kernel
        return make

    ours = {name: our_schema(name) for name in OURS_FOR_VLLM.values()}
    _define(s, VLLM_NS, {name: wheel_schema(name) for name in OURS_FOR_VLLM}, vllm_kernel)
    _define(s, OURS_NS, ours, our_kernel(False))
    _define(s, WRONG_STATE_NS, ours, our_kernel(True))
    unwritten = dict(ours)
    old = unwritten["vllm_invalidate_written_slots"]
    unwritten["vllm_invalidate_written_slots"] = old.replace("Tensor! device_global_indices", "Tensor device_global_indices")
    assert unwritten["vllm_invalidate_written_slots"] != old
    _define(s, UNWRITTEN_NS, unwritten, our_kernel(False))
    renamed = dict(ours)
    old = renamed["vllm_gather_compact"]
    renamed["vllm_gather_compact"] = old.replace("Tensor miss_counts", "Tensor counts")
    assert renamed["vllm_gather_compact"] != old
    _define(s, RENAMED_NS, renamed, our_kernel(False))
    return s


def vllm_op(name: str) -> Any:
    """vLLM's name of an op, in the stand-in namespace (what vLLM's runtime.py calls)."""
    return getattr(getattr(torch.ops, VLLM_NS), name)


def call_all_four() -> dict[str, Any]:
    """One small real call of each of vLLM's four ops through vLLM's (stand-in) names; returns the
    tensors they wrote, so a caller can check what ran."""
    i32 = {"dtype": torch.int32}
    out: dict[str, Any] = {}
    # invalidate_written_slots: slot 7 written by request row 0 (state 1).
    dgi = torch.tensor([[5, 7], [7, 3]], **i32)
    vllm_op("hisparse_invalidate_written_slots")(dgi, torch.tensor([1, 0], **i32), torch.tensor([0], **i32),
                                                 torch.tensor([7], dtype=torch.int64))  # fmt: skip
    out["invalidate"] = dgi
    # gather_compact: host rows 2 and 0 into physical hot rows 1 and 2 (block size 2).
    host = torch.arange(12, dtype=torch.uint8).view(4, 3)
    hot = torch.zeros(2, 2, 3, dtype=torch.uint8)
    vllm_op("hisparse_gather_compact")(host, hot, torch.tensor([[2, 0]], **i32), torch.tensor([[1, 2]], **i32),
                                       torch.tensor([2], **i32))  # fmt: skip
    out["gather_compact"] = hot
    # gather_plan: only the masked entry (host row 3 -> physical hot row 0) is copied.
    hot_plan = torch.zeros(2, 2, 3, dtype=torch.uint8)
    vllm_op("hisparse_gather_plan")(host, hot_plan, torch.tensor([[3, 1]], **i32), torch.tensor([[0, 3]], **i32),
                                    torch.tensor([[1, 0]], **i32), torch.tensor([0], **i32))  # fmt: skip
    out["gather_plan"] = hot_plan
    # resolve_residency: one request row, state 0, empty hot buffer of 4 slots: both top-k entries miss.
    hot_indices = torch.full((1, 2), -9, **i32)
    state = torch.full((1, 4), -1, **i32)
    lru = torch.arange(4, dtype=torch.int16).view(1, 4)
    vllm_op("hisparse_resolve_residency")(host, torch.zeros(2, 2, 3, dtype=torch.uint8),
                                          torch.tensor([[1, 0]], **i32), torch.tensor([[3, 1]], **i32), hot_indices,
                                          state, lru, torch.tensor([0], **i32), 4, 4)  # fmt: skip
    out["resolve"] = (hot_indices, state)
    return out
