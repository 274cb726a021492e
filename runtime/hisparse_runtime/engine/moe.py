"""The MoE expert backend of a role (``--moe-backend``): its default from the GPU architecture and the
model, and which choices are unsafe where.

What vLLM 0.33.0 does by itself (``docs/vllm-0.33-engine-features.md`` has the file and line of each):
it offers the backends of ``MoEBackend`` (``vllm/config/kernel.py``), honours an explicit choice as
given (``fused_moe/oracle/fp8.py``: an explicit backend skips the automatic ranking), refuses only
``flashinfer_moe_ep_mega_deep_gemm`` outside DeepSeek-V4 and foreign all-to-all backends beside the
MoE-EP megakernels, and turns DeepGEMM's MoE off on Blackwell for a short list of model types that
does not include GLM DSA. The activation-scale format is global, not per backend: with DeepGEMM on a
Hopper or Blackwell GPU, ``VLLM_USE_DEEP_GEMM_E8M0`` (default 1) makes every block-FP8 activation
quantization round its scales to UE8M0 (``per_token_group_quant_fp8`` follows
``is_deep_gemm_e8m0_used()``), packed on Blackwell. A non-DeepGEMM MoE kernel then inherits DeepGEMM's
format. The seed's rule: for GLM DSA models and online quantization on Blackwell, the scale rounding
must follow the selected MoE backend, so the toolkit names the backend and sets
``VLLM_USE_DEEP_GEMM_E8M0`` to match it (1 for ``deep_gemm``, 0 otherwise). DeepGEMM's sparse-attention
indexer keeps its own packed UE8M0 scales whatever that variable says (``sparse_mqa_logits.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from . import vllm_options
from .gpu import BLACKWELL_FAMILIES, GPU_PRODUCT_LABEL, GpuArchitecture

if TYPE_CHECKING:  # role.py embeds MoEBackend, so the settings class is imported for typing only
    from .role import RoleSettings

MoEBackend = Literal[
    "auto", "triton", "batched_triton", "deep_gemm", "deep_gemm_mega_moe", "cutlass", "flashinfer_trtllm",
    "flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_moe_ep_cutedsl", "flashinfer_b12x", "b12x",
    "flashinfer_moe_ep_mega_deep_gemm", "marlin", "humming", "triton_unfused", "aiter", "aiter_mega_moe",
    "aiter_triton_mxfp4_bf16", "aiter_triton_mxfp4_mxfp4", "flydsl", "hpc", "emulation", "rdna3",
]
"""vLLM 0.33.0's ``MoEBackend`` (``vllm/config/kernel.py``), in its order; a test compares the two."""

DEEP_GEMM: Final = "deep_gemm"
VLLM_USE_DEEP_GEMM_E8M0: Final = "VLLM_USE_DEEP_GEMM_E8M0"

ROCM_ONLY: Final[frozenset[str]] = frozenset(
    {"aiter", "aiter_mega_moe", "aiter_triton_mxfp4_bf16", "aiter_triton_mxfp4_mxfp4", "flydsl", "rdna3"}
)
"""AMD kernels: never usable on the NVIDIA GPUs HiSparse requires."""

ARCHITECTURES: Final[dict[str, frozenset[GpuArchitecture]]] = {
    "deep_gemm": frozenset({"hopper", "blackwell", "blackwell-sm120"}),  # CudaPlatform.support_deep_gemm
    "deep_gemm_mega_moe": frozenset({"hopper", "blackwell", "blackwell-sm120"}),
    "flashinfer_trtllm": frozenset({"blackwell"}),  # TrtLlmFp8Experts: capability family 100 only
    "flashinfer_moe_ep_cutedsl": frozenset({"blackwell"}),  # "requires Blackwell"
    "flashinfer_moe_ep_mega_deep_gemm": frozenset({"blackwell"}),  # "Blackwell, requires expert parallel"
    "flashinfer_b12x": frozenset({"blackwell-sm120"}),  # "SM12x"
    "b12x": frozenset({"blackwell-sm120"}),
    "hpc": frozenset({"hopper"}),  # "FP8 and Hopper only"
}
"""Backends vLLM documents or gates for some GPU families only; the others run on every CUDA GPU."""

EXPERT_PARALLEL_ONLY: Final[frozenset[str]] = frozenset({"flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_deep_gemm"})
"""MoE-EP megakernels: vLLM documents them as requiring expert parallelism."""

FLASHINFER_MOE_EP_ARCHITECTURES: Final[frozenset[str]] = frozenset(
    {"DeepseekV4ForCausalLM", "DeepSeekV4MTPModel", "DeepseekV41ForCausalLM"}
)
"""Mirror of vLLM's rule: ``flashinfer_moe_ep_mega_deep_gemm`` only serves these (a test reads vLLM's set)."""

GLM_DSA_ARCHITECTURES: Final[frozenset[str]] = frozenset({"GlmMoeDsaForCausalLM"})
"""GLM-5.x: sparse MLA with the DSA indexer (``model_type: glm_moe_dsa``)."""

BLACKWELL_DEFAULT: Final[dict[GpuArchitecture, MoEBackend]] = {
    # vLLM ranks TRT-LLM first for block FP8 on SM100 (oracle/fp8.py); it does not run on SM120.
    "blackwell": "flashinfer_trtllm",
    "blackwell-sm120": "triton",
}
"""The backend named for a scale-sensitive model on each Blackwell family (``moeBackend`` unset)."""


def online_quantization(s: RoleSettings) -> str | None:
    """The ``--quantization`` method passed in extraArgs: the toolkit has no typed field for it, and a
    pre-quantized checkpoint needs none (vLLM reads its ``quantization_config``), so a method given
    here is quantization at load time."""
    args = [*s.engine.extra_args, *s.extra_args]
    if not args:
        return None
    try:
        parsed = vllm_options.parse([vllm_options.Token(t) for t in ("serve", "model", *args)])
    except vllm_options.Refused:
        return None  # the owned-flags rule reports an argv vLLM would exit on
    value = parsed.values.get("quantization")
    return str(value) if value else None


def scale_sensitive(s: RoleSettings) -> str | None:
    """Why this role's model must not inherit DeepGEMM's UE8M0 activation scales, or None."""
    if s.model.architecture in GLM_DSA_ARCHITECTURES:
        return f"GLM DSA model ({s.model.architecture})"
    method = online_quantization(s)
    if method:
        return f"online quantization (--quantization {method})"
    return None


def scale_hazard(s: RoleSettings, arch: GpuArchitecture | None = None) -> str | None:
    """The reason the MoE scale format must be pinned for this role on ``arch`` (default: the
    architecture the render assumed), or None when vLLM's own choice is safe."""
    arch = arch or s.gpu_architecture
    if arch not in BLACKWELL_FAMILIES:
        return None
    why = scale_sensitive(s)
    return f"{why} on {arch}" if why else None


def moe_backend(s: RoleSettings, arch: GpuArchitecture | None = None) -> MoEBackend | None:
    """The ``--moe-backend`` to render: the user's choice, else the default for a scale hazard, else
    None (vLLM chooses)."""
    if s.moe_backend is not None:
        return s.moe_backend
    arch = arch or s.gpu_architecture
    return BLACKWELL_DEFAULT.get(arch) if arch and scale_hazard(s, arch) else None  # type: ignore[arg-type]


def deep_gemm_e8m0(s: RoleSettings, arch: GpuArchitecture | None = None) -> str | None:
    """``VLLM_USE_DEEP_GEMM_E8M0`` for the role: under a scale hazard the rounding follows the MoE
    backend (``1`` for deep_gemm, ``0`` otherwise); else unset (vLLM's default)."""
    if not scale_hazard(s, arch):
        return None
    backend = moe_backend(s, arch)
    if backend is None or backend == "auto":
        return None
    return "1" if backend == DEEP_GEMM else "0"


def problems(s: RoleSettings, arch: GpuArchitecture | None = None) -> list[str]:
    """Why the role's MoE backend is unsafe on ``arch`` (default: the render's), each with the fix."""
    arch = arch or s.gpu_architecture
    backend = moe_backend(s, arch)
    out: list[str] = []
    if backend is None:
        return out
    if backend in ROCM_ONLY:
        out.append(f"moeBackend {backend!r} is an AMD ROCm kernel; HiSparse and this image run on NVIDIA CUDA "
                   "only: choose a CUDA backend (e.g. triton, deep_gemm) or leave moeBackend unset")
        return out
    allowed = ARCHITECTURES.get(backend)
    if allowed is not None and arch is not None and arch not in allowed:
        out.append(f"moeBackend {backend!r} runs only on {', '.join(sorted(allowed))} GPUs (vLLM 0.33), but the "
                   f"nodes this role can land on are {arch}: choose another backend or leave it unset")
    if backend in EXPERT_PARALLEL_ONLY and not s.parallelism.enable_expert_parallel:
        out.append(f"moeBackend {backend!r} is an expert-parallel megakernel: set parallelism.enableExpertParallel")
    if backend == "flashinfer_moe_ep_mega_deep_gemm" and s.model.architecture not in FLASHINFER_MOE_EP_ARCHITECTURES:
        out.append(f"moeBackend {backend!r} only serves DeepSeek-V4 models ({', '.join(sorted(FLASHINFER_MOE_EP_ARCHITECTURES))});"
                   f" vLLM refuses it for {s.model.architecture or 'a model whose architecture is not declared'}")
    hazard = scale_hazard(s, arch)
    if hazard and backend == "auto":
        out.append(f"moeBackend 'auto' is unsafe for {hazard}: vLLM fixes the activation-scale format globally "
                   "(DeepGEMM's UE8M0) before it picks a kernel, so a non-DeepGEMM MoE kernel would inherit it; "
                   f"name the backend (unset gives {BLACKWELL_DEFAULT.get(arch, 'triton')!r}; deep_gemm is allowed)")  # type: ignore[arg-type]
    if hazard:
        user = {**s.engine.extra_env, **s.extra_env}.get(VLLM_USE_DEEP_GEMM_E8M0)
        want = deep_gemm_e8m0(s, arch)
        if user is not None and want is not None and user != want:
            out.append(f"{VLLM_USE_DEEP_GEMM_E8M0}={user} contradicts moeBackend {backend!r} for {hazard}: the MoE "
                       f"activation scales must follow the backend ({VLLM_USE_DEEP_GEMM_E8M0}={want}); remove it from extraEnv")
    return out


def rendered_scale_problem(s: RoleSettings, arch: GpuArchitecture, env: dict[str, str]) -> str | None:
    """For a role that lands on ``arch`` with ``env`` in its container: why the MoE backend the render
    chose (from the role's pinned family, possibly none) leaves the activation-scale rounding unsafe
    there, or None. Catches what a render for an unknown family cannot: no named backend, or a named
    one without ``VLLM_USE_DEEP_GEMM_E8M0`` set to follow it."""
    hazard = scale_hazard(s, arch)
    if not hazard:
        return None
    rendered = moe_backend(s)
    if rendered is None:
        return (f"the MoE backend must be named for {hazard}, but the role's placement does not pin a GPU family, so "
                f"none was rendered; add nodeSelector {GPU_PRODUCT_LABEL}: <product> so the render names it, or set moeBackend")
    if rendered == "auto":
        return None  # problems() refuses it with the reason
    want = "1" if rendered == DEEP_GEMM else "0"
    have = env.get(VLLM_USE_DEEP_GEMM_E8M0)
    if (have or "1") != want:
        shown = f"{VLLM_USE_DEEP_GEMM_E8M0}={have}" if have else f"{VLLM_USE_DEEP_GEMM_E8M0} unset (vLLM's default 1)"
        fix = ("the render set it, so the pod spec was changed outside the operator" if s.gpu_architecture == arch else
               f"the render sets it only for a role pinned to its GPU family; add nodeSelector {GPU_PRODUCT_LABEL}: <product>")
        return f"moeBackend {rendered!r} needs {VLLM_USE_DEEP_GEMM_E8M0}={want} for {hazard}, but the container has {shown}: {fix}"
    return None
