"""The plugin loaded by vLLM 0.33's own plugin loaders, in a fresh interpreter, on CPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rtsupport import child_env

from hisparse_runtime.preflight_report import REPORT_PATH_ENV, CheckOutcome, PreflightReport, write_report

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed in this environment")

# The distribution's entry points, as pyproject declares them, on a throwaway dist-info: vLLM's
# loader finds plugins through importlib.metadata exactly as it would for the installed package.
ENTRY_POINTS = """\
[vllm.general_plugins]
hisparse = hisparse_runtime.plugin:register

[vllm.stat_logger_plugins]
hisparse = hisparse_runtime.plugin.stat_logger:HiSparseStatLogger
"""

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from types import SimpleNamespace
    from prometheus_client import REGISTRY, generate_latest
    from vllm.plugins import load_general_plugins
    from vllm.v1.metrics.loggers import load_stat_logger_plugin_factories
    from vllm.config import KVTransferConfig
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.stats import HiSparseKVConnectorStats
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats

    load_general_plugins()
    load_general_plugins()  # vLLM may call it again; metrics must not be registered twice
    # An editable install of the project may declare the same entry point: one class either way.
    [cls] = {f for f in load_stat_logger_plugin_factories() if f.__name__ == "HiSparseStatLogger"}
    kv = KVTransferConfig(
        kv_connector="MultiConnector", kv_role="kv_consumer",
        kv_connector_extra_config={"connectors": [
            {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"},
            {"kv_connector": "HiSparseConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"host_pool_gib": 160}}]})
    # A full VllmConfig needs a model checkpoint; the logger reads only these two attributes.
    config = SimpleNamespace(kv_transfer_config=kv, model_config=SimpleNamespace(served_model_name="tiny-dsa"))
    logger = cls(config, 0)
    stats = HiSparseKVConnectorStats()
    stats.record_snapshot(90, 10, 10 * 656)
    stats.record_host_usage(0.25, 2)
    payload = MultiKVConnectorStats(data={"HiSparseConnector": stats}).to_dict()
    logger.record(SchedulerStats(kv_connector_stats=payload), None)
    logger.record(SchedulerStats(kv_connector_stats={"cache_hits": ["not a number"]}), None)  # must not raise
    logger.record(None, None)
    sys.stdout.write(generate_latest(REGISTRY).decode())
    """
)


def run_in_vllm(tmp_path: Path, report: str | None, **extra_env: str) -> str:
    dist = tmp_path / "site" / "hisparse_plugin_probe-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hisparse-plugin-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    env = child_env(VLLM_TARGET_DEVICE="cpu", VLLM_PLUGINS="hisparse")
    env["PYTHONPATH"] = f"{tmp_path / 'site'}:{env['PYTHONPATH']}"
    report_path = tmp_path / "preflight.json"
    if report is not None:
        report_path.write_text(report)
    env[REPORT_PATH_ENV] = str(report_path)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("HISPARSE_DECODE_KERNELS", None)
    env.update(extra_env)
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_loaded_by_vllm_with_build_info_preflight_and_connector_stats(tmp_path: Path) -> None:
    report = PreflightReport(checks=[CheckOutcome(name="memlock", ok=True),
                                     CheckOutcome(name="shm", ok=False, message="too small", exit_code=36)])  # fmt: skip
    write_report(report, tmp_path / "r.json")
    got = samples(run_in_vllm(tmp_path, (tmp_path / "r.json").read_text()))
    engine = (("engine", "0"), ("model_name", "tiny-dsa"))
    assert got[("hisparse_hot_buffer_hits_total", engine)] == 90
    assert got[("hisparse_hot_buffer_misses_total", engine)] == 10
    assert got[("hisparse_swapped_in_bytes_total", engine)] == 6560
    assert got[("hisparse_host_pool_usage_ratio", engine)] == 0.25
    assert got[("hisparse_host_pool_size_bytes", engine)] == 160 * (1 << 30)
    assert got[("hisparse_preflight_check_passed", (("check", "memlock"),))] == 1
    assert got[("hisparse_preflight_check_passed", (("check", "shm"),))] == 0
    assert got[("hisparse_plugin_errors_total", (("stage", "record"),))] == 1, "the bad payload was counted, not raised"
    [info] = [labels for name, labels in got if name == "hisparse_build_info"]
    assert dict(info)["vllm_version"] == "0.33.0"
    assert got[("hisparse_decode_kernels_info", (("active", "vllm"), ("requested", "vllm")))] == 1
    assert ("hisparse_plugin_errors_total", (("stage", "kernels"),)) not in got


def test_decode_kernels_that_cannot_load_leave_vllms_ops_and_say_so(tmp_path: Path) -> None:
    """HISPARSE_DECODE_KERNELS=hisparse where vLLM's compiled ops cannot load (no CUDA driver here): vLLM
    still starts its plugins, and the metrics show the fallback."""
    got = samples(run_in_vllm(tmp_path, None, HISPARSE_DECODE_KERNELS="hisparse"))
    assert got[("hisparse_decode_kernels_info", (("active", "vllm"), ("requested", "hisparse")))] == 1
    assert got[("hisparse_plugin_errors_total", (("stage", "kernels"),))] == 1
    assert got[("hisparse_hot_buffer_hits_total", (("engine", "0"), ("model_name", "tiny-dsa")))] == 90


def test_a_corrupt_preflight_report_does_not_stop_vllm(tmp_path: Path) -> None:
    got = samples(run_in_vllm(tmp_path, "{not json"))
    assert got[("hisparse_plugin_errors_total", (("stage", "preflight"),))] == 1
    assert not [k for k in got if k[0] == "hisparse_preflight_check_passed"]
    assert any(name == "hisparse_build_info" for name, _ in got)


def test_no_preflight_report_means_no_preflight_series(tmp_path: Path) -> None:
    got = samples(run_in_vllm(tmp_path, None))
    assert not [k for k in got if k[0] == "hisparse_preflight_check_passed"]
    assert ("hisparse_plugin_errors_total", (("stage", "preflight"),)) not in got
    assert got[("hisparse_hot_buffer_hits_total", (("engine", "0"), ("model_name", "tiny-dsa")))] == 90
