"""``hisparse-runtime``: the in-pod command line.

Each subcommand imports its implementation only when chosen, so ``parity`` does not load NIXL and
``nixl-check`` does not load httpx-only code paths it does not need.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from hisparse_runtime.engine.model import FETCH_SUBCOMMAND
from hisparse_runtime.engine.parity import RUNTIME_COMMAND
from hisparse_runtime.versions import runtime_version


def build_parser() -> argparse.ArgumentParser:
    from hisparse_runtime import fetch_model, mooncake_check, parity, probes, serve
    from hisparse_runtime.nixl_check import command as nixl_command
    from hisparse_runtime.preflight import command as preflight_command

    parser = argparse.ArgumentParser(prog=RUNTIME_COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {runtime_version()}")
    parser.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    nixl_command.add_parser(sub)
    fetch_model.add_parser(sub)
    mooncake_check.add_parser(sub)
    parity.add_parser(sub)
    preflight_command.add_parser(sub)
    serve.add_parser(sub)
    probes.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    if args.command == "nixl-check":
        from hisparse_runtime.nixl_check import command as nixl_command

        code = nixl_command.run(args)
        # The UCX bundled with NIXL wheels can crash in a library destructor at process exit
        # (SIGSEGV in libnl's rtnl_tc_unregister when the ib module was loaded); that would
        # replace the check's exit code, so leave without running native destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if args.command == "mooncake-check":
        from hisparse_runtime import mooncake_check

        return mooncake_check.run(args)
    if args.command == FETCH_SUBCOMMAND:
        from hisparse_runtime import fetch_model

        return fetch_model.run(args)
    if args.command == "serve":
        from hisparse_runtime import serve

        return serve.run(args)
    if args.command == "probe":
        from hisparse_runtime import probes

        return probes.run(args)
    if args.command == "preflight":
        from hisparse_runtime.preflight import command as preflight_command

        return preflight_command.run(args)
    from hisparse_runtime import parity

    return parity.run(args)


if __name__ == "__main__":
    sys.exit(main())
