"""Parity client against real HTTP servers on loopback that answer like vLLM's completions API."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rtsupport import child_env, cli, free_port

from hisparse_runtime.parity import (
    EXIT_DIVERGED,
    EXIT_ENDPOINT_ERROR,
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


def test_a_divergence_at_a_near_tie_of_the_stable_s_top_two_is_not_a_failure() -> None:
    from hisparse_runtime.parity import near_tie

    tops = [{5: -0.1, 6: -3.0}, {7: -0.690, 8: -0.700, 9: -4.0}, {1: -0.2}]
    stable = CompletionTokens(prompt_token_ids=[0], token_ids=[5, 7, 1], top_logprobs=tops)
    tie = compare_tokens("p", stable, CompletionTokens(prompt_token_ids=[0], token_ids=[5, 8, 2]), epsilon=0.02)
    assert tie.match and tie.near_tie and tie.first_divergence == 1 and abs(tie.margin - 0.01) < 1e-9
    # The same divergence without the rule, a margin above epsilon, or a token outside the top two: failures.
    assert not compare_tokens("p", stable, CompletionTokens(prompt_token_ids=[0], token_ids=[5, 8, 2])).match
    assert not compare_tokens("p", stable, CompletionTokens(prompt_token_ids=[0], token_ids=[5, 8, 2]), epsilon=0.005).match
    assert not compare_tokens("p", stable, CompletionTokens(prompt_token_ids=[0], token_ids=[5, 9, 2]), epsilon=0.02).match
    assert not compare_tokens("p", stable, CompletionTokens(prompt_token_ids=[0], token_ids=[6, 7, 1]), epsilon=0.02).match
    assert near_tie(stable, 2, 3, 1.0) is None  # a single candidate is no tie


def test_prefill_pods_are_used_round_robin_and_ipv6_is_bracketed(monkeypatch: pytest.MonkeyPatch) -> None:
    from hisparse_runtime import parity

    assert parity.hostport("fd00::12", 8000) == "[fd00::12]:8000" and parity.hostport("10.0.0.1", 8000) == "10.0.0.1:8000"
    monkeypatch.setattr(parity, "prefill_addresses", lambda host: ["10.0.0.2", "fd00::1"])
    assert parity._prefiller("prefill-nixl.ns.svc:8000") == ["10.0.0.2:8000", "[fd00::1]:8000"]
