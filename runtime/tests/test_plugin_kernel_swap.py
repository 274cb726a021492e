"""The kernel swap on CPU: the project's kernels registered under vLLM's op names, and the vLLM plugin's
``kernels`` stage.

vLLM's ops and ours stand in as test namespaces carrying the real schemas (``swapsupport``): the wheel's
four, read from its compiled ops, and ours from ``registration.cpp``. ``install`` runs for the ``CPU``
dispatch key with those namespaces, exactly the code path it runs for ``CUDA`` with the real ones, less
the loading of the two extensions (which needs a GPU build).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator

import numpy as np
import pytest

pytestmark = pytest.mark.vllm
torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed in this environment")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from swapsupport import (  # noqa: E402
    OURS_NS,
    RENAMED_NS,
    UNWRITTEN_NS,
    VLLM_NS,
    WRONG_STATE_NS,
    call_all_four,
    our_schema,
    standins,
    vllm_op,
    wheel_schema,
)

import hisparse_runtime.plugin as plugin  # noqa: E402
from hisparse_kernels.ops.vllm_names import OURS_FOR_VLLM  # noqa: E402
from hisparse_kernels.reference.vllm_ops import invalidate_written_slots_ref  # noqa: E402
from hisparse_runtime.plugin import kernel_swap  # noqa: E402
from hisparse_runtime.plugin.metrics import HiSparseMetrics  # noqa: E402

VLLM_OPS = sorted(OURS_FOR_VLLM)
CPU = {"vllm_ns": VLLM_NS, "dispatch_key": "CPU"}


def install(choice: str, ours_ns: str = OURS_NS) -> kernel_swap.KernelSwap:
    return kernel_swap.install(choice, ours_ns=ours_ns, **CPU)


@pytest.fixture(autouse=True)
def _vllms_ops_after() -> Iterator[None]:
    s = standins()
    s.take()
    yield
    install("vllm")
    s.take()
    call_all_four()
    assert s.take() == [("vllm", op) for op in CALL_ORDER], "every test leaves vLLM's ops serving their names"


CALL_ORDER = ["hisparse_invalidate_written_slots", "hisparse_gather_compact", "hisparse_gather_plan",
              "hisparse_resolve_residency"]  # fmt: skip
"""The order ``call_all_four`` calls vLLM's names in."""

OURS_ORDER = [OURS_FOR_VLLM[op] for op in CALL_ORDER]


def test_the_stand_ins_carry_the_wheels_schemas_and_ours() -> None:
    standins()
    for theirs, ours in OURS_FOR_VLLM.items():
        assert str(vllm_op(theirs).default._schema) == str(torch._C.parse_schema(wheel_schema(theirs))).replace(
            theirs, f"{VLLM_NS}::{theirs}", 1)
        mine = getattr(getattr(torch.ops, OURS_NS), ours).default._schema
        assert str(mine) == str(torch._C.parse_schema(our_schema(ours))).replace(ours, f"{OURS_NS}::{ours}", 1)
        assert kernel_swap.schema_differences(vllm_op(theirs).default._schema, mine) == [], theirs
    call_all_four()
    assert standins().take() == [("vllm", op) for op in CALL_ORDER], "before install, vLLM's kernels serve"


def test_install_routes_all_four_of_vllms_names_to_ours() -> None:
    before = kernel_swap.calls()
    swap = install("hisparse")
    assert swap == kernel_swap.KernelSwap(requested="hisparse", active="hisparse", dispatch_key="CPU",
                                          ops=tuple(f"{VLLM_NS}::{op}" for op in OURS_FOR_VLLM))  # fmt: skip
    assert install("hisparse") is swap, "idempotent: the same swap, nothing registered twice"
    out = call_all_four()
    assert standins().take() == [("ours", op) for op in OURS_ORDER]
    after = kernel_swap.calls()
    assert {k: after[k] - before.get(k, 0) for k in after} == {f"{VLLM_NS}::{op}": 1 for op in OURS_FOR_VLLM}
    # What ours computed, through vLLM's names (the reference's rules, on real tensors):
    assert out["invalidate"].tolist() == [[5, 7], [-1, 3]]
    assert out["gather_compact"].tolist() == [[[0, 0, 0], [6, 7, 8]], [[0, 1, 2], [0, 0, 0]]]
    assert out["gather_plan"].tolist() == [[[9, 10, 11], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]]
    hot_indices, state = out["resolve"]
    assert hot_indices.tolist() == [[2, 3]] and state.tolist() == [[3, 1, -1, -1]]


def test_verify_proves_the_registration_on_cpu() -> None:
    install("hisparse")
    proof = kernel_swap.verify(**CPU)
    assert proof.op == f"{VLLM_NS}::hisparse_invalidate_written_slots"
    assert proof.calls_after == proof.calls_before + 1
    assert proof.output == proof.expected == kernel_swap.VERIFY_EXPECTED
    assert standins().take() == [("ours", "vllm_invalidate_written_slots")]
    again = kernel_swap.verify(**CPU)
    assert again.calls_before == proof.calls_after, "the counter counts every call"


def test_the_verification_expects_what_the_reference_computes() -> None:
    """The hard-coded expectation of ``verify`` is the reference's output on the same inputs."""
    dgi = np.array(kernel_swap._VERIFY_DGI, dtype=np.int32)
    invalidate_written_slots_ref(dgi, np.array(kernel_swap._VERIFY_RSI, dtype=np.int32),
                                 np.array(kernel_swap._VERIFY_REQ, dtype=np.int32),
                                 np.array(kernel_swap._VERIFY_WRITTEN, dtype=np.int64))  # fmt: skip
    assert dgi.tolist() == kernel_swap.VERIFY_EXPECTED
    assert dgi.tolist() != [list(r) for r in kernel_swap._VERIFY_DGI], "the call must change something"


def test_verify_refuses_when_ours_are_not_installed() -> None:
    with pytest.raises(kernel_swap.KernelSwapError, match="not installed"):
        kernel_swap.verify(**CPU)


def test_verify_sees_a_later_registration_that_serves_vllms_name() -> None:
    """What happens when vLLM's extension registers its kernels after ours: the dispatcher serves the
    last registration, our counter stays put, and verify says so."""
    install("hisparse")
    later = torch.library.Library(VLLM_NS, "IMPL")
    later.impl("hisparse_invalidate_written_slots", lambda *a, **k: standins().seen.append(("vllm", "late")), "CPU")
    try:
        with pytest.raises(kernel_swap.KernelSwapError, match="did not reach the project's kernel"):
            kernel_swap.verify(**CPU)
    finally:
        later._destroy()
    assert kernel_swap.verify(**CPU).output == kernel_swap.VERIFY_EXPECTED


def test_verify_checks_what_the_kernel_computed() -> None:
    kernel_swap.install("hisparse", ours_ns=WRONG_STATE_NS, **CPU)
    with pytest.raises(kernel_swap.KernelSwapError, match=r"left device_global_indices \[\[5, -1, 9, -1\], \[7, 3, -1, 11\]\], not"):
        kernel_swap.verify(**CPU)


@pytest.mark.parametrize(
    ("ours_ns", "needles"),
    [
        (UNWRITTEN_NS, [f"{VLLM_NS}::hisparse_invalidate_written_slots vs {UNWRITTEN_NS}::vllm_invalidate_written_slots",
                        "argument 0 'device_global_indices'", "vLLM's is Tensor device_global_indices (written)",
                        "ours is Tensor device_global_indices (read only)"]),
        (RENAMED_NS, [f"{VLLM_NS}::hisparse_gather_compact vs {RENAMED_NS}::vllm_gather_compact",
                      "argument 4 'miss_counts'", "vLLM's is Tensor miss_counts (read only)",
                      "ours is Tensor counts (read only)"]),
    ],
    ids=["write-mark-dropped", "argument-renamed"],
)
def test_a_schema_difference_registers_nothing(ours_ns: str, needles: list[str]) -> None:
    before = kernel_swap.calls()
    with pytest.raises(kernel_swap.KernelSwapError) as raised:
        kernel_swap.install("hisparse", ours_ns=ours_ns, **CPU)
    message = str(raised.value)
    for needle in needles:
        assert needle in message, message
    assert "none was registered" in message
    # Each of vLLM's names still runs vLLM's kernel: the three matching ops were not registered either.
    call_all_four()
    assert standins().take() == [("vllm", op) for op in CALL_ORDER]
    assert kernel_swap.calls() == before
    state = kernel_swap.installed(**CPU)
    assert state is None or state.active == "vllm"


def test_schema_differences_see_defaults_and_returns() -> None:
    parse = torch._C.parse_schema
    theirs = parse("f(Tensor! a, int b=0) -> ()")
    assert kernel_swap.schema_differences(theirs, parse("f(Tensor(z!) a, int b=0) -> ()")) == []
    assert kernel_swap.schema_differences(theirs, parse("f(Tensor! a, int b=1) -> ()")) == [
        "argument 1 'b': vLLM's is int b = 0 (read only), ours is int b = 1 (read only)"]
    assert kernel_swap.schema_differences(theirs, parse("f(Tensor! a) -> ()")) == [
        "argument 1 'b': vLLM's is int b = 0 (read only), ours is absent"]
    assert kernel_swap.schema_differences(theirs, parse("f(Tensor! a, int b=0) -> Tensor")) == [
        "returns: vLLM's are (), ours are [('Tensor', False)]"]


def test_install_vllm_registers_nothing_and_puts_vllms_kernels_back() -> None:
    assert install("vllm") == kernel_swap.KernelSwap(requested="vllm", active="vllm", ops=(), dispatch_key="CPU")
    call_all_four()
    assert standins().take() == [("vllm", op) for op in CALL_ORDER]
    install("hisparse")
    call_all_four()
    assert standins().take() == [("ours", op) for op in OURS_ORDER]
    install("vllm")
    call_all_four()
    assert standins().take() == [("vllm", op) for op in CALL_ORDER]
    assert install("hisparse").active == "hisparse", "and ours can be installed again"


def test_unknown_choices_name_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="unknown decode kernels 'triton'; use one of vllm, hisparse"):
        install("triton")
    with pytest.raises(ValueError, match="HISPARSE_DECODE_KERNELS='triton' names no decode kernels; use one of vllm, hisparse"):
        kernel_swap.choice_from_env({kernel_swap.ENV: "triton"})
    assert kernel_swap.choice_from_env({}) == "vllm"
    assert kernel_swap.choice_from_env({kernel_swap.ENV: "hisparse"}) == "hisparse"
    with pytest.raises(ValueError, match="dispatch key"):
        kernel_swap.install("hisparse", dispatch_key="Meta")


# --- the vLLM plugin's "kernels" stage ---------------------------------------------------------------


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> CollectorRegistry:
    """The plugin's metrics on a registry of this test's own (the process-wide one outlives tests)."""
    reg = CollectorRegistry()
    m = HiSparseMetrics.create(reg)
    monkeypatch.setattr(plugin, "metrics", lambda: m)
    for name in ("HISPARSE_HOST_PLACEMENT", kernel_swap.ENV):
        monkeypatch.delenv(name, raising=False)
    return reg


def samples(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(reg).decode()) for s in f.samples}  # fmt: skip


def stand_in(monkeypatch: pytest.MonkeyPatch, ours_ns: str) -> None:
    """The plugin's install, aimed at the CPU stand-ins (the plugin passes only the choice)."""
    monkeypatch.setattr(kernel_swap, "install", functools.partial(kernel_swap.install, ours_ns=ours_ns, **CPU))


def info(requested: str, active: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("hisparse_decode_kernels_info", (("active", active), ("requested", requested)))


ERRORS = ("hisparse_plugin_errors_total", (("stage", "kernels"),))


def test_plugin_installs_the_kernels_the_env_names(registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(monkeypatch, OURS_NS)
    monkeypatch.setenv(kernel_swap.ENV, "hisparse")
    plugin.register()
    plugin.register()  # vLLM may call it again
    got = samples(registry)
    assert got[info("hisparse", "hisparse")] == 1
    assert [k for k in got if k[0] == "hisparse_decode_kernels_info"] == [info("hisparse", "hisparse")]
    assert ERRORS not in got
    call_all_four()
    assert standins().take() == [("ours", op) for op in OURS_ORDER]


def test_plugin_failure_is_loud_and_leaves_vllms_ops(registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    stand_in(monkeypatch, UNWRITTEN_NS)
    monkeypatch.setenv(kernel_swap.ENV, "hisparse")
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()  # never raises
    got = samples(registry)
    assert got[info("hisparse", "vllm")] == 1
    assert [k for k in got if k[0] == "hisparse_decode_kernels_info"] == [info("hisparse", "vllm")]
    assert got[ERRORS] == 1
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "HISPARSE_DECODE_KERNELS=hisparse could not be installed" in error.getMessage()
    assert "argument 0 'device_global_indices'" in error.getMessage(), "the log names the difference"
    call_all_four()
    assert standins().take() == [("vllm", op) for op in CALL_ORDER]


def test_plugin_reports_an_unknown_choice(registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(monkeypatch, OURS_NS)
    monkeypatch.setenv(kernel_swap.ENV, "triton")
    plugin.register()
    got = samples(registry)
    assert got[info("triton", "vllm")] == 1 and got[ERRORS] == 1


def test_plugin_without_the_variable_keeps_vllms_ops(registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(monkeypatch, OURS_NS)
    plugin.register()
    got = samples(registry)
    assert got[info("vllm", "vllm")] == 1 and ERRORS not in got
    call_all_four()
    assert standins().take() == [("vllm", op) for op in CALL_ORDER]
