"""A small HTTP server that answers ``/v1/completions`` with vLLM 0.33's response shape.

Field names mirror ``vllm/entrypoints/openai/completion/protocol.py``: ``CompletionResponse`` (id,
object="text_completion", created, model, choices, usage) and ``CompletionResponseChoice`` (index,
text, logprobs, finish_reason, stop_reason, token_ids, prompt_token_ids). ``token_ids`` and
``prompt_token_ids`` are present only when the request sets ``return_token_ids``, as in vLLM.
Only greedy (temperature 0 or unset), non-streaming, single-choice requests are served.

For llm-d's endpoint picker and routing sidecar it also answers ``GET /metrics`` with the vLLM 0.33
gauges the picker scrapes (``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
``vllm:kv_cache_usage_perc``, ``vllm:lora_requests_info``, ``vllm:cache_config_info``), and answers a
prefill request of NIXL P/D (``kv_transfer_params.do_remote_decode``) with ``kv_transfer_params`` in
the shape vLLM's NixlConnector returns (``do_remote_prefill``, ``remote_engine_id``,
``remote_block_ids``, ``remote_host``, ``remote_port``). It moves no KV: it records what it was sent.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Generator = Callable[[list[int], int], list[int]]
"""Greedy generation: (prompt token ids, max_tokens) -> generated token ids."""

Tokenizer = Callable[[str], list[int]]

Scorer = Callable[[list[int], list[int]], list[dict[int, float]]]
"""(prompt token ids, generated token ids) -> per generated position, token id -> logprob of its top
candidates: what the server answers a request with ``logprobs`` for (vLLM's ``top_logprobs``)."""


def byte_tokenizer(vocab_size: int) -> Tokenizer:
    """UTF-8 bytes folded into the vocabulary: enough to turn text prompts into token ids."""
    return lambda text: [b % vocab_size for b in text.encode("utf-8")]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/metrics":
            data = self.server.metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server.model, "object": "model"}]})
        else:
            self._error(404, f"no route {self.path}", "NotFoundError")

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/completions":
            self._error(404, f"no route {self.path}", "NotFoundError")
            return
        with self.server.lock:
            self.server.requests += 1
            self.server.headers.append({k.lower(): v for k, v in self.headers.items()})
            try:
                self.server.bodies.append(json.loads(raw))
            except ValueError:
                pass
            fail = self.server.fail_next > 0
            if fail:
                self.server.fail_next -= 1
        if fail:
            self._error(503, "injected outage", "ServiceUnavailableError")
            return
        try:
            body = json.loads(raw)
            payload = self.server.complete(body)
        except _BadRequest as exc:
            self._error(400, str(exc), "BadRequestError")
            return
        except (ValueError, TypeError) as exc:
            self._error(400, f"invalid request: {exc}", "BadRequestError")
            return
        self._send(200, payload)

    def _error(self, code: int, message: str, kind: str) -> None:
        # vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}
        self._send(code, {"error": {"message": message, "type": kind, "param": None, "code": code}})

    def _send(self, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _BadRequest(Exception):
    pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], model: str, generate: Generator, tokenize: Tokenizer,
                 return_token_ids: bool, score: Scorer | None = None) -> None:  # fmt: skip
        super().__init__(address, _Handler)
        self.score = score
        self.return_token_ids = return_token_ids
        self.bodies: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self.model = model
        self.generate = generate
        self.tokenize = tokenize
        self.lock = threading.Lock()
        self.gen_lock = threading.Lock()  # the generators are not written for concurrent calls
        self.requests = 0
        self.fail_next = 0
        self.engine_id = uuid.uuid4().hex
        self.block_size = 64
        self.nixl_port = 5600

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            raise _BadRequest("this server does not stream")
        if body.get("temperature") not in (None, 0, 0.0):
            raise _BadRequest("this server only decodes greedily (temperature 0)")
        if int(body.get("n") or 1) != 1:
            raise _BadRequest("n must be 1")
        if body.get("model") not in (None, self.model):
            raise _BadRequest(f"the model `{body.get('model')}` does not exist")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = self.tokenize(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and t >= 0 for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise _BadRequest("prompt must be a string or a list of token ids")
        requested = body.get("max_tokens")
        max_tokens = 16 if requested is None else int(requested)  # vLLM's CompletionRequest default
        with self.gen_lock:
            tokens = [int(t) for t in self.generate(prompt_ids, max_tokens)]
        choice: dict[str, Any] = {
            "index": 0,
            "text": " ".join(str(t) for t in tokens),
            "logprobs": None,
            "finish_reason": "length" if len(tokens) >= max_tokens else "stop",
            "stop_reason": None,
        }
        if body.get("logprobs") and self.score is not None:
            # vLLM's CompletionLogProbs; ``return_tokens_as_token_ids`` names tokens ``token_id:<id>``.
            def name(t: int) -> str:
                return f"token_id:{t}" if body.get("return_tokens_as_token_ids") else str(t)

            tops = [dict(sorted(top.items(), key=lambda kv: -kv[1])[: int(body["logprobs"])])
                    for top in self.score(prompt_ids, tokens)]
            choice["logprobs"] = {
                "text_offset": list(range(len(tokens))),
                "token_logprobs": [top.get(t, -99.0) for t, top in zip(tokens, tops, strict=True)],
                "tokens": [name(t) for t in tokens],
                "top_logprobs": [{name(t): lp for t, lp in top.items()} for top in tops],
            }
        if body.get("return_token_ids") and self.return_token_ids:
            choice["token_ids"] = tokens
            choice["prompt_token_ids"] = prompt_ids
        kv = body.get("kv_transfer_params")
        extra: dict[str, Any] = {}
        if isinstance(kv, dict) and kv.get("do_remote_decode"):
            # A prefill for a remote decode: name the blocks the decode side would pull.
            host, port = self.server_address[:2]
            extra["kv_transfer_params"] = {
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": self.engine_id,
                "remote_block_ids": list(range((len(prompt_ids) + self.block_size - 1) // self.block_size)),
                "remote_host": str(host), "remote_port": self.nixl_port, "tp_size": 1,
            }
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "total_tokens": len(prompt_ids) + len(tokens),
                "completion_tokens": len(tokens),
                "prompt_tokens_details": None,
            },
            **extra,
        }

    def metrics_text(self) -> str:
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{model_name="{self.model}"}} 0.0',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{model_name="{self.model}"}} 0.0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f'vllm:kv_cache_usage_perc{{model_name="{self.model}"}} 0.0',
            "# TYPE vllm:lora_requests_info gauge",
            f'vllm:lora_requests_info{{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""}} {time.time()}',
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{self.block_size}",num_gpu_blocks="1024"}} 1.0',
        ]
        return "\n".join(lines) + "\n"


class CompletionsServer:
    """Serve ``generate`` on ``host:port`` (0 picks a free port) from a background thread."""

    def __init__(self, generate: Generator, *, model: str = "tiny-dsa", host: str = "127.0.0.1", port: int = 0,
                 tokenize: Tokenizer | None = None, return_token_ids: bool = True,
                 score: Scorer | None = None) -> None:  # fmt: skip
        """``return_token_ids=False`` imitates a server that ignores the request field; ``score``: the
        top logprobs it returns when a request asks for ``logprobs`` (None: it returns none)."""
        self._server = _Server((host, port), model, generate, tokenize or byte_tokenizer(1 << 31), return_token_ids,
                               score)
        self._thread = threading.Thread(target=self._server.serve_forever, name="completions", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> int:
        """Completions requests received so far, failed ones included."""
        return self._server.requests

    @property
    def bodies(self) -> list[Any]:
        """Request bodies received, in arrival order."""
        return list(self._server.bodies)

    @property
    def headers(self) -> list[dict[str, str]]:
        """Request headers (lower-case names) of the completions received, in arrival order."""
        return list(self._server.headers)

    def fail_next(self, count: int) -> None:
        """Answer the next ``count`` completions with HTTP 503, as an overloaded server would."""
        with self._server.lock:
            self._server.fail_next = count

    def start(self) -> CompletionsServer:
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> CompletionsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
