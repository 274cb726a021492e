"""vLLM plugin: HiSparse metrics on vLLM's own ``/metrics`` endpoint.

Two entry points (both in the ``hisparse`` distribution):

- ``vllm.general_plugins``: ``hisparse = hisparse_runtime.plugin:register``. vLLM calls it in every
  process; it creates the metrics, sets ``hisparse_build_info`` and the preflight gauges from the
  report the entrypoint wrote. It never raises (vLLM's loader does not guard plugin calls). It also installs the HiSparse host
  placement policy named by ``HISPARSE_HOST_PLACEMENT`` (``hisparse_runtime.plugin.placement``;
  unset: vLLM's own order), and the decode kernels named by ``HISPARSE_DECODE_KERNELS``
  (``hisparse_runtime.plugin.kernel_swap``; unset: vLLM's own ops), shown by
  ``hisparse_decode_kernels_info``.
- ``vllm.stat_logger_plugins``: ``hisparse = hisparse_runtime.plugin.stat_logger:HiSparseStatLogger``.
  It reads the HiSparse connector stats (hot-buffer hits/misses, bytes swapped in, host pool usage).

Metric names and types: ``hisparse_runtime.plugin.metrics``.
"""

from __future__ import annotations

import logging
import os

from hisparse_runtime.plugin.metrics import METRIC_TYPES, HiSparseMetrics, metrics

__all__ = ["METRIC_TYPES", "HiSparseMetrics", "build_labels", "metrics", "register"]

log = logging.getLogger(__name__)


def build_labels() -> dict[str, str]:
    """Label values of ``hisparse_build_info``: our version, the pinned vLLM and the kernels package."""
    from importlib.metadata import PackageNotFoundError, version

    from hisparse_runtime.versions import runtime_version

    labels = {"version": runtime_version(), "vllm_version": "unknown", "kernels_version": "absent"}
    try:
        labels["vllm_version"] = version("vllm")
    except PackageNotFoundError:
        pass
    try:
        import hisparse_kernels

        labels["kernels_version"] = str(getattr(hisparse_kernels, "__version__", labels["version"]))
    except Exception:  # the kernels are optional in the runtime; a broken build must not stop vLLM
        pass
    return labels


def register() -> None:
    """vLLM general-plugin hook. Safe to call many times; never raises."""
    try:
        m = metrics()
    except Exception:
        log.warning("HiSparse metrics could not be created; vLLM continues without them", exc_info=True)
        return
    for stage, step in (("build_info", _set_build_info), ("preflight", _set_preflight),
                        ("placement", _install_placement), ("kernels", _install_kernels)):
        try:
            step(m)
        except Exception:
            log.warning("HiSparse metrics: %s failed; continuing", stage, exc_info=True)
            m.errors.labels(stage).inc()


def _set_build_info(m: HiSparseMetrics) -> None:
    m.set_build_info(build_labels())


def _install_placement(m: HiSparseMetrics) -> None:
    from hisparse_runtime.plugin.placement import install, policy_from_env

    policy = policy_from_env()
    if policy != "vllm":
        install(policy)


def _install_kernels(m: HiSparseMetrics) -> None:
    """The decode kernels ``HISPARSE_DECODE_KERNELS`` names, in this process. vLLM calls the plugin in
    every process, its engine workers included (``init_worker``, before the model is built), so vLLM's
    decode calls reach the kernels installed here. ``install`` loads vLLM's own ops before registering
    ours, so a later import of vLLM's extension cannot put vLLM's kernels back on top. No device work
    here (``verify`` allocates on the GPU; preflight runs it): a CUDA context in vLLM's API server before
    it starts its engine processes would break them.

    A failure is loud but does not stop vLLM: an error in the log, ``hisparse_plugin_errors_total`` for
    stage ``kernels``, and ``hisparse_decode_kernels_info{requested="hisparse",active="vllm"}`` (vLLM's
    own ops serve decode). Preflight refuses the same failure before vLLM starts."""
    from hisparse_runtime.plugin import kernel_swap

    requested = (os.environ.get(kernel_swap.ENV) or "").strip() or "vllm"
    try:
        swap = kernel_swap.install(kernel_swap.choice_from_env(os.environ))
    except Exception as exc:
        m.set_decode_kernels(requested=requested, active="vllm")
        log.error("HiSparse decode kernels: %s=%s could not be installed (%s: %s); vLLM's own ops serve decode",
                  kernel_swap.ENV, requested, type(exc).__name__, exc)  # fmt: skip
        raise  # counted for stage "kernels" (with the traceback) by register()
    m.set_decode_kernels(requested=swap.requested, active=swap.active)


def _set_preflight(m: HiSparseMetrics) -> None:
    from hisparse_runtime.preflight_report import read_report

    report = read_report()
    if report is None:
        return
    for check in report.checks:
        m.preflight.labels(check.name).set(1 if check.ok else 0)
