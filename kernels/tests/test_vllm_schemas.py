"""Our vLLM-schema ops take exactly the arguments of the wheel's ops (CPU: schemas only).

vLLM's schema is read from its installed ``_C_stable_libtorch.abi3.so`` (the string it registers),
ours from ``csrc/registration.cpp``; both are parsed by torch's own schema parser and compared
argument by argument: name, type, default and whether the op writes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hisparse_kernels.ops.vllm_names import OURS_FOR_VLLM, our_schema, wheel_schema

torch = pytest.importorskip("torch")

VLLM_FOR_OURS = {ours: theirs for theirs, ours in OURS_FOR_VLLM.items()}


def vllm_schema(op: str) -> str:
    vllm = pytest.importorskip("vllm")
    so = Path(vllm.__file__).parent / "_C_stable_libtorch.abi3.so"
    if not so.exists():
        pytest.skip("the vLLM wheel's compiled ops are not installed")
    schema = wheel_schema(so, op)
    assert schema, f"{op}'s schema string not found in {so.name}"
    return schema


def arguments(schema: str) -> list[tuple[str, str, object, bool]]:
    parsed = torch._C.parse_schema(schema)
    return [
        (a.name, str(a.type), a.default_value, bool(a.alias_info and a.alias_info.is_write))
        for a in parsed.arguments
    ]


@pytest.mark.parametrize("ours", sorted(VLLM_FOR_OURS))
def test_our_op_takes_the_wheels_arguments(ours: str) -> None:
    mine = arguments(our_schema(ours))
    theirs = arguments(vllm_schema(VLLM_FOR_OURS[ours]))
    assert mine == theirs
    assert any(write for *_, write in theirs)  # the comparison sees mutation marks


def test_a_schema_difference_is_seen() -> None:
    theirs = arguments(vllm_schema("hisparse_gather_compact"))
    changed = our_schema("vllm_gather_compact").replace("Tensor(a!) hot_cache", "Tensor hot_cache")
    assert arguments(changed) != theirs
