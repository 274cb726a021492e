"""Preflight: before ``vllm serve`` starts, prove this node and these settings can run the role.

Checks (each a clear message and its own exit code, ``EXIT_CODES``): the engine rules of
``hisparse_runtime.engine`` (the same validators the operator's webhook runs), the model's
``config.json`` against the declared DSA facts, GPUs and their architecture, the compiled ops, the
memlock limit, free host memory for the host pools of the pod's DP ranks plus headroom, /dev/shm, the
NIXL side-channel host, the UCX transports (a NIXL loopback through them), the MoE backend
the render chose against the live GPU's family (with the activation-scale rounding that follows it),
and the decode kernels ``HISPARSE_DECODE_KERNELS`` names (the project's installed under vLLM's op
names and proven by one real call), and the RDMA verbs devices the role requests (``rdma.count``) and
Mooncake's ``deviceName`` names.

``run_preflight`` runs them all and returns a ``PreflightReport``; the entrypoint writes it for the
vLLM plugin (``hisparse_preflight_check_passed``) and exits with the first failure's code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hisparse_runtime.preflight_report import PreflightReport

__all__ = [
    "CHECKS",
    "EXIT_CODES",
    "MIN_SHM_GIB",
    "SUPPORTED_CAPABILITIES",
    "GpuFact",
    "PreflightContext",
    "exit_code",
    "run_preflight",
]

_CHECKS_NAMES = {"CHECKS", "EXIT_CODES", "MIN_SHM_GIB", "SUPPORTED_CAPABILITIES", "PreflightContext"}


def __getattr__(name: str) -> Any:
    # Loaded on first use: the CLI builds its parser from preflight.command without importing the
    # engine core, so the link checks keep working while that package changes.
    if name in _CHECKS_NAMES:
        from hisparse_runtime.preflight import checks

        return getattr(checks, name)
    if name == "GpuFact":
        from hisparse_runtime.preflight.facts import GpuFact

        return GpuFact
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_preflight(ctx: Any) -> PreflightReport:
    """Run every check on ``ctx`` (a ``PreflightContext``); a check that crashes counts as failed."""
    from hisparse_runtime.preflight.checks import CHECKS, EXIT_CODES
    from hisparse_runtime.preflight_report import CheckOutcome, PreflightReport

    outcomes: list[CheckOutcome] = []
    for check in CHECKS:
        try:
            outcome = check(ctx)
        except Exception as exc:
            name = check.__name__
            outcome = CheckOutcome(name=name, ok=False, message=f"check crashed: {type(exc).__name__}: {exc}",
                                   exit_code=EXIT_CODES[name])  # fmt: skip
        if outcome is not None:
            outcomes.append(outcome)
    return PreflightReport(checks=outcomes)


def exit_code(report: PreflightReport) -> int:
    """The first failed check's exit code, 0 when all passed."""
    return next((c.exit_code for c in report.checks if not c.ok), 0)
