"""Greedy token parity between two OpenAI-compatible completions endpoints (stable vs candidate).

Each prompt is sent to both endpoints (optionally through a prefill endpoint of the same revision, with
llm-d's prefiller header, so the request takes the prefill -> NIXL -> decode path) with temperature 0, a fixed seed and ``return_token_ids``
(vLLM's completions API then returns ``choices[0].token_ids`` and ``choices[0].prompt_token_ids``).
The report names, per prompt, the first generated position whose token ids differ. Exit code 0 when
every prompt matches, 1 on any divergence, 3 when an endpoint could not answer.

Near-ties. Greedy decoding of the same weights can legitimately pick a different token where the top two
candidates are practically equal (batch composition changes the reduction order, so the numerics differ
in the last bits). With ``--top-logprobs K`` both sides return their top-K logprobs per position; a
divergence at position p is a *near-tie*, not a failure, only when *both* sides' top-2 logprob margins
at p are below ``--near-tie-epsilon`` and each side's token is one of the other's top two
(:func:`hisparse_runtime.engine.parity.near_tie`). The comparison then goes on along the stable
continuation: the prompt extended by the stable's tokens up to and including p, both sides asked again
for the rest of the budget, so what follows a tie is compared too. A run fails when more than
``--max-near-tie-fraction`` of the compared prompts had a near-tie, or when fewer than ``--min-tokens``
generated positions were compared in all (:func:`hisparse_runtime.engine.parity.judge`). Batch
invariance (``VLLM_BATCH_INVARIANT=1``, where vLLM supports it for the attention backend) removes the
cause on the serving side; the rule covers the rest.

Several prefill pods: a prefill Service that resolves to several pods is used round-robin, prompt by
prompt, so every prefill pod of each revision is on the compared path. IPv6 addresses are bracketed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from hisparse_runtime.engine import parity as P
from hisparse_runtime.probes import PREFILLER_HEADER, prefill_addresses
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "EXIT_DIVERGED",
    "EXIT_ENDPOINT_ERROR",
    "EXIT_INCONCLUSIVE",
    "CompletionTokens",
    "EndpointError",
    "NearTie",
    "ParityPrompt",
    "ParityReport",
    "PromptParity",
    "add_parser",
    "compare_tokens",
    "load_prompts",
    "run",
    "run_parity",
    "served_model",
]

EXIT_DIVERGED = 1
EXIT_ENDPOINT_ERROR = 3
EXIT_INCONCLUSIVE = 4
"""Nothing diverged, but the run does not count: too many near-ties, too few prompts or tokens compared."""

COMPLETIONS_PATH = "/v1/completions"
API_KEY_ENV = "HISPARSE_PARITY_API_KEY"
"""Bearer token sent to both endpoints when set (vLLM's --api-key)."""

_RETRY_STATUS = {429, 500, 502, 503, 504}


class ParityPrompt(BaseModel):
    """One prompt of the set: text (tokenized by the server) or token ids (sent as-is)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Stable name of the prompt in reports.")
    prompt: str | list[int] = Field(description="Prompt text, or prompt token ids.")
    max_tokens: int | None = Field(default=None, gt=0, description="Tokens to generate; default from the run.")


class CompletionTokens(BaseModel):
    """What parity needs from one completion response."""

    prompt_token_ids: list[int] | None
    token_ids: list[int]
    finish_reason: str | None = None
    top_logprobs: list[dict[int, float]] | None = None
    """Per generated position: token id -> logprob of the top-K (``return_tokens_as_token_ids``)."""


class NearTie(BaseModel):
    """One excused divergence: where, what each side picked, and both sides' top-2 margins there."""

    model_config = ConfigDict(extra="forbid")

    position: int = Field(description="Generated position (0 = first), along the stable continuation.")
    stable_token: int
    candidate_token: int
    stable_margin: float
    candidate_margin: float


class PromptParity(BaseModel):
    """Result for one prompt. Positions index the generated tokens (0 = first) along the stable
    continuation: after a near-tie both sides went on from the stable's token."""

    model_config = ConfigDict(extra="forbid")

    id: str
    match: bool
    first_divergence: int | None = Field(default=None, description="First generated position that differs (not a near-tie).")
    stable_token: int | None = Field(default=None, description="Stable's token there; None if it ended.")
    candidate_token: int | None = Field(default=None, description="Candidate's token there; None if it ended.")
    stable_margin: float | None = Field(default=None, description="The stable's top-2 logprob margin at the divergence.")
    candidate_margin: float | None = Field(default=None, description="The candidate's top-2 logprob margin there.")
    stable_tokens: int = 0
    candidate_tokens: int = 0
    tokens: int = Field(default=0, description="Generated positions compared and accepted (equal, or an excused near-tie).")
    prompt_token_ids_match: bool | None = Field(default=None, description="None when a side did not return them.")
    near_ties: list[NearTie] = Field(default_factory=list, description="Divergences excused as near-ties, in order.")
    end_to_end: bool = Field(default=False, description="Both requests named a prefill pod of their own revision.")
    error: str | None = Field(default=None, description="Why the prompt could not be compared.")

    @property
    def near_tie(self) -> bool:
        return bool(self.near_ties)


class ParityReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    stable: str
    candidate: str
    model: str
    seed: int
    prompts: list[PromptParity]
    diverged: int = Field(description="Prompts whose token ids differ.")
    errors: int = Field(description="Prompts an endpoint failed to answer.")
    reason: str | None = Field(default=None, description="The rule the run broke (None: it passed).")
    message: str | None = Field(default=None, description="The broken rule in words.")

    def summary(self) -> P.ParitySummary:
        first = next((p for p in self.prompts if not p.match), None)
        where = None
        if first is not None:
            where = (f"prompt {first.id}: {first.error}" if first.error else
                     f"prompt {first.id} at token {first.first_divergence}" if first.first_divergence is not None
                     else f"prompt {first.id}: the prompt token ids differ")
        compared = [p for p in self.prompts if not p.error]
        return P.ParitySummary(ok=self.ok, prompts=len(self.prompts), compared=len(compared),
                               end_to_end=bool(compared) and all(p.end_to_end for p in compared),
                               diverged=self.diverged, errors=self.errors,
                               near_ties=sum(1 for p in compared if p.near_ties), tokens=sum(p.tokens for p in compared),
                               first_divergence=where[:1024] if where else None)

    @property
    def exit_code(self) -> int:
        if self.errors:
            return EXIT_ENDPOINT_ERROR
        if self.diverged:
            return EXIT_DIVERGED
        return EXIT_INCONCLUSIVE if not self.ok else 0


class EndpointError(Exception):
    """An endpoint did not return a usable completion after the allowed retries."""


def _top(side: CompletionTokens, position: int) -> dict[int, float] | None:
    tops = side.top_logprobs or []
    return tops[position] if position < len(tops) else None


def compare_tokens(prompt_id: str, stable: CompletionTokens, candidate: CompletionTokens, *,
                   epsilon: float = 0.0) -> PromptParity:
    """Compare two completions of the same prompt, one round: a shorter output that is a prefix diverges
    where it ends. A divergence excused as a near-tie (:func:`P.near_tie`) ends the round with
    ``match`` set and the tie recorded; the caller continues along the stable continuation
    (:func:`run_parity`)."""
    a, b = stable.token_ids, candidate.token_ids
    position = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if position is None and len(a) != len(b):
        position = min(len(a), len(b))
    prompts_match = (
        None
        if stable.prompt_token_ids is None or candidate.prompt_token_ids is None
        else stable.prompt_token_ids == candidate.prompt_token_ids
    )
    x = a[position] if position is not None and position < len(a) else None
    y = b[position] if position is not None and position < len(b) else None
    margins = (P.top2_margin(_top(stable, position)), P.top2_margin(_top(candidate, position))) \
        if position is not None else (None, None)
    tie = position is not None and P.near_tie(_top(stable, position), _top(candidate, position), x, y, epsilon)
    base = PromptParity(id=prompt_id, match=False, stable_tokens=len(a), candidate_tokens=len(b),
                        prompt_token_ids_match=prompts_match)
    if prompts_match is False:
        return base
    if position is None:
        return base.model_copy(update={"match": True, "tokens": len(a)})
    if tie:
        assert x is not None and y is not None and margins[0] is not None and margins[1] is not None
        return base.model_copy(update={"match": True, "tokens": position + 1, "near_ties": [NearTie(
            position=position, stable_token=x, candidate_token=y, stable_margin=margins[0], candidate_margin=margins[1])]})
    return base.model_copy(update={"first_divergence": position, "stable_token": x, "candidate_token": y,
                                   "stable_margin": margins[0], "candidate_margin": margins[1], "tokens": position})


class _Endpoint:
    def __init__(self, base_url: str, client: httpx.Client, *, retries: int, backoff_s: float,
                 headers: dict[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.retries = retries
        self.backoff_s = backoff_s
        self.headers = headers or {}

    def complete(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> CompletionTokens:
        url = self.base_url + COMPLETIONS_PATH
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self.client.post(url, json=body, headers={**self.headers, **(headers or {})})
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in _RETRY_STATUS:
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code != 200:
                raise EndpointError(f"{url} answered HTTP {response.status_code}: {response.text[:500]}")
            return _parse(url, response)
        raise EndpointError(f"{url} failed after {self.retries + 1} attempts; last error: {last}")


def _parse(url: str, response: httpx.Response) -> CompletionTokens:
    try:
        choice = response.json()["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise EndpointError(f"{url} did not return a completions response ({exc!r}): {response.text[:300]}") from exc
    if choice.get("token_ids") is None:
        raise EndpointError(
            f"{url} returned no choices[0].token_ids; the server must honour return_token_ids"
            " (vLLM's completions API does)."
        )
    tops = None
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and logprobs.get("top_logprobs"):
        try:
            tops = [{_token_id(k): float(v) for k, v in (pos or {}).items()} for pos in logprobs["top_logprobs"]]
        except (ValueError, TypeError) as exc:
            raise EndpointError(f"{url} returned top_logprobs that are not token ids ({exc})") from exc
    try:
        return CompletionTokens.model_validate({**choice, "top_logprobs": tops}, from_attributes=False)
    except ValidationError as exc:
        raise EndpointError(f"{url} returned malformed token ids: {exc}") from exc


def _token_id(key: str) -> int:
    """``token_id:123`` (vLLM's ``return_tokens_as_token_ids``) -> 123."""
    return int(key.rsplit(":", 1)[-1])


def request_body(prompt: ParityPrompt, *, model: str, max_tokens: int, seed: int, ignore_eos: bool,
                 top_logprobs: int = 0) -> dict[str, Any]:
    """The completions request for one prompt: greedy, seeded, token ids returned (and the top-K
    logprobs keyed by token id, for the near-tie rule)."""
    extra: dict[str, Any] = {"logprobs": top_logprobs, "return_tokens_as_token_ids": True} if top_logprobs else {}
    return {
        **extra,
        "model": model,
        "prompt": prompt.prompt,
        "max_tokens": prompt.max_tokens or max_tokens,
        "temperature": 0.0,
        "seed": seed,
        "n": 1,
        "stream": False,
        "return_token_ids": True,
        "ignore_eos": ignore_eos,
    }


def run_parity(
    stable: str,
    candidate: str,
    prompts: list[ParityPrompt],
    *,
    model: str,
    max_tokens: int = 32,
    seed: int = 0,
    ignore_eos: bool = False,
    timeout_s: float = 120.0,
    connect_timeout_s: float = 5.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    concurrency: int = 4,
    api_key: str | None = None,
    prefillers: tuple[list[str] | str | None, list[str] | str | None] = (None, None),
    top_logprobs: int = 0,
    near_tie_epsilon: float = 0.0,
    rules: P.ParityRules | None = None,
) -> ParityReport:
    """Send every prompt to both endpoints and compare the generated token ids. ``prefillers``: the
    ``ip:port`` of a prefill endpoint for the stable and the candidate side, sent as llm-d's prefiller
    header (None: the endpoint prefills itself)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
    pools = [[p] if isinstance(p, str) else list(p or []) for p in prefillers]
    with httpx.Client(timeout=timeout, headers=headers) as client:
        ends = [_Endpoint(url, client, retries=retries, backoff_s=backoff_s) for url in (stable, candidate)]

        def one(item: tuple[int, ParityPrompt]) -> PromptParity:
            i, prompt = item
            body = request_body(prompt, model=model, max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos,
                                top_logprobs=top_logprobs)
            budget = int(body["max_tokens"])
            # Round-robin over each revision's prefill pods: every one of them is on the compared path.
            picks = [pool[i % len(pool)] if pool else None for pool in pools]
            headers = [{PREFILLER_HEADER: pick} if pick else None for pick in picks]
            done, ties, tokens = 0, [], 0
            first: PromptParity | None = None
            while True:
                try:
                    got = [end.complete(body, h) for end, h in zip(ends, headers, strict=True)]
                except EndpointError as exc:
                    return PromptParity(id=prompt.id, match=False, error=str(exc), tokens=tokens,
                                        near_ties=ties, end_to_end=all(picks))
                r = compare_tokens(prompt.id, got[0], got[1], epsilon=near_tie_epsilon)
                first = first or r
                ties += [t.model_copy(update={"position": t.position + done}) for t in r.near_ties]
                tokens += r.tokens
                if not r.match or not r.near_ties:
                    # The end: a match to the end of the budget, or a divergence (at ``done`` + its position).
                    moved = {"first_divergence": r.first_divergence + done} if r.first_divergence is not None else {}
                    return r.model_copy(update={
                        **moved, "tokens": tokens, "near_ties": ties, "end_to_end": all(picks),
                        "stable_tokens": done + r.stable_tokens, "candidate_tokens": done + r.candidate_tokens,
                        "prompt_token_ids_match": first.prompt_token_ids_match})
                # A near-tie: go on from the prompt extended by the stable's tokens up to and including it.
                p = r.near_ties[-1].position
                lead = got[0]
                done += p + 1
                base = lead.prompt_token_ids if lead.prompt_token_ids is not None else (
                    prompt.prompt if isinstance(prompt.prompt, list) and done == p + 1 else None)
                # The stable side stopped at the tie (its end of sequence): nothing follows to compare.
                ended = p == len(lead.token_ids) - 1 and lead.finish_reason == "stop"
                if done >= budget or ended:
                    return r.model_copy(update={
                        "tokens": tokens, "near_ties": ties, "end_to_end": all(picks), "stable_tokens": done,
                        "candidate_tokens": done, "prompt_token_ids_match": first.prompt_token_ids_match})
                if base is None:
                    return PromptParity(id=prompt.id, match=False, tokens=tokens, near_ties=ties, end_to_end=all(picks),
                                        error="cannot continue after a near-tie: the stable side returned no prompt_token_ids")
                body = {**body, "prompt": list(base) + list(lead.token_ids[: p + 1]), "max_tokens": budget - done}

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            results = list(pool.map(one, enumerate(prompts)))
    errors = sum(1 for r in results if r.error)
    diverged = sum(1 for r in results if not r.match and not r.error)
    report = ParityReport(ok=False, stable=stable, candidate=candidate, model=model, seed=seed, prompts=results,
                          diverged=diverged, errors=errors)
    broken = P.judge(report.summary(), rules or P.ParityRules(prompts=1))
    return report.model_copy(update={"ok": broken is None, "reason": broken[0] if broken else None,
                                     "message": broken[1] if broken else None})


def served_model(base_url: str, *, timeout_s: float = 10.0) -> str:
    """The first model id an OpenAI-compatible server lists at ``/v1/models``."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        response = httpx.get(url, timeout=timeout_s)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise EndpointError(f"cannot read the served model from {url} ({exc}); pass --model") from exc


def load_prompts(path: Path) -> list[ParityPrompt]:
    """A JSON list, a JSON object with ``prompts``, or JSON Lines of ``ParityPrompt``."""
    text = path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None  # not one JSON document: JSON Lines
    if isinstance(raw, list):
        items = raw
    elif isinstance(raw, dict) and "prompts" in raw:
        items = raw["prompts"]
    else:
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    prompts = [ParityPrompt.model_validate(item) for item in items]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"prompt ids must be unique in {path}")
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


BUILTIN_PROMPT_COUNT = 1024
"""Size of the built-in set (``spec.rollout.parity.prompts`` is at most this)."""

_TOPICS = ("the water cycle", "binary search", "the French revolution", "photosynthesis", "TCP congestion control",
           "the Pythagorean theorem", "supply and demand", "black holes", "the immune system", "compilers",
           "plate tectonics", "public-key cryptography", "the Roman republic", "protein folding", "sorting networks",
           "ocean currents")
_TASKS = ("Explain {t} to a twelve-year-old.", "Write three exam questions about {t}, with answers.",
          "Summarize the history of {t} in five sentences.", "List the common misconceptions about {t}.",
          "Write a short poem about {t}.", "Compare {t} with an everyday analogy and say where it breaks down.",
          "Write Python code that illustrates {t}, with comments.", "What would change in the world without {t}?")
_STYLES = ("", " Answer in one paragraph.", " Use bullet points.", " Keep it under fifty words.",
           " Start with a one-line summary.", " End with a question for the reader.", " Avoid jargon.",
           " Number every step.")
_LONG_EVERY = 4
"""Every fourth built-in prompt is a long context (a numbered ledger of about 40K characters, ~10K
tokens, several times a decode hot buffer), so the candidate's swap-in path is on the compared path."""


def builtin_prompts(n: int) -> list[ParityPrompt]:
    """The first ``n`` prompts of the built-in set: deterministic (no randomness between builds or runs),
    short questions on varied topics (16 topics x 8 tasks x 8 styles: all distinct), and every fourth one a long document followed by a question whose
    answer needs rows far back in it."""
    if not 1 <= n <= BUILTIN_PROMPT_COUNT:
        raise ValueError(f"the built-in set holds 1 to {BUILTIN_PROMPT_COUNT} prompts, asked for {n}")
    out = []
    for i in range(n):
        topic = _TOPICS[i % len(_TOPICS)]
        task = _TASKS[(i // len(_TOPICS)) % len(_TASKS)].format(t=topic) + _STYLES[(i // (len(_TOPICS) * len(_TASKS))) % len(_STYLES)]
        if i % _LONG_EVERY == _LONG_EVERY - 1:
            rows = 400 + 40 * (i % 7)
            ledger = "\n".join(f"Entry {k}: account {(k * 7919 + i) % 10007} moved {(k * 104729 + 3 * i) % 99991} units "
                                f"to account {(k * 15485863 + i) % 10007} on day {k % 365 + 1}." for k in range(rows))
            text = f"{ledger}\n\nWhich account received the units moved in entry {i % 97}? Then: {task}"
        else:
            text = task
        out.append(ParityPrompt(id=f"builtin-{i:04d}", prompt=text))
    return out


# --- command line -----------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "parity",
        help="compare greedy token ids of two completions endpoints",
        description=__doc__.strip().splitlines()[0] if __doc__ else None,
    )
    parser.add_argument(P.STABLE, required=True, help="base URL of the stable endpoint (http://host:port)")
    parser.add_argument(P.CANDIDATE, required=True, help="base URL of the candidate endpoint")
    parser.add_argument(P.PROMPTS, required=True,
                        help=f"prompt set: JSON list/object or JSON Lines, or '{P.BUILTIN_PROMPTS}' for the built-in set")
    parser.add_argument(P.LIMIT, type=int, help="compare only the first N prompts of the set")
    parser.add_argument(P.STABLE_PREFILLER, metavar="HOST:PORT",
                        help="prefill endpoint for the stable side (a headless Service name resolves to one pod)")
    parser.add_argument(P.CANDIDATE_PREFILLER, metavar="HOST:PORT", help="prefill endpoint for the candidate side")
    parser.add_argument("--model", help="served model name sent in each request (default: the stable's first model)")
    parser.add_argument(P.MAX_TOKENS, type=int, default=32, help="tokens per prompt unless the prompt sets it")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed sent with each request (default 0)")
    parser.add_argument("--ignore-eos", action="store_true", help="generate max_tokens even past EOS")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request read timeout in seconds")
    parser.add_argument("--retries", type=int, default=2, help="retries on connection errors and 429/5xx")
    parser.add_argument(P.CONCURRENCY, type=int, default=4, help="prompts in flight at once, on each endpoint")
    parser.add_argument(P.OUTPUT, type=Path, help="also write the JSON report to this file")
    parser.add_argument(P.TOP_LOGPROBS, type=int, default=0,
                        help="ask for the top-K logprobs per token (by token id) for the near-tie rule (0: off)")
    parser.add_argument(P.NEAR_TIE_EPSILON, type=float, default=0.0,
                        help="a divergence where both sides' top-2 logprob margins are below this is a near-tie")
    parser.add_argument(P.MAX_NEAR_TIE_FRACTION, type=float, default=1.0,
                        help="fail when more than this fraction of the compared prompts had a near-tie (default 1: no cap)")
    parser.add_argument(P.MIN_TOKENS, type=int, default=0,
                        help="fail when fewer generated positions than this were compared in all (default 0)")
    parser.add_argument(P.SUMMARY, type=Path,
                        help="write a short JSON summary to this file (a pod's termination message: /dev/termination-log)")


def hostport(ip: str, port: str | int) -> str:
    """``ip:port``, with an IPv6 address in brackets (``[fd00::1]:8000``)."""
    return f"[{ip}]:{port}" if ":" in ip and not ip.startswith("[") else f"{ip}:{port}"


def _prefiller(value: str | None) -> list[str] | None:
    """``host:port`` -> every ``ip:port`` behind it (the pods of a headless Service), sorted."""
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"prefiller {value!r} is not host:port")
    return [hostport(ip, port) for ip in prefill_addresses(host)]


def run(args: argparse.Namespace) -> int:
    try:
        if args.prompts == P.BUILTIN_PROMPTS:
            prompts = builtin_prompts(args.limit or BUILTIN_PROMPT_COUNT)
        else:
            prompts = load_prompts(Path(args.prompts))
    except (OSError, ValueError, ValidationError) as exc:
        print(f"hisparse-runtime parity: cannot read the prompt set {args.prompts}: {exc}", file=sys.stderr)
        return 2
    if args.limit is not None:
        if args.limit < 1:
            print(f"hisparse-runtime parity: {P.LIMIT} must be at least 1, got {args.limit}", file=sys.stderr)
            return 2
        prompts = prompts[: args.limit]
    try:
        rules = P.ParityRules(prompts=1, max_near_tie_fraction=args.max_near_tie_fraction, min_tokens=args.min_tokens)
    except ValidationError as exc:
        print(f"hisparse-runtime parity: {P.MAX_NEAR_TIE_FRACTION} is 0 to 1 and {P.MIN_TOKENS} at least 0: {exc}",
              file=sys.stderr)
        return 2
    try:
        prefillers = (_prefiller(args.stable_prefiller), _prefiller(args.candidate_prefiller))
    except (OSError, ValueError) as exc:
        print(f"hisparse-runtime parity: cannot resolve the prefill endpoint: {exc}", file=sys.stderr)
        return EXIT_ENDPOINT_ERROR
    try:
        model = args.model or served_model(args.stable)
    except EndpointError as exc:
        print(f"hisparse-runtime parity: {exc}", file=sys.stderr)
        return EXIT_ENDPOINT_ERROR
    report = run_parity(
        args.stable, args.candidate, prompts, model=model, max_tokens=args.max_tokens, seed=args.seed,
        ignore_eos=args.ignore_eos, timeout_s=args.timeout, retries=args.retries, concurrency=args.concurrency,
        api_key=os.environ.get(API_KEY_ENV) or None, prefillers=prefillers,
        top_logprobs=args.top_logprobs, near_tie_epsilon=args.near_tie_epsilon, rules=rules,
    )  # fmt: skip
    text = report.model_dump_json()
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    if args.summary:
        args.summary.write_text(report.summary().model_dump_json(), encoding="utf-8")
    print(text, flush=True)
    return report.exit_code
