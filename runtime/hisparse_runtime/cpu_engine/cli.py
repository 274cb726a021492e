"""Command line: ``serve MODEL [vllm serve options]`` (vLLM's argv after the program name), or
``checkpoint DIR`` to write a tiny DSA model directory."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

EXIT_CONFIG = 1
"""A setting vLLM refuses at startup, or a model it cannot load (vLLM exits 1 then too)."""


def _checkpoint(argv: list[str]) -> int:
    from hisparse_runtime.cpu_engine.checkpoint import write_checkpoint, write_hf_cache_checkpoint

    p = argparse.ArgumentParser(prog="python -m hisparse_runtime.cpu_engine checkpoint",
                                description="Write a tiny DSA model directory (config.json + model.safetensors).")
    p.add_argument("path", help="the model directory, or with --hf-repo the Hugging Face cache directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf-repo", help="write into a Hugging Face cache layout as this ORG/NAME")
    p.add_argument("--revision", help="the snapshot's revision (with --hf-repo; default 40 zeros)")
    args = p.parse_args(argv)
    if args.hf_repo:
        out = write_hf_cache_checkpoint(args.path, args.hf_repo, revision=args.revision, seed=args.seed)
    else:
        out = write_checkpoint(args.path, seed=args.seed)
    print(json.dumps({"event": "checkpoint", "path": str(out)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=os.environ.get("VLLM_LOGGING_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    if argv[:1] == ["checkpoint"]:
        return _checkpoint(argv[1:])
    from hisparse_runtime.cpu_engine.args import EngineConfigError, parse_serve_argv

    try:
        cfg = parse_serve_argv(argv)  # argparse errors exit 2 here, as in vLLM
    except (EngineConfigError, ValueError) as exc:
        print(f"hisparse cpu engine: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from hisparse_runtime.cpu_engine.server import serve

    try:
        code = serve(cfg)
    except (EngineConfigError, FileNotFoundError, ValueError) as exc:
        print(f"hisparse cpu engine: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    # Everything (HTTP, engine thread, NIXL registrations) is released by now; the NIXL agent's own
    # teardown in the interpreter's final garbage collection can block forever, so leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
