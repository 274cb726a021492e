"""The CPU engine's process: load the model named by the parsed argv, start the engine loop and NIXL,
serve vLLM's OpenAI endpoints, drain on SIGTERM.

Endpoints (vLLM 0.33's paths and shapes): ``POST /v1/completions`` (request validated by vLLM's own
``CompletionRequest``; greedy, non-streaming), ``GET /health``, ``GET /v1/models``, ``GET /metrics``.

Drain, as ``vllm serve`` does with ``--shutdown-timeout``: on SIGTERM/SIGINT the server stops taking
requests (503), lets in-flight ones finish for up to ``shutdown_timeout`` seconds (0, vLLM's default,
aborts them at once), answers every one of them, then releases NIXL and exits 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hisparse_runtime.cpu_engine.args import EngineConfigError, ServeConfig
from hisparse_runtime.cpu_engine.checkpoint import Checkpoint, load_checkpoint, perturb_output_head, resolve_model_dir
from hisparse_runtime.engine import env as E
from hisparse_runtime.cpu_engine.runner import EngineRequest, Runner

__all__ = ["Engine", "serve"]

log = logging.getLogger("hisparse.cpu_engine")
GIB = 1 << 30


class HTTPError(Exception):
    def __init__(self, code: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.code, self.message, self.kind = code, message, kind


def tokenize(text: str, vocab: int) -> list[int]:
    return [b % vocab for b in text.encode("utf-8")]


def token_text(token: int) -> str:
    return chr(token) if token < 256 else f"<{token}>"


class Engine:
    """Model + engine loop + (optional) NIXL, for one parsed ``vllm serve`` argv."""

    def __init__(self, cfg: ServeConfig, checkpoint: Checkpoint, environ: dict[str, str]) -> None:
        self.cfg = cfg
        self.environ = environ
        self.checkpoint = checkpoint
        self.model_name = cfg.served_model_name
        self.vocab = checkpoint.config.vocab_size
        self.max_model_len = cfg.max_model_len or checkpoint.capacity_tokens
        weights = checkpoint.weights
        self.runner = Runner(weights, hisparse=cfg.hisparse, on_finish=self._on_finish, on_step=self._on_step)
        from hisparse_runtime.cpu_engine.metrics import EngineMetrics

        self.metrics = EngineMetrics(
            self.model_name, kv_row_bytes=checkpoint.config.kv_row_bytes,
            host_pool_bytes=int(cfg.hisparse_host_pool_gib * GIB) if cfg.hisparse_host_pool_gib else None,
        )  # fmt: skip
        self.nixl = None
        if cfg.nixl:
            from hisparse_runtime.cpu_engine.kv_transfer import KVLayout, NixlKV, Region

            fingerprint = hashlib.sha256(json.dumps(checkpoint.hf_config, sort_keys=True).encode()).hexdigest()[:16]
            regions = {"kv": Region(*self.runner.kv_region()), "index": Region(*self.runner.index_region())}
            self.nixl = NixlKV(cfg.engine_id or f"cpu-engine-{uuid.uuid4().hex[:12]}", regions,
                               KVLayout(checkpoint.config.block_size, fingerprint), environ)  # fmt: skip
            self.runner.pull = self._pull
            self.runner.notifications = self.nixl.read_notifications
            self.runner.hold_seconds = self.nixl.abort_timeout_s
            self.runner.recompute_on_pull_failure = cfg.kv_load_failure_policy == "recompute"
        self.draining = threading.Event()
        self.inflight = 0
        self.inflight_lock = threading.Condition()

    # ------------------------------------------------------------------ engine callbacks
    def _pull(self, req: EngineRequest, blocks: list[int]) -> int:
        assert self.nixl is not None and req.remote_kv is not None
        start = time.monotonic()
        fault_file = self.environ.get(E.HISPARSE_CPU_ENGINE_FAULT_FILE)
        fault = Path(fault_file).read_text().strip() if fault_file and Path(fault_file).is_file() else ""
        try:
            moved = self.nixl.pull(req.remote_kv, blocks, fault=fault)
        except Exception:
            self.metrics.nixl_failed.inc()
            raise
        self.metrics.nixl_xfer_time.observe(time.monotonic() - start)
        self.metrics.nixl_bytes.observe(moved)
        return moved

    def _on_step(self, rows: list[EngineRequest], batch: int) -> None:
        s = self.runner.stats
        if self.cfg.hisparse:
            hits, misses = self.runner.kv.counters()
            self.metrics.hot_buffer(hits, misses, s.blocks_used / s.blocks_total if s.blocks_total else 0.0)
        self.metrics.scheduler(sum(1 for r in self.runner.rows if r is not None), len(self.runner.waiting),
                               self.checkpoint.config.num_blocks - len(self.runner.free_blocks),
                               self.checkpoint.config.num_blocks)  # fmt: skip

    def _on_finish(self, req: EngineRequest) -> None:
        m = self.metrics
        m.success[req.finish_reason or "error"].inc()
        m.prompt_tokens.inc(req.computed_prompt_tokens + req.external_prompt_tokens)
        m.prompt_by_source["local_compute"].inc(req.computed_prompt_tokens)
        m.prompt_by_source["external_kv_transfer"].inc(req.external_prompt_tokens)
        m.prefix_queries.inc(len(req.prompt))
        m.generation_tokens.inc(len(req.output))
        if req.first_token is not None:
            m.ttft.observe(req.first_token - req.arrival)
        for a, b in zip(req.token_times, req.token_times[1:]):
            m.itl.observe(b - a)
        if req.scheduled is not None:
            m.queue_time.observe(req.scheduled - req.arrival)
        m.e2e.observe(time.monotonic() - req.arrival)
        if req.hold_kv and self.nixl is not None and req.finish_reason == "length":
            req.kv_transfer_params = self.nixl.params_for(req.request_id, req.blocks, len(req.prompt))
        self._on_step([], 0)

    # ------------------------------------------------------------------ completions
    def complete(self, body: Any, request_id_header: str | None) -> dict[str, Any]:
        from pydantic import ValidationError
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        if not isinstance(body, dict):
            raise HTTPError(400, "the request body must be a JSON object")
        try:
            request = CompletionRequest.model_validate(body)
        except ValidationError as exc:
            raise HTTPError(400, str(exc)) from exc
        if request.model not in (None, self.model_name):
            raise HTTPError(404, f"The model `{request.model}` does not exist.", "NotFoundError")
        if request.stream:
            raise HTTPError(400, "this CPU engine (a stand-in for vLLM) does not stream")
        if (request.n or 1) != 1 or request.use_beam_search:
            raise HTTPError(400, "this CPU engine decodes one greedy sequence per prompt (n must be 1)")
        if request.temperature not in (None, 0, 0.0):
            raise HTTPError(400, "this CPU engine decodes greedily only: set temperature to 0")
        if request.logprobs is not None and request.logprobs > self.cfg.max_logprobs:
            raise HTTPError(400, f"Requested logprobs of {request.logprobs}, which is greater than max allowed:"
                                 f" {self.cfg.max_logprobs}")  # fmt: skip
        prompts = self._prompts(request.prompt)
        max_tokens = 16 if request.max_tokens is None else int(request.max_tokens)
        params = request.kv_transfer_params or None
        base = f"cmpl-{request_id_header or uuid.uuid4().hex}"
        reqs = []
        for i, prompt in enumerate(prompts):
            if len(prompt) + max_tokens > self.max_model_len:
                raise HTTPError(400, f"This model's maximum context length is {self.max_model_len} tokens. However,"
                                     f" your request has {len(prompt)} input tokens and requests {max_tokens} output"
                                     " tokens.")  # fmt: skip
            remote = params if params and params.get("do_remote_prefill") and params.get("remote_block_ids") else None
            if remote is not None and self.nixl is None:
                raise HTTPError(400, "kv_transfer_params ask for a remote prefill, but no NixlConnector is configured")
            reqs.append(EngineRequest(
                request_id=f"{base}-{i}", prompt=prompt, max_tokens=max_tokens, logprobs=request.logprobs,
                remote_kv=remote, hold_kv=bool(params and params.get("do_remote_decode")),
            ))  # fmt: skip
        for req in reqs:
            try:
                self.runner.submit(req)
            except ValueError as exc:
                raise HTTPError(400, str(exc)) from exc
        for req in reqs:
            req.done.wait()
        failed = next((r for r in reqs if r.finish_reason in ("error", "abort")), None)
        if failed is not None:
            code = 503 if failed.finish_reason == "abort" else 500
            raise HTTPError(code, f"request {failed.request_id}: {failed.error}",
                            "ServiceUnavailableError" if code == 503 else "InternalServerError")  # fmt: skip
        return self._response(base, request, reqs)

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompts = [tokenize(prompt, self.vocab)]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompts = [list(prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = [tokenize(p, self.vocab) for p in prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            prompts = [list(p) for p in prompt]
        else:
            raise HTTPError(400, "prompt must be a string, a list of strings or a list of token id lists")
        for p in prompts:
            if not p:
                raise HTTPError(400, "the prompt is empty")
            bad = [t for t in p if not isinstance(t, int) or not 0 <= t < self.vocab]
            if bad:
                raise HTTPError(400, f"token ids {bad[:5]} are outside this model's vocabulary [0, {self.vocab})")
        return prompts

    def _response(self, base: str, request: Any, reqs: list[EngineRequest]) -> dict[str, Any]:
        as_ids = bool(getattr(request, "return_tokens_as_token_ids", False))

        def name(t: int) -> str:
            return f"token_id:{t}" if as_ids else token_text(t)

        choices = []
        for i, req in enumerate(reqs):
            text = "".join(token_text(t) for t in req.output)
            logprobs = None
            if req.logprobs is not None:
                offsets, off = [], 0
                for t in req.output:
                    offsets.append(off)
                    off += len(token_text(t))
                logprobs = {
                    "text_offset": offsets,
                    "token_logprobs": req.token_logprobs,
                    "tokens": [name(t) for t in req.output],
                    "top_logprobs": [{name(t): lp for t, lp in top} if req.logprobs else None
                                     for top in req.top_logprobs],
                }  # fmt: skip
            choice: dict[str, Any] = {"index": i, "text": text, "logprobs": logprobs,
                                      "finish_reason": req.finish_reason, "stop_reason": None}  # fmt: skip
            if request.return_token_ids:
                choice["token_ids"] = list(req.output)
                choice["prompt_token_ids"] = list(req.prompt)
            choices.append(choice)
        prompt_tokens = sum(len(r.prompt) for r in reqs)
        completion_tokens = sum(len(r.output) for r in reqs)
        cached = sum(r.external_prompt_tokens for r in reqs)
        return {
            "id": base,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                      "completion_tokens": completion_tokens,
                      "prompt_tokens_details": {"cached_tokens": cached} if cached else None},
            "kv_transfer_params": reqs[0].kv_transfer_params if len(reqs) == 1 else None,
        }  # fmt: skip

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        self.runner.start()

    def drain(self, timeout_s: float) -> None:
        """Stop taking requests, let in-flight ones finish for ``timeout_s``, abort the rest, and wait
        until every request has been answered."""
        self.draining.set()
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while self.runner.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.runner.busy():
            log.info("shutdown timeout reached: aborting in-flight requests")
            self.runner.abort_all()
        with self.inflight_lock:
            self.inflight_lock.wait_for(lambda: self.inflight == 0, timeout=30)

    def close(self) -> None:
        self.runner.stop()
        if self.nixl is not None:
            self.nixl.close()


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        engine = self.server.engine
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if engine.draining.is_set():
                self._error(HTTPError(503, "the server is shutting down", "ServiceUnavailableError"))
            else:
                self._send(200, b"", "application/json")
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{
                "id": engine.model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": engine.cfg.model, "parent": None, "max_model_len": engine.max_model_len,
                "permission": [],
            }]})  # fmt: skip
        elif path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

            self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        else:
            self._error(HTTPError(404, "Not Found", "NotFoundError"))

    def do_POST(self) -> None:  # noqa: N802
        engine = self.server.engine
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.split("?", 1)[0] != "/v1/completions":
            self._error(HTTPError(404, "Not Found", "NotFoundError"))
            return
        with engine.inflight_lock:
            if engine.draining.is_set():
                refused = True
            else:
                refused = False
                engine.inflight += 1
        if refused:
            self._error(HTTPError(503, "the server is shutting down", "ServiceUnavailableError"))
            return
        try:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise HTTPError(400, f"invalid JSON: {exc}") from exc
            self._json(200, engine.complete(body, self.headers.get("x-request-id")))
        except HTTPError as exc:
            self._error(exc)
        except Exception as exc:  # noqa: BLE001 - answer, never drop the connection
            log.exception("completion failed")
            self._error(HTTPError(500, f"{type(exc).__name__}: {exc}", "InternalServerError"))
        finally:
            with engine.inflight_lock:
                engine.inflight -= 1
                engine.inflight_lock.notify_all()

    def _error(self, exc: HTTPError) -> None:
        # vLLM's ErrorResponse shape.
        self._json(exc.code, {"error": {"message": exc.message, "type": exc.kind, "param": None, "code": exc.code}})

    def _json(self, code: int, payload: dict[str, Any]) -> None:
        self._send(code, json.dumps(payload).encode(), "application/json")

    def _send(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("%s - %s", self.address_string(), format % args)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        self.engine = engine
        super().__init__(address, _Handler)


def build_engine(cfg: ServeConfig, environ: dict[str, str]) -> Engine:
    checkpoint = load_checkpoint(resolve_model_dir(cfg.model, cfg.revision))
    c = checkpoint.config
    if cfg.block_size and cfg.block_size != c.block_size:
        capacity = checkpoint.capacity_tokens
        if capacity % cfg.block_size:
            raise EngineConfigError(f"--block-size {cfg.block_size} does not divide the model's KV capacity of"
                                    f" {capacity} tokens")  # fmt: skip
        c = dataclasses.replace(c, block_size=cfg.block_size, num_blocks=capacity // cfg.block_size)
        checkpoint.weights.config = c
        checkpoint = dataclasses.replace(checkpoint, config=c)
    limit = checkpoint.capacity_tokens
    if cfg.max_model_len is not None and cfg.max_model_len > limit:
        # vLLM's rule (ModelConfig): max_model_len may not exceed the model's max_position_embeddings.
        raise EngineConfigError(f"User-specified max_model_len ({cfg.max_model_len}) is greater than the derived"
                                f" max_model_len (max_position_embeddings={limit} in the model's config.json)."
                                " Lower --max-model-len (the role's spec.engine.maxModelLen).")  # fmt: skip
    if environ.get(E.HISPARSE_CPU_ENGINE_PERTURB, "") not in ("", "0"):
        log.warning("%s is set: this engine's tokens deliberately differ from the checkpoint's",
                    E.HISPARSE_CPU_ENGINE_PERTURB)
        perturb_output_head(checkpoint)
    return Engine(cfg, checkpoint, environ)


def serve(cfg: ServeConfig, environ: dict[str, str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    environ = dict(os.environ if environ is None else environ)
    engine = build_engine(cfg, environ)
    host = cfg.host or "0.0.0.0"
    httpd = _HTTPServer((host, cfg.port), engine)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.set())
    engine.start()
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    ready = {"event": "ready", "port": httpd.server_address[1], "model": engine.model_name,
             "hisparse": cfg.hisparse, "kv_role": cfg.kv_role,
             "side_channel_port": engine.nixl.port if engine.nixl is not None else None}  # fmt: skip
    print(json.dumps(ready), flush=True)
    log.info("CPU engine serving %s on %s:%s", engine.model_name, host, httpd.server_address[1])
    stop.wait()
    log.info("shutting down: draining for up to %ss", cfg.shutdown_timeout)
    engine.drain(cfg.shutdown_timeout)
    httpd.shutdown()
    httpd.server_close()
    engine.close()
    print(json.dumps({"event": "stopped"}), flush=True)
    sys.stdout.flush()
    return 0
