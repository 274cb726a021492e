"""``hisparse-runtime serve``: the serving container's entrypoint.

1. Load the role's engine settings from the mounted ConfigMap JSON (never by parsing an argv).
2. Re-check every engine rule, then run preflight on the live node; each failure exits with its code
   before vLLM spends 20 minutes loading weights.
3. Render ``vllm serve`` for this pod (LeaderWorkerSet index and leader address from the environment).
4. Prefill pods publish a registered buffer for the decode side's NIXL link check.
5. Run vLLM (or, where the image sets ``HISPARSE_SERVING_ENGINE=cpu``, the CPU engine stand-in with the
   same argv) as a child in its own process group and stay as a thin supervisor: SIGTERM/SIGINT are
   forwarded to vLLM at once, the pod is marked draining so the liveness probe does not kill it while
   the pinned host pool unpins, and the entrypoint exits with vLLM's exit code. It never SIGKILLs
   vLLM itself: a kill mid-unpin can wedge the GPU driver; the grace period rendered by the operator
   (``terminationGracePeriodSeconds``) is sized for the pod's preStop sleep (it keeps serving while the
   EPP and kube-proxy drop it), vLLM's drain (``--shutdown-timeout``, rendered) and unpinning.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from hisparse_runtime import podstate
from hisparse_runtime.engine import PROBE_PORT, RoleSettings, check_role, pod_argv
from hisparse_runtime.engine import env as E
from hisparse_runtime.engine.exit_codes import BAD_SETTINGS_EXIT_CODE
from hisparse_runtime.probe_server import ProbeServer

log = logging.getLogger("hisparse.serve")

EXIT_BAD_SETTINGS = BAD_SETTINGS_EXIT_CODE
"""The mounted settings cannot be read or break an engine rule (preflight's own codes: ``PREFLIGHT_EXIT_CODES``)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="preflight, then run vllm serve for this pod and supervise it")
    p.add_argument("--role", required=True, choices=["prefill", "decode"])
    p.add_argument("--config", required=True, type=Path, help="the role's engine settings (JSON, from the ConfigMap)")
    p.add_argument("--skip-preflight", action="store_true", help="skip node checks (tests and debugging only)")
    p.add_argument("--probe-port", type=int, default=PROBE_PORT,
                   help=f"where /livez and /readyz answer (default {PROBE_PORT}, which the pod's probes name; 0: any free "
                        "port, for tests on one host)")
    p.add_argument("--dry-run", action="store_true", help="print the vllm argv as JSON and exit")


def load_settings(path: Path, role: str) -> RoleSettings:
    settings = RoleSettings.model_validate_json(path.read_text(encoding="utf-8"))
    if settings.role != role:
        raise ValueError(f"{path} holds the {settings.role} role, not {role}")
    return settings


def run(args: argparse.Namespace, environ: dict[str, str] | None = None) -> int:
    import json

    from pydantic import ValidationError

    environ = dict(os.environ if environ is None else environ)
    try:
        settings = load_settings(args.config, args.role)
    except (OSError, ValueError, ValidationError) as exc:
        print(f"hisparse-runtime serve: cannot load engine settings from {args.config}: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    violations = check_role(settings)
    if violations:
        for v in violations:
            print(f"hisparse-runtime serve: {v}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    argv = pod_argv(settings, environ)
    if args.dry_run:
        print(json.dumps(argv))
        return 0
    try:
        command = engine_command(argv, environ)
    except ValueError as exc:
        print(f"hisparse-runtime serve: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    if not args.skip_preflight:
        from hisparse_runtime.preflight import PreflightContext, exit_code, run_preflight
        from hisparse_runtime.preflight_report import write_report

        report = run_preflight(PreflightContext(settings=settings, env=environ))
        try:
            write_report(report, None)
        except OSError as exc:
            log.warning("preflight report not written: %s", exc)
        code = exit_code(report)
        if code:
            for check in report.checks:
                if not check.ok:
                    print(f"hisparse-runtime serve: preflight {check.name}: {check.message}", file=sys.stderr)
            return code
    publisher = _start_link_check_source(settings, environ)
    # Liveness and readiness for the kubelet's HTTP probes (probe_server.py); the startup probe is vLLM's /health.
    probe_server = ProbeServer(settings, port=args.probe_port).start()
    try:
        return supervise(command, environ)
    finally:
        probe_server.close()
        if publisher is not None:
            publisher.close()


LINK_CHECK_BYTES = 8 << 20
LINK_CHECK_PARTS = 8


class _LinkCheckSource:
    """The prefill side of the decode pods' link check: a registered buffer and its publisher."""

    def __init__(self, settings: RoleSettings) -> None:
        from hisparse_runtime.nixl_check import SourceBuffer, publish

        self.source = SourceBuffer(LINK_CHECK_BYTES, LINK_CHECK_PARTS, backends=["UCX"])
        self.publisher = publish(self.source, host="0.0.0.0", port=settings.kv_transfer.nixl.link_check_port)

    def close(self) -> None:
        self.publisher.close()
        self.source.close()


def _start_link_check_source(settings: RoleSettings, environ: dict[str, str]) -> _LinkCheckSource | None:
    if settings.role != "prefill" or not settings.disaggregated:
        return None
    return _LinkCheckSource(settings)


SERVING_ENGINES = ("vllm", "cpu")


def engine_command(argv: list[str], environ: dict[str, str]) -> list[str]:
    """The command that serves ``argv`` (``vllm serve ...``): vLLM itself, or where the image sets
    ``HISPARSE_SERVING_ENGINE=cpu`` the CPU engine stand-in, given the very same arguments."""
    engine = environ.get(E.HISPARSE_SERVING_ENGINE, "vllm") or "vllm"
    if engine not in SERVING_ENGINES:
        raise ValueError(f"{E.HISPARSE_SERVING_ENGINE}={engine!r} is not one of {list(SERVING_ENGINES)}")
    if engine == "cpu":
        return [sys.executable, "-m", "hisparse_runtime.cpu_engine", *argv[1:]]
    return argv


def supervise(argv: list[str], environ: dict[str, str]) -> int:
    """Run ``argv`` and forward SIGTERM/SIGINT to it; return its exit code (128+N for a signal)."""
    podstate.clear(podstate.DRAINING)
    child = subprocess.Popen(argv, env=environ, start_new_session=True)

    def forward(signum: int, _frame: Any) -> None:
        podstate.mark(podstate.DRAINING, str(signum))
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - rc if rc < 0 else rc
