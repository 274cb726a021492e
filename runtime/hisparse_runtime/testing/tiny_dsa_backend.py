"""Greedy generators backed by the tiny DSA model of ``hisparse_kernels`` (needs torch).

``perturb_step`` makes a deliberately broken candidate: the token generated at that position is
replaced by the next vocabulary id and decoding continues from the altered history, so the first
divergence from an unperturbed server is exactly that position.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any

from hisparse_runtime.testing.completions_server import CompletionsServer, Generator, byte_tokenizer


def tiny_dsa_generator(
    *, seed: int = 0, hisparse: bool = False, perturb_step: int | None = None, config: Any = None
) -> tuple[Generator, int]:
    """A generator over ``TinyDSA(config, seed=seed)`` on CPU and the model's vocabulary size."""
    from hisparse_kernels.tiny_dsa import TinyDSA

    model = TinyDSA(config, seed=seed, device="cpu")
    vocab = model.config.vocab_size

    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        tokens = model.generate(prompt, max_tokens, hisparse=hisparse)
        if perturb_step is None or perturb_step >= len(tokens):
            return tokens
        head = tokens[:perturb_step] + [(tokens[perturb_step] + 1) % vocab]
        rest = max_tokens - len(head)
        return head + (model.generate(prompt + head, rest, hisparse=hisparse) if rest > 0 else [])

    return generate, vocab


def serve_tiny_dsa(*, seed: int = 0, hisparse: bool = False, perturb_step: int | None = None, config: Any = None,
                   host: str = "127.0.0.1", port: int = 0, model: str = "tiny-dsa") -> CompletionsServer:  # fmt: skip
    generate, vocab = tiny_dsa_generator(seed=seed, hisparse=hisparse, perturb_step=perturb_step, config=config)
    return CompletionsServer(generate, model=model, host=host, port=port, tokenize=byte_tokenizer(vocab)).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the tiny DSA model on /v1/completions (vLLM's shape).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hisparse", action="store_true", help="decode through the HiSparse host pool path")
    parser.add_argument("--perturb-step", type=int, default=None)
    parser.add_argument("--model", default="tiny-dsa")
    args = parser.parse_args(argv)
    server = serve_tiny_dsa(seed=args.seed, hisparse=args.hisparse, perturb_step=args.perturb_step,
                            host=args.host, port=args.port, model=args.model)  # fmt: skip
    print(json.dumps({"event": "ready", "url": server.url}), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.close()


if __name__ == "__main__":
    main()
