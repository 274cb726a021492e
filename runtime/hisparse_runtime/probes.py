"""``hisparse-runtime probe live|ready``: the serving container's liveness and readiness probes.

- live: a draining pod (SIGTERM received, host pool unpinning) is alive by definition; otherwise
  vLLM's ``/health`` must answer. (The startup probe covers model loading, so this only runs after.)
- ready: vLLM's ``/health``; on decode of a P/D pair, also proof of the data path once (then again
  every ``REVERIFY_SECONDS``): a NIXL READ of a buffer a prefill pod published (bytes checked), and one
  completion sent through the local llm-d sidecar with a forced prefiller, which must succeed. A decode
  pod whose KV path is broken would otherwise "work" while silently recomputing every prefill.

  The proof needs *any* ready prefill pod: the prefill Service publishes ready pods only, and the probe
  tries them in a random order until one proves the path. One loading, crash-looping or broken prefill
  pod therefore never decides a decode pod's readiness; decode leaves the pool only when no prefill pod
  of its revision can serve it (every one failed, or none is ready).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Final

from hisparse_runtime import podstate
from hisparse_runtime.engine import SERVICE_PORT, RoleSettings

EXIT_OK, EXIT_FAIL = 0, 1
REVERIFY_SECONDS: Final = 600
PREFILLER_HEADER: Final = "x-prefiller-host-port"
PROBE_PROMPT: Final = "hisparse data-path probe: the quick brown fox jumps over the lazy dog " * 8


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("probe", help="liveness / readiness probe of the serving container")
    p.add_argument("kind", choices=["live", "ready"])
    p.add_argument("--role", choices=["prefill", "decode"])
    p.add_argument("--config", type=Path, help="engine settings JSON (default: /etc/hisparse/engine/ROLE.json)")
    p.add_argument("--timeout", type=float, default=10.0)


def _health(port: int, timeout: float) -> str | None:
    """None when healthy, else why not."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
            return None if r.status == 200 else f"/health answered {r.status}"
    except (OSError, urllib.error.URLError) as exc:
        return f"/health unreachable: {exc}"


def prefill_addresses(host: str) -> list[str]:
    """Every prefill pod IP behind the headless Service, sorted."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    ips = sorted({i[4][0] for i in infos})
    if not ips:
        raise OSError(f"{host} has no addresses (no prefill pod published yet)")
    return ips


def verify_data_path(settings: RoleSettings, *, timeout: float, sidecar_port: int = SERVICE_PORT,
                     prefill_http_port: int = SERVICE_PORT, evidence: dict[str, object] | None = None) -> str | None:
    """None when one prefill -> decode transfer is proven against any ready prefill pod, else why none
    could prove it (each pod's reason). ``timeout`` bounds the whole attempt; ``evidence`` receives what
    was proven (the prefill pod, the bytes NIXL moved and checked, the completion's tokens, who failed)."""
    if not settings.peer_host:
        return "no prefill Service known to probe (peerHost is unset)"
    try:
        ips = prefill_addresses(settings.peer_host)
    except OSError as exc:
        return f"no ready prefill pod to prove the data path with: {exc}"
    random.shuffle(ips)  # decode pods spread their probes; a bad pod is not always tried first
    deadline = time.monotonic() + timeout
    failures: list[str] = []
    for ip in ips:
        left = deadline - time.monotonic()
        if left <= 0.5:
            failures.append(f"{ip}: not tried (the probe's {timeout:.0f}s were spent)")
            continue
        why = _prove_with(settings, ip, timeout=left, sidecar_port=sidecar_port, prefill_http_port=prefill_http_port,
                          evidence=evidence)
        if why is None:
            if evidence is not None and failures:
                evidence["prefill_failed"] = failures
            return None
        failures.append(f"{ip}: {why}")
    return f"no prefill pod of {len(ips)} proved the data path: " + "; ".join(failures)


def _prove_with(settings: RoleSettings, ip: str, *, timeout: float, sidecar_port: int, prefill_http_port: int,
                evidence: dict[str, object] | None) -> str | None:
    from hisparse_runtime.nixl_check import read_peer

    nixl = settings.kv_transfer.nixl
    link = read_peer(f"http://{ip}:{nixl.link_check_port}", timeout_s=timeout)
    if not link.ok:
        return f"NIXL link check failed ({link.failure}): {link.error}"
    body = json.dumps({"model": settings.model.served_model_name, "prompt": PROBE_PROMPT, "max_tokens": 1,
                       "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{sidecar_port}/v1/completions", data=body, method="POST",
                                     headers={"content-type": "application/json",
                                              PREFILLER_HEADER: f"{ip}:{prefill_http_port}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            reply = json.loads(r.read())
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return f"completion through the sidecar with this prefiller failed: {exc}"
    if not reply.get("choices"):
        return f"completion through the sidecar returned no choices: {reply}"
    if evidence is not None:
        evidence.update(prefill=ip, nixl_bytes_verified=link.bytes_verified, nixl_backends=link.backends,
                        completion_tokens=(reply.get("usage") or {}).get("completion_tokens"))
    return None


def live(settings: RoleSettings | None, timeout: float, *, vllm_port: int | None = None) -> tuple[int, str]:
    if podstate.age_seconds(podstate.DRAINING) is not None:
        return EXIT_OK, "draining: alive while vLLM shuts down and the host pool unpins"
    if settings is None:
        return EXIT_OK, "no settings: nothing to check"
    why = _health(vllm_port or settings.vllm_port, timeout)
    return (EXIT_FAIL, why) if why else (EXIT_OK, "vLLM healthy")


def ready(settings: RoleSettings, timeout: float, *, vllm_port: int | None = None, sidecar_port: int = SERVICE_PORT,
          prefill_http_port: int = SERVICE_PORT) -> tuple[int, str]:
    """The ports default to the pod's; tests on one host pass their own."""
    if podstate.age_seconds(podstate.DRAINING) is not None:
        return EXIT_FAIL, "draining"
    why = _health(vllm_port or settings.vllm_port, timeout)
    if why:
        return EXIT_FAIL, why
    if settings.role != "decode" or not settings.disaggregated:
        return EXIT_OK, "vLLM healthy"
    age = podstate.age_seconds(podstate.DATA_PATH_OK)
    if age is not None and age < REVERIFY_SECONDS:
        return EXIT_OK, f"vLLM healthy; data path verified {age:.0f}s ago"
    evidence: dict[str, object] = {}
    why = verify_data_path(settings, timeout=timeout, sidecar_port=sidecar_port, prefill_http_port=prefill_http_port,
                           evidence=evidence)
    if why:
        return EXIT_FAIL, why
    podstate.mark(podstate.DATA_PATH_OK, json.dumps(evidence, sort_keys=True))
    return EXIT_OK, "vLLM healthy; prefill -> decode transfer verified"


def run(args: argparse.Namespace) -> int:
    from hisparse_runtime.engine import ENGINE_CONFIG_DIR

    config = args.config or (Path(ENGINE_CONFIG_DIR) / f"{args.role}.json" if args.role else None)
    settings = RoleSettings.model_validate_json(config.read_text()) if config and config.exists() else None
    if args.kind == "live":
        code, message = live(settings, args.timeout)
    elif settings is None:
        code, message = EXIT_FAIL, f"engine settings not found at {config}"
    else:
        code, message = ready(settings, args.timeout)
    print(message, file=sys.stdout if code == 0 else sys.stderr)
    return code
