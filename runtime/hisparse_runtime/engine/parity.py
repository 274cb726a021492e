"""The command line of ``hisparse-runtime parity``: its flag names, and the argv the operator renders for
a canary's parity Job. One place for both, so the Job never passes a flag the runtime does not parse."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

RUNTIME_COMMAND: Final = "hisparse-runtime"
"""The runtime image's entrypoint (pods run ``hisparse-runtime serve``, probes ``hisparse-runtime probe``)."""
PARITY_COMMAND: Final = (RUNTIME_COMMAND, "parity")

STABLE: Final = "--stable"
CANDIDATE: Final = "--candidate"
PROMPTS: Final = "--prompts"
LIMIT: Final = "--limit"
MAX_TOKENS: Final = "--max-tokens"
STABLE_PREFILLER: Final = "--stable-prefiller"
CANDIDATE_PREFILLER: Final = "--candidate-prefiller"
OUTPUT: Final = "--output"
SUMMARY: Final = "--summary"
TOP_LOGPROBS: Final = "--top-logprobs"
NEAR_TIE_EPSILON: Final = "--near-tie-epsilon"
CONCURRENCY: Final = "--concurrency"
MAX_NEAR_TIE_FRACTION: Final = "--max-near-tie-fraction"
MIN_TOKENS: Final = "--min-tokens"

BUILTIN_PROMPTS: Final = "builtin"
"""``--prompts builtin``: the runtime's own prompt set (short and long contexts)."""

PROMPTS_FILE: Final = "prompts.jsonl"
"""Key of a user's prompt set in the ConfigMap ``spec.rollout.parity.promptsConfigMap``."""


class ParitySummary(BaseModel):
    """What a parity run tells the operator: small enough for a pod's termination message (4 KiB),
    which is where the Job's pod leaves it."""

    model_config = ConfigDict(extra="ignore")

    ok: bool
    prompts: int = Field(ge=0)
    """Prompts in the run."""
    compared: int = Field(default=0, ge=0)
    """Prompts both sides answered and that were compared token by token (a summary without it
    compared nothing)."""
    end_to_end: bool = False
    """Every compared request went through a prefill pod of its own revision (prefill -> NIXL -> decode)."""
    diverged: int = Field(ge=0)
    errors: int = Field(ge=0)
    near_ties: int = Field(default=0, ge=0)
    """Prompts with at least one excused near-tie (:func:`near_tie`); their comparison went on along the
    stable continuation."""
    tokens: int = Field(default=0, ge=0)
    """Generated positions compared and accepted (equal, or an excused near-tie), over every prompt and
    continuation (a summary without it compared no tokens)."""
    first_divergence: str | None = Field(default=None, max_length=1024)
    """``prompt <id> at token <t>`` of the first prompt that diverged, or the first endpoint error."""


# --- the rules of the verdict (the runtime's exit code and the operator's verdict both use these) ---------


def top2_margin(top: Mapping[int, float] | None) -> float | None:
    """Logprob margin between the best and the second-best token of one position (None: fewer than two)."""
    best = sorted((top or {}).values(), reverse=True)[:2]
    return best[0] - best[1] if len(best) == 2 else None


def near_tie(stable_top: Mapping[int, float] | None, candidate_top: Mapping[int, float] | None,
             stable_token: int | None, candidate_token: int | None, epsilon: float) -> bool:
    """Is a divergence (``stable_token`` != ``candidate_token``) excused? Only when *both* sides' top-2
    logprob margins there are below ``epsilon`` and each side's token is one of the other side's top two:
    both sides saw the same two practically equal choices and picked differently. A side that was sure of
    its token (a wide margin) diverged, whatever the other side saw."""
    if epsilon <= 0 or stable_token is None or candidate_token is None:
        return False
    margins = top2_margin(stable_top), top2_margin(candidate_top)
    if any(m is None or m >= epsilon for m in margins):
        return False

    def top2(top: Mapping[int, float] | None) -> set[int]:
        return {t for t, _ in sorted((top or {}).items(), key=lambda kv: -kv[1])[:2]}

    return candidate_token in top2(stable_top) and stable_token in top2(candidate_top)


class ParityRules(BaseModel):
    """What a summary must show to pass, beyond every prompt matching (``spec.rollout.parity``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: int = Field(default=1, ge=1)
    """Prompts that must have been compared."""
    end_to_end: bool = False
    """Every compared request must have gone through a prefill pod of its own revision."""
    max_near_tie_fraction: float = Field(default=1.0, ge=0, le=1)
    """At most this fraction of the compared prompts may have a near-tie."""
    min_tokens: int = Field(default=0, ge=0)
    """At least this many generated positions compared and accepted in total."""


def default_min_tokens(prompts: int, max_tokens: int) -> int:
    """``minTokens`` when unset: a quarter of the budget (prompts x tokens each). Greedy outputs end early
    at their end of sequence, so the whole budget is not expected; a run that compared less than this
    mostly compared end-of-sequence tokens."""
    return prompts * max_tokens // 4


def judge(s: ParitySummary, rules: ParityRules) -> tuple[str, str] | None:
    """The first rule ``s`` breaks, as (reason, message); None: it passes. Endpoint errors and divergences
    come first (they are answers about the candidate); then what was compared must be enough to count."""
    if s.errors:
        return "EndpointError", f"{s.errors} prompt(s) could not be compared: {s.first_divergence or 'an endpoint failed'}"
    if s.diverged:
        return "Diverged", f"{s.diverged} of {s.compared} prompts diverged, first {s.first_divergence}"
    if s.compared < rules.prompts:
        return "TooFewPrompts", f"{s.compared} prompts compared, {rules.prompts} required (spec.rollout.parity.prompts)"
    if rules.end_to_end and not s.end_to_end:
        return "NotEndToEnd", "the comparison did not go through a prefill pod of each revision (prefill -> NIXL -> decode)"
    if s.near_ties > rules.max_near_tie_fraction * s.compared:
        return "TooManyNearTies", (f"{s.near_ties} of {s.compared} prompts diverged at a near-tie, more than "
                                   f"{rules.max_near_tie_fraction:g} of them (spec.rollout.parity.maxNearTieFraction): "
                                   "near-ties this frequent are not noise")
    if s.tokens < rules.min_tokens:
        return "TooFewTokens", (f"{s.tokens} tokens compared, {rules.min_tokens} required "
                                "(spec.rollout.parity.minTokens): the outputs were too short to tell")
    return None


def parity_argv(
    stable: str, candidate: str, *, prompts: str, limit: int, max_tokens: int,
    stable_prefiller: str | None = None, candidate_prefiller: str | None = None, output: str | None = None,
    summary: str | None = None, top_logprobs: int | None = None, near_tie_epsilon: float | None = None,
    concurrency: int | None = None, max_near_tie_fraction: float | None = None, min_tokens: int | None = None,
) -> list[str]:
    """``hisparse-runtime parity`` comparing two base URLs. ``*_prefiller``: ``host:port`` of a prefill
    endpoint of the same revision, sent as llm-d's prefiller header so each request takes the
    prefill -> NIXL -> decode path."""
    argv = [*PARITY_COMMAND, STABLE, stable, CANDIDATE, candidate, PROMPTS, prompts,
            LIMIT, str(limit), MAX_TOKENS, str(max_tokens)]
    if stable_prefiller:
        argv += [STABLE_PREFILLER, stable_prefiller]
    if candidate_prefiller:
        argv += [CANDIDATE_PREFILLER, candidate_prefiller]
    if output:
        argv += [OUTPUT, output]
    if summary:
        argv += [SUMMARY, summary]
    if top_logprobs:
        argv += [TOP_LOGPROBS, str(top_logprobs)]
    if near_tie_epsilon is not None:
        argv += [NEAR_TIE_EPSILON, repr(float(near_tie_epsilon))]
    if concurrency is not None:
        argv += [CONCURRENCY, str(concurrency)]
    if max_near_tie_fraction is not None:
        argv += [MAX_NEAR_TIE_FRACTION, repr(float(max_near_tie_fraction))]
    if min_tokens is not None:
        argv += [MIN_TOKENS, str(min_tokens)]
    return argv
