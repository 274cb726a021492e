"""Parity client against real HTTP servers on loopback that answer like vLLM's completions API."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rtsupport import child_env, cli, free_port

from hisparse_runtime.engine.parity import ParityRules
from hisparse_runtime.parity import (
    EXIT_DIVERGED,
    EXIT_ENDPOINT_ERROR,
    EXIT_INCONCLUSIVE,
    CompletionTokens,
    ParityPrompt,
    compare_tokens,
    load_prompts,
    request_body,
    run_parity,
)
from hisparse_runtime.testing import CompletionsServer


def counting(prompt: list[int], max_tokens: int) -> list[int]:
    """A deterministic greedy stand-in: each token depends on the whole history."""
    history, out = list(prompt), []
    for _ in range(max_tokens):
        history.append((sum(history) * 31 + len(history)) % 1000)
        out.append(history[-1])
    return out


def flipped_at(step: int):
    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        tokens = counting(prompt, max_tokens)
        if step < len(tokens):
            tokens[step] = (tokens[step] + 1) % 1000
        return tokens

    return generate


PROMPTS = [
    ParityPrompt(id="ids", prompt=[5, 6, 7, 8]),
    ParityPrompt(id="text", prompt="The sparse indexer picks the top-k rows"),
    ParityPrompt(id="short", prompt=[1], max_tokens=3),
]


@pytest.fixture
def servers() -> Iterator[list[CompletionsServer]]:
    started: list[CompletionsServer] = []
    yield started
    for server in started:
        server.close()


def serve(servers: list[CompletionsServer], generate, **kwargs) -> CompletionsServer:
    server = CompletionsServer(generate, **kwargs).start()
    servers.append(server)
    return server


# --- comparison rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "position", "tokens"),
    [
        ([1, 2, 3], [1, 2, 3], None, (None, None)),
        ([1, 2, 3, 4], [1, 2, 9, 4], 2, (3, 9)),
        ([7, 2], [8, 2], 0, (7, 8)),
        ([1, 2, 3], [1, 2], 2, (3, None)),  # candidate stopped early: diverges where it ended
        ([1], [1, 5], 1, (None, 5)),
    ],
)
def test_first_divergent_position(a: list[int], b: list[int], position: int | None, tokens: tuple) -> None:
    result = compare_tokens("p", CompletionTokens(prompt_token_ids=[0], token_ids=a),
                            CompletionTokens(prompt_token_ids=[0], token_ids=b))  # fmt: skip
    assert result.first_divergence == position
    assert (result.stable_token, result.candidate_token) == tokens
    assert result.match is (position is None)


def test_different_prompt_token_ids_are_not_a_match() -> None:
    result = compare_tokens("p", CompletionTokens(prompt_token_ids=[1, 2], token_ids=[3]),
                            CompletionTokens(prompt_token_ids=[1, 9], token_ids=[3]))  # fmt: skip
    assert not result.match and result.prompt_token_ids_match is False and result.first_divergence is None


# --- against servers --------------------------------------------------------------------------


def test_identical_servers_pass_and_requests_are_greedy_and_seeded(servers: list[CompletionsServer]) -> None:
    a, b = serve(servers, counting), serve(servers, counting)
    report = run_parity(a.url, b.url, PROMPTS, model="tiny-dsa", max_tokens=12, seed=1234)
    assert report.ok and report.exit_code == 0
    assert [p.id for p in report.prompts] == ["ids", "text", "short"]
    assert [p.stable_tokens for p in report.prompts] == [12, 12, 3]
    assert all(p.prompt_token_ids_match for p in report.prompts)
    for body in a.bodies + b.bodies:
        assert body["temperature"] == 0 and body["seed"] == 1234 and body["return_token_ids"] is True
        assert body["stream"] is False and body["n"] == 1


def test_divergence_is_reported_at_the_exact_position(servers: list[CompletionsServer]) -> None:
    a, b = serve(servers, counting), serve(servers, flipped_at(5))
    report = run_parity(a.url, b.url, PROMPTS, model="tiny-dsa", max_tokens=12)
    assert not report.ok and report.exit_code == EXIT_DIVERGED
    by_id = {p.id: p for p in report.prompts}
    assert by_id["ids"].first_divergence == 5 and by_id["text"].first_divergence == 5
    expected = counting([5, 6, 7, 8], 12)[5]
    assert (by_id["ids"].stable_token, by_id["ids"].candidate_token) == (expected, (expected + 1) % 1000)
    assert by_id["short"].match, "a 3-token prompt never reaches step 5"
    assert report.diverged == 2 and report.errors == 0


def test_transient_503s_are_retried(servers: list[CompletionsServer]) -> None:
    a, b = serve(servers, counting), serve(servers, counting)
    b.fail_next(2)
    report = run_parity(a.url, b.url, PROMPTS[:1], model="tiny-dsa", retries=2, backoff_s=0.01, concurrency=1)
    assert report.ok, report
    assert b.requests == 3


def test_an_endpoint_that_keeps_failing_is_an_error_not_a_divergence(servers: list[CompletionsServer]) -> None:
    a, b = serve(servers, counting), serve(servers, counting)
    b.fail_next(100)
    report = run_parity(a.url, b.url, PROMPTS[:1], model="tiny-dsa", retries=1, backoff_s=0.01)
    assert report.exit_code == EXIT_ENDPOINT_ERROR and report.errors == 1 and report.diverged == 0
    assert "503" in (report.prompts[0].error or "") and "2 attempts" in (report.prompts[0].error or "")


def test_unreachable_endpoint_fails_within_bounded_time(servers: list[CompletionsServer]) -> None:
    a = serve(servers, counting)
    started = time.monotonic()
    report = run_parity(a.url, f"http://127.0.0.1:{free_port()}", PROMPTS[:1], model="tiny-dsa", retries=2, backoff_s=0.05)
    assert time.monotonic() - started < 10
    assert report.errors == 1 and "ConnectError" in (report.prompts[0].error or "")


def test_slow_endpoint_hits_the_read_timeout(servers: list[CompletionsServer]) -> None:
    def slow(prompt: list[int], max_tokens: int) -> list[int]:
        time.sleep(3)
        return counting(prompt, max_tokens)

    a, b = serve(servers, counting), serve(servers, slow)
    started = time.monotonic()
    report = run_parity(a.url, b.url, PROMPTS[:1], model="tiny-dsa", timeout_s=0.5, retries=0)
    assert time.monotonic() - started < 3
    assert report.errors == 1 and "ReadTimeout" in (report.prompts[0].error or "")


def test_server_that_ignores_return_token_ids_is_named(servers: list[CompletionsServer]) -> None:
    a, b = serve(servers, counting), serve(servers, counting, return_token_ids=False)
    report = run_parity(a.url, b.url, PROMPTS[:1], model="tiny-dsa")
    assert report.errors == 1 and "return_token_ids" in (report.prompts[0].error or "")


def test_unknown_model_is_a_client_error_without_retries(servers: list[CompletionsServer]) -> None:
    a, b = serve(servers, counting), serve(servers, counting, model="other")
    report = run_parity(a.url, b.url, PROMPTS[:1], model="tiny-dsa", retries=3)
    assert report.errors == 1 and "HTTP 400" in (report.prompts[0].error or "")
    assert b.requests == 1


# --- prompt files and the command -------------------------------------------------------------


def test_prompt_files_in_json_and_json_lines(tmp_path: Path) -> None:
    listed = tmp_path / "p.json"
    listed.write_text(json.dumps({"prompts": [p.model_dump() for p in PROMPTS]}))
    lines = tmp_path / "p.jsonl"
    lines.write_text("\n".join(p.model_dump_json() for p in PROMPTS) + "\n")
    assert load_prompts(listed) == load_prompts(lines) == PROMPTS
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(ValueError, match="unique"):
        load_prompts(dup)


def test_command_prints_the_report_and_exits_by_outcome(servers: list[CompletionsServer], tmp_path: Path) -> None:
    a, b, bad = serve(servers, counting), serve(servers, counting), serve(servers, flipped_at(0))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(p.model_dump_json() for p in PROMPTS))
    out = tmp_path / "report.json"
    same = subprocess.run(cli("parity", "--stable", a.url, "--candidate", b.url, "--prompts", str(prompts),
                              "--model", "tiny-dsa", "--output", str(out)),
                          capture_output=True, text=True, timeout=60, env=child_env())  # fmt: skip
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout) == json.loads(out.read_text())
    # No --model: the name comes from the stable endpoint's /v1/models.
    differ = subprocess.run(cli("parity", "--stable", a.url, "--candidate", bad.url, "--prompts", str(prompts)),
                            capture_output=True, text=True, timeout=60, env=child_env())  # fmt: skip
    assert differ.returncode == EXIT_DIVERGED
    assert [p["first_divergence"] for p in json.loads(differ.stdout)["prompts"]] == [0, 0, 0]
    assert json.loads(differ.stdout)["model"] == "tiny-dsa"


# --- vLLM's own protocol models (the test environment has vLLM 0.33.0) -------------------------


@pytest.mark.vllm
def test_request_and_response_validate_against_vllm_protocol(servers: list[CompletionsServer]) -> None:
    protocol = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")
    body = request_body(PROMPTS[0], model="tiny-dsa", max_tokens=4, seed=3, ignore_eos=False)
    request = protocol.CompletionRequest.model_validate(body)
    assert request.return_token_ids is True and request.temperature == 0.0 and request.seed == 3
    server = serve(servers, counting)
    import httpx

    payload = httpx.post(server.url + "/v1/completions", json=body, timeout=10).json()
    response = protocol.CompletionResponse.model_validate(payload)
    assert response.choices[0].token_ids == counting([5, 6, 7, 8], 4)
    assert response.choices[0].prompt_token_ids == [5, 6, 7, 8]


# --- what a canary's parity Job runs ------------------------------------------------------------


def test_builtin_set_is_deterministic_mixes_long_contexts_and_is_bounded() -> None:
    from hisparse_runtime.parity import BUILTIN_PROMPT_COUNT, builtin_prompts

    first, again = builtin_prompts(BUILTIN_PROMPT_COUNT), builtin_prompts(8)
    assert [p.model_dump() for p in first[:8]] == [p.model_dump() for p in again]  # a prefix, same every run
    assert len({p.id for p in first}) == len({p.prompt for p in first}) == BUILTIN_PROMPT_COUNT
    long = [p for p in first if len(p.prompt) > 20_000]
    assert len(long) == BUILTIN_PROMPT_COUNT // 4  # every fourth: contexts far beyond a hot buffer
    for bad in (0, BUILTIN_PROMPT_COUNT + 1):
        with pytest.raises(ValueError, match="built-in set"):
            builtin_prompts(bad)


def test_job_argv_runs_the_builtin_set_through_each_sides_prefiller(servers: list[CompletionsServer], tmp_path: Path) -> None:
    """The argv the operator renders (engine.parity) as the runtime parses and runs it: ``--limit``
    prompts of the built-in set, and llm-d's prefiller header with the name resolved to an address."""
    from hisparse_runtime.engine.parity import BUILTIN_PROMPTS, parity_argv

    a, b = serve(servers, counting), serve(servers, counting)
    argv = parity_argv(a.url, b.url, prompts=BUILTIN_PROMPTS, limit=5, max_tokens=4,
                       stable_prefiller="localhost:8001", candidate_prefiller="localhost:8002")
    done = subprocess.run(cli(*argv[1:]), capture_output=True, text=True, timeout=60, env=child_env())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [p["id"] for p in report["prompts"]] == [f"builtin-{i:04d}" for i in range(5)]
    assert {h["x-prefiller-host-port"] for h in a.headers} in ({"127.0.0.1:8001"}, {"::1:8001"})
    assert {h["x-prefiller-host-port"] for h in b.headers} in ({"127.0.0.1:8002"}, {"::1:8002"})
    # The summary a Job's pod leaves as its termination message: small, and names where it diverged.
    from hisparse_runtime.engine.parity import ParitySummary

    bad = serve(servers, flipped_at(2))
    summary = tmp_path / "termination-log"
    argv = parity_argv(a.url, bad.url, prompts=BUILTIN_PROMPTS, limit=3, max_tokens=4, summary=str(summary))
    differ = subprocess.run(cli(*argv[1:]), capture_output=True, text=True, timeout=60, env=child_env())
    assert differ.returncode == EXIT_DIVERGED
    got = ParitySummary.model_validate_json(summary.read_text())
    assert (got.ok, got.prompts, got.diverged, got.first_divergence) == (False, 3, 3, "prompt builtin-0000 at token 2")
    assert len(summary.read_bytes()) < 4096
    # A prefiller that does not resolve is an endpoint error, never a pass.
    argv = parity_argv(a.url, b.url, prompts=BUILTIN_PROMPTS, limit=1, max_tokens=1,
                       stable_prefiller="no-such-prefill.invalid:8000")
    failed = subprocess.run(cli(*argv[1:]), capture_output=True, text=True, timeout=60, env=child_env())
    assert failed.returncode == EXIT_ENDPOINT_ERROR and "prefill" in failed.stderr


def test_a_divergence_is_a_near_tie_only_when_both_sides_margins_are_under_epsilon() -> None:
    tops = [{5: -0.1, 6: -3.0}, {7: -0.690, 8: -0.700, 9: -4.0}, {1: -0.2}]
    stable = CompletionTokens(prompt_token_ids=[0], token_ids=[5, 7, 1], top_logprobs=tops)

    def candidate(tokens: list[int], at_1: dict[int, float] | None) -> CompletionTokens:
        return CompletionTokens(prompt_token_ids=[0], token_ids=tokens,
                                top_logprobs=None if at_1 is None else [tops[0], at_1, {2: -0.2}])

    torn = candidate([5, 8, 2], {8: -0.690, 7: -0.700})
    tie = compare_tokens("p", stable, torn, epsilon=0.02)
    assert tie.match and tie.first_divergence is None and tie.tokens == 2
    assert [(t.position, t.stable_token, t.candidate_token) for t in tie.near_ties] == [(1, 7, 8)]
    assert abs(tie.near_ties[0].stable_margin - 0.01) < 1e-9 and abs(tie.near_ties[0].candidate_margin - 0.01) < 1e-9
    # The old rule read the stable's margin alone: a candidate sure of another token diverged, whatever
    # the stable saw; so does one that returned no logprobs, one beyond epsilon, and one outside the top two.
    sure = compare_tokens("p", stable, candidate([5, 8, 2], {8: -0.1, 7: -3.0}), epsilon=0.02)
    assert not sure.match and sure.first_divergence == 1 and sure.candidate_margin == pytest.approx(2.9)
    assert abs(sure.stable_margin - 0.01) < 1e-9
    assert not compare_tokens("p", stable, candidate([5, 8, 2], None), epsilon=0.02).match
    assert not compare_tokens("p", stable, torn).match  # epsilon 0: exact tokens only
    assert not compare_tokens("p", stable, torn, epsilon=0.005).match
    assert not compare_tokens("p", stable, candidate([5, 9, 2], {9: -0.690, 7: -0.700}), epsilon=0.02).match
    assert not compare_tokens("p", stable, candidate([6, 7, 1], {7: -0.690, 8: -0.700}), epsilon=0.02).match


# --- near-ties against servers: a toy model whose top two are practically equal at some positions -------


def _next(history: list[int]) -> int:
    return (sum(history) * 31 + len(history)) % 1000


def _tied(history: list[int]) -> bool:
    return (sum(history) * 7 + len(history) * 3) % 5 == 0


def torn(*, flip_ties: bool = False, sure: bool = False, hard_at: int | None = None, stop_after: int | None = None):
    """(generate, score) of a greedy toy model: where :func:`_tied`, the top two are 0.01 nats apart and a
    ``flip_ties`` side picks the second one (reporting it as its best, or as a sure pick when ``sure``);
    ``hard_at``: a history length where it picks another token with confidence; ``stop_after``: generated
    tokens before it ends the sequence."""

    def pick(history: list[int]) -> int:
        if hard_at is not None and len(history) == hard_at:
            return (_next(history) + 500) % 1000
        flip = flip_ties and _tied(history)
        return (_next(history) + (1 if flip else 0)) % 1000

    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        history, out = list(prompt), []
        for _ in range(min(max_tokens, stop_after or max_tokens)):
            out.append(pick(history))
            history.append(out[-1])
        return out

    def score(prompt: list[int], tokens: list[int]) -> list[dict[int, float]]:
        tops, history = [], list(prompt)
        for t in tokens:
            other = _next(history) if t != _next(history) else (t + 1) % 1000
            close = _tied(history) and not (sure and t != _next(history)) and len(history) != hard_at
            tops.append({t: -0.690, other: -0.700} if close else {t: -0.1, other: -3.0})
            history.append(t)
        return tops

    return generate, score


TIE_PROMPTS = [ParityPrompt(id=f"t{i}", prompt=[i + 1, 2 * i + 3, 7, 11]) for i in range(4)]


def _ties_before(prompt: list[int], n: int) -> list[int]:
    history, out = list(prompt), []
    for k in range(n):
        if _tied(history):
            out.append(k)
        history.append(_next(history))
    return out


def serve_torn(servers: list[CompletionsServer], **kwargs: Any) -> CompletionsServer:
    generate, score = torn(**kwargs)
    return serve(servers, generate, score=score)


def test_after_a_near_tie_the_comparison_goes_on_along_the_stable_continuation(servers: list[CompletionsServer]) -> None:
    """The candidate takes the other choice at every tie and is otherwise the same model: each prompt is
    compared over its whole budget, every tie recorded, and the requests after a tie carry the prompt
    extended by the stable's tokens up to and including the tie."""
    ties = {p.id: _ties_before(p.prompt, 24) for p in TIE_PROMPTS}
    assert all(len(t) >= 2 for t in ties.values()), ties  # the toy model ties several times per prompt
    a, b = serve_torn(servers), serve_torn(servers, flip_ties=True)
    report = run_parity(a.url, b.url, TIE_PROMPTS, model="tiny-dsa", max_tokens=24, top_logprobs=5, near_tie_epsilon=0.02)
    assert report.ok and report.exit_code == 0, report
    for p in report.prompts:
        assert p.match and p.tokens == 24 and p.stable_tokens == 24
        assert [t.position for t in p.near_ties] == ties[p.id]
    summary = report.summary()
    assert (summary.near_ties, summary.tokens) == (4, 96)
    stable_of_t0 = counting_history(TIE_PROMPTS[0].prompt, 24)
    first = ties["t0"][0]
    continued = [body["prompt"] for body in b.bodies if body["prompt"][:4] == TIE_PROMPTS[0].prompt and len(body["prompt"]) > 4]
    assert continued[0] == TIE_PROMPTS[0].prompt + stable_of_t0[: first + 1]
    assert {body["max_tokens"] for body in b.bodies if body["prompt"] == continued[0]} == {24 - first - 1}
    # The same run under a cap on the prompts with a tie: inconclusive, said so, not a divergence.
    capped = run_parity(a.url, b.url, TIE_PROMPTS, model="tiny-dsa", max_tokens=24, top_logprobs=5, near_tie_epsilon=0.02,
                        rules=ParityRules(max_near_tie_fraction=0.5))
    assert not capped.ok and capped.reason == "TooManyNearTies" and capped.exit_code == EXIT_INCONCLUSIVE
    assert capped.diverged == 0 and "4 of 4 prompts" in (capped.message or "")


def counting_history(prompt: list[int], n: int) -> list[int]:
    history = list(prompt)
    for _ in range(n):
        history.append(_next(history))
    return history[len(prompt):]


def test_a_divergence_after_a_near_tie_is_found(servers: list[CompletionsServer]) -> None:
    """A candidate that ties and later diverges with confidence: the old rule stopped at the first tie
    and counted the prompt matched; along the stable continuation the later divergence is found."""
    hard = 4 + 16  # history length: generated position 16 of these 4-token prompts
    assert all(_ties_before(p.prompt, 24)[0] < 16 for p in TIE_PROMPTS)
    a, b = serve_torn(servers), serve_torn(servers, flip_ties=True, hard_at=hard)
    report = run_parity(a.url, b.url, TIE_PROMPTS, model="tiny-dsa", max_tokens=24, top_logprobs=5, near_tie_epsilon=0.02)
    assert not report.ok and report.exit_code == EXIT_DIVERGED and report.diverged == 4
    for p in report.prompts:
        assert not p.match and p.first_divergence == 16 and p.near_ties and p.near_ties[0].position < 16
        # The candidate was sure of its token there: a divergence, whatever the stable's margin was.
        assert p.stable_margin is not None and p.candidate_margin == pytest.approx(2.9)


def test_a_tie_only_the_stable_saw_is_a_divergence(servers: list[CompletionsServer]) -> None:
    a, b = serve_torn(servers), serve_torn(servers, flip_ties=True, sure=True)
    report = run_parity(a.url, b.url, TIE_PROMPTS, model="tiny-dsa", max_tokens=24, top_logprobs=5, near_tie_epsilon=0.02)
    assert report.diverged == 4 and report.exit_code == EXIT_DIVERGED
    for p, sent in zip(report.prompts, TIE_PROMPTS, strict=True):
        assert p.first_divergence == _ties_before(sent.prompt, 24)[0] and not p.near_ties
        assert p.stable_margin == pytest.approx(0.01) and p.candidate_margin == pytest.approx(2.9)


def test_too_few_tokens_compared_is_inconclusive(servers: list[CompletionsServer], tmp_path: Path) -> None:
    a, b = serve_torn(servers, stop_after=2), serve_torn(servers, stop_after=2)
    report = run_parity(a.url, b.url, TIE_PROMPTS, model="tiny-dsa", max_tokens=24, rules=ParityRules(min_tokens=20))
    assert report.summary().tokens == 8 and report.reason == "TooFewTokens" and report.exit_code == EXIT_INCONCLUSIVE
    # The command takes the same rules as flags, and says so in its exit code and summary.
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(p.model_dump_json() for p in TIE_PROMPTS))
    summary = tmp_path / "termination-log"
    from hisparse_runtime.engine.parity import ParitySummary, parity_argv

    argv = parity_argv(a.url, b.url, prompts=str(prompts), limit=4, max_tokens=24, summary=str(summary), min_tokens=20,
                       max_near_tie_fraction=0.25)
    done = subprocess.run(cli(*argv[1:]), capture_output=True, text=True, timeout=60, env=child_env())
    assert done.returncode == EXIT_INCONCLUSIVE, done.stderr
    got = ParitySummary.model_validate_json(summary.read_text())
    assert (got.ok, got.tokens, got.compared, got.diverged) == (False, 8, 4, 0)
    assert json.loads(done.stdout)["reason"] == "TooFewTokens"


def test_prefill_pods_are_used_round_robin_and_ipv6_is_bracketed(monkeypatch: pytest.MonkeyPatch) -> None:
    from hisparse_runtime import parity

    assert parity.hostport("fd00::12", 8000) == "[fd00::12]:8000" and parity.hostport("10.0.0.1", 8000) == "10.0.0.1:8000"
    monkeypatch.setattr(parity, "prefill_addresses", lambda host: ["10.0.0.2", "fd00::1"])
    assert parity._prefiller("prefill-nixl.ns.svc:8000") == ["10.0.0.2:8000", "[fd00::1]:8000"]
