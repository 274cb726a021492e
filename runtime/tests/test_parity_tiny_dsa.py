"""Parity over real completions servers that decode with the tiny DSA model (full KV vs HiSparse)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hisparse_runtime.parity import EXIT_DIVERGED, ParityPrompt, run_parity
from hisparse_runtime.testing import CompletionsServer

tiny_dsa = pytest.importorskip("hisparse_kernels.tiny_dsa", reason="the tiny DSA model needs torch")
from hisparse_runtime.testing.tiny_dsa_backend import serve_tiny_dsa  # noqa: E402

pytestmark = pytest.mark.slow

# Small enough for CPU decoding; prompts longer than index_topk (64) so attention is really sparse.
CONFIG = tiny_dsa.TinyDSAConfig(num_layers=4, num_blocks=16, max_batch=2)
MAX_TOKENS = 8
PROMPTS = [
    ParityPrompt(id="long-ids", prompt=[(7 * i + 3) % CONFIG.vocab_size for i in range(80)]),
    ParityPrompt(id="long-text", prompt="HiSparse keeps the full MLA KV in a pinned host pool, " * 2),
]


@pytest.fixture
def servers() -> Iterator[list[CompletionsServer]]:
    started: list[CompletionsServer] = []
    yield started
    for server in started:
        server.close()


def test_full_kv_and_hisparse_paths_of_one_model_agree(servers: list[CompletionsServer]) -> None:
    stable = serve_tiny_dsa(seed=0, hisparse=False, config=CONFIG)
    candidate = serve_tiny_dsa(seed=0, hisparse=True, config=CONFIG)
    servers += [stable, candidate]
    report = run_parity(stable.url, candidate.url, PROMPTS, model="tiny-dsa", max_tokens=MAX_TOKENS, timeout_s=300)
    assert report.ok, report.model_dump_json(indent=1)
    assert all(p.stable_tokens == MAX_TOKENS and p.prompt_token_ids_match for p in report.prompts)


def test_perturbed_step_is_reported_exactly(servers: list[CompletionsServer]) -> None:
    stable = serve_tiny_dsa(seed=0, hisparse=False, config=CONFIG)
    candidate = serve_tiny_dsa(seed=0, hisparse=True, perturb_step=3, config=CONFIG)
    servers += [stable, candidate]
    report = run_parity(stable.url, candidate.url, PROMPTS, model="tiny-dsa", max_tokens=MAX_TOKENS, timeout_s=300)
    assert report.exit_code == EXIT_DIVERGED
    assert [p.first_divergence for p in report.prompts] == [3, 3]
    for p in report.prompts:
        assert p.candidate_token == (p.stable_token + 1) % CONFIG.vocab_size


def test_another_seed_diverges_where_the_models_first_differ(servers: list[CompletionsServer]) -> None:
    prompt = PROMPTS[0].prompt
    a = tiny_dsa.TinyDSA(CONFIG, seed=0, device="cpu").generate(prompt, MAX_TOKENS, hisparse=False)
    b = tiny_dsa.TinyDSA(CONFIG, seed=1, device="cpu").generate(prompt, MAX_TOKENS, hisparse=False)
    expected = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    stable = serve_tiny_dsa(seed=0, config=CONFIG)
    candidate = serve_tiny_dsa(seed=1, config=CONFIG)
    servers += [stable, candidate]
    report = run_parity(stable.url, candidate.url, PROMPTS[:1], model="tiny-dsa", max_tokens=MAX_TOKENS, timeout_s=300)
    assert report.prompts[0].first_divergence == expected
    assert (report.prompts[0].stable_token, report.prompts[0].candidate_token) == (a[expected], b[expected])
