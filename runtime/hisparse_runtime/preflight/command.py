"""``hisparse-runtime preflight --role R --config FILE``: run the checks, write the report, exit."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="check that this node and these engine settings can run the role, before vLLM starts",
        description="Prints the JSON report, writes it for the vLLM plugin, exits with the first failure's code.",
    )
    parser.add_argument("--role", required=True, choices=["prefill", "decode"])
    parser.add_argument("--config", required=True, type=Path, help="the role's engine settings (JSON, from the ConfigMap)")
    parser.add_argument("--model-dir", type=Path, help="directory with the model's config.json (default: from the settings)")
    parser.add_argument("--report", type=Path, help="where to write the report (default $HISPARSE_PREFLIGHT_REPORT)")
    parser.add_argument("--min-shm-gib", type=float, help="smallest acceptable /dev/shm")


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from hisparse_runtime.engine import RoleSettings
    from hisparse_runtime.preflight import EXIT_CODES, PreflightContext, exit_code, run_preflight
    from hisparse_runtime.preflight_report import CheckOutcome, PreflightReport, write_report

    try:
        settings = RoleSettings.model_validate_json(args.config.read_text(encoding="utf-8"))
        if settings.role != args.role:
            raise ValueError(f"{args.config} holds the {settings.role} role, not {args.role}")
    except (OSError, ValueError, ValidationError) as exc:
        report = PreflightReport(checks=[CheckOutcome(
            name="engine_rules", ok=False, exit_code=EXIT_CODES["engine_rules"],
            message=f"cannot load engine settings from {args.config}: {exc}")])  # fmt: skip
    else:
        ctx = PreflightContext(settings=settings, model_dir=args.model_dir)
        if args.min_shm_gib is not None:
            ctx.min_shm_gib = args.min_shm_gib
        report = run_preflight(ctx)
    try:
        write_report(report, args.report)
    except OSError as exc:  # the report feeds metrics only; a read-only path must not block serving
        print(json.dumps({"warning": f"preflight report not written: {exc}"}))
    print(report.model_dump_json(), flush=True)
    return exit_code(report)
