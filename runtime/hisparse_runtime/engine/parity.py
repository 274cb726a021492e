"""The command line of ``hisparse-runtime parity``: its flag names, and the argv the operator renders for
a canary's parity Job. One place for both, so the Job never passes a flag the runtime does not parse."""

from __future__ import annotations

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
    """Prompts that diverged only at a near-tie of the stable's top-2 logprobs (not failures)."""
    first_divergence: str | None = Field(default=None, max_length=1024)
    """``prompt <id> at token <t>`` of the first prompt that diverged, or the first endpoint error."""


def parity_argv(
    stable: str, candidate: str, *, prompts: str, limit: int, max_tokens: int,
    stable_prefiller: str | None = None, candidate_prefiller: str | None = None, output: str | None = None,
    summary: str | None = None, top_logprobs: int | None = None, near_tie_epsilon: float | None = None,
    concurrency: int | None = None,
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
    return argv
