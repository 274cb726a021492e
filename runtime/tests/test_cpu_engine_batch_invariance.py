"""The CPU engine gives a request the same tokens and log-probabilities whatever shares its batch.

The canary's parity gate compares a candidate's greedy tokens with the stable revision's while the stable
fleet serves live traffic, so one build must compute the same tokens for a prompt alone and beside any
other requests. Before the decode step scored each row's index alone over its own sequence, the einsum's
shape followed the longest sequence in the batch, and the same build gave other tokens to 2 of 8 prompts here (at tokens 1
and 20) when they ran together: the false divergences the gate saw on the real node under a client's load.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from hisparse_runtime.cpu_engine import load_checkpoint, write_checkpoint
from hisparse_runtime.cpu_engine.runner import EngineRequest, Runner

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory):
    return load_checkpoint(write_checkpoint(tmp_path_factory.mktemp("ck") / "m", seed=3)).weights


def _prompts(vocab: int, seed: int, n: int = 8) -> list[list[int]]:
    rng = random.Random(seed)
    # Lengths on both sides of index_topk, so top-k selects among more rows than it keeps.
    return [[rng.randrange(vocab) for _ in range(rng.randrange(5, 300))] for _ in range(n)]


def _serve(weights, hisparse: bool, prompts: list[list[int]], *, together: bool, stagger_s: float = 0.0):
    """(tokens, logprobs) per prompt: one at a time, or all submitted together (optionally staggered, so
    requests join a batch that is already decoding)."""
    runner = Runner(weights, hisparse=hisparse, on_finish=lambda req: None)
    runner.start()
    try:
        reqs = [EngineRequest(f"r{i}", p, MAX_TOKENS, logprobs=2) for i, p in enumerate(prompts)]
        if together:
            for req in reqs:
                runner.submit(req)
                time.sleep(stagger_s)
            for req in reqs:
                assert req.done.wait(300), req.request_id
        else:
            for req in reqs:
                runner.submit(req)
                assert req.done.wait(300), req.request_id
        assert all(r.error is None for r in reqs), [r.error for r in reqs]
        return [(r.output, r.token_logprobs) for r in reqs]
    finally:
        runner.stop()


@pytest.mark.parametrize("hisparse", [False, True], ids=["full-kv", "hisparse"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_prompt_gets_the_same_tokens_alone_and_in_any_batch(weights, hisparse: bool, seed: int) -> None:
    prompts = _prompts(weights.config.vocab_size, seed)
    alone = _serve(weights, hisparse, prompts, together=False)
    assert all(len(tokens) == MAX_TOKENS for tokens, _ in alone)
    together = _serve(weights, hisparse, prompts, together=True)
    # Bit for bit: the log-probabilities too, not only the argmax.
    assert together == alone, [i for i, (a, b) in enumerate(zip(alone, together)) if a != b]
    joined = _serve(weights, hisparse, list(reversed(prompts)), together=True, stagger_s=0.05)
    assert list(reversed(joined)) == alone, [i for i, (a, b) in enumerate(zip(alone, reversed(joined))) if a != b]


def test_concurrent_clients_get_what_a_lone_client_gets(weights) -> None:
    """Requests from several threads at once (a client's load beside the parity Job's prompts)."""
    prompts = _prompts(weights.config.vocab_size, 7, n=6)
    alone = _serve(weights, True, prompts, together=False)
    runner = Runner(weights, hisparse=True, on_finish=lambda req: None)
    runner.start()
    results: list[tuple[int, tuple[list[int], list[float]] | None]] = []
    try:
        def client(i: int) -> None:
            for attempt in range(2):
                req = EngineRequest(f"c{i}-{attempt}", prompts[i], MAX_TOKENS, logprobs=2)
                runner.submit(req)
                results.append((i, (req.output, req.token_logprobs) if req.done.wait(300) else None))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        runner.stop()
    assert len(results) == 2 * len(prompts)
    assert [i for i, got in results if got != alone[i]] == []
