"""A model directory the CPU engine (and the runtime's preflight) load for real: ``config.json`` in the
shape of a DeepSeek-V3.2 checkpoint (``model_type``, MLA dims, ``index_topk``, ``index_topk_freq``,
...) plus ``model.safetensors`` with the tiny DSA model's weights.

The weights are the deterministic ones of ``hisparse_kernels.tiny_dsa`` for a seed, so a test can
compute the same model in-process (``TinyDSA(config, seed=seed)``) and compare tokens. Keys the tiny
model needs beyond a DeepSeek config (hot-buffer slots, KV capacity, batch rows, tokenizer) live under
one ``hisparse_tiny_dsa`` block, so the rest of ``config.json`` reads like the real thing.

Tokenizer: UTF-8 bytes folded into the vocabulary (``byte % vocab_size``), as the project's test
completions server does; a text prompt is its bytes, a token under 256 detokenizes to that byte.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "CONFIG_FILE",
    "TINY_CONFIG",
    "WEIGHTS_FILE",
    "Checkpoint",
    "load_checkpoint",
    "perturb_output_head",
    "write_checkpoint",
    "write_hf_cache_checkpoint",
]

CONFIG_FILE: Final = "config.json"
WEIGHTS_FILE: Final = "model.safetensors"
FORMAT_KEY: Final = "hisparse_tiny_dsa"
FORMAT_VERSION: Final = 1

TINY_CONFIG: Final[dict[str, Any]] = dict(
    vocab_size=512, hidden_size=128, num_layers=4, num_heads=2, kv_lora_rank=128, qk_nope_head_dim=32,
    qk_rope_head_dim=32, v_head_dim=32, index_n_heads=2, index_head_dim=16, index_topk=32, index_topk_freq=2,
    hot_slots=64, block_size=16, num_blocks=128, max_batch=4,
)  # fmt: skip
"""A model that decodes in milliseconds per step on one core: 4 layers (2 index groups), top-k 32 out
of a 2048-token KV capacity, 4 concurrent requests."""

# config.json key -> TinyDSAConfig field, for the fields a DeepSeek-V3.2 config.json names itself.
_HF_KEYS: Final = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "index_n_heads": "index_n_heads",
    "index_head_dim": "index_head_dim",
    "index_topk": "index_topk",
    "index_topk_freq": "index_topk_freq",
    "rope_theta": "rope_theta",
}
_TINY_KEYS: Final = ("hot_slots", "block_size", "num_blocks", "max_batch")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded model directory."""

    path: Path
    config: Any  # TinyDSAConfig
    weights: Any  # TinyDSAWeights
    seed: int
    hf_config: dict[str, Any]

    @property
    def capacity_tokens(self) -> int:
        return int(self.config.num_blocks * self.config.block_size)


def _tiny_config(fields: dict[str, Any] | None = None) -> Any:
    from hisparse_kernels.tiny_dsa import TinyDSAConfig

    return TinyDSAConfig(**{**TINY_CONFIG, **(fields or {})})


def config_json(config: Any, seed: int) -> dict[str, Any]:
    """The ``config.json`` document of a tiny DSA checkpoint."""
    fields = asdict(config)
    doc: dict[str, Any] = {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        **{hf: fields[ours] for hf, ours in _HF_KEYS.items()},
        "max_position_embeddings": config.num_blocks * config.block_size,
        "torch_dtype": "float32",
        FORMAT_KEY: {"format": FORMAT_VERSION, "seed": seed, "tokenizer": "bytes",
                     **{k: fields[k] for k in _TINY_KEYS}},
    }  # fmt: skip
    return doc


def _tensors(weights: Any) -> dict[str, Any]:
    out = {"embed": weights.embed, "final_norm": weights.final_norm, "lm_head": weights.lm_head}
    for i, layer in enumerate(weights.layers):
        out.update({f"layers.{i}.{name}": t for name, t in layer.items()})
    return {k: v.contiguous().cpu() for k, v in out.items()}


def write_checkpoint(path: str | os.PathLike[str], *, seed: int = 0, config: Any = None) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of ``TinyDSA(config, seed=seed)`` into ``path``."""
    from safetensors.torch import save_file

    from hisparse_kernels.tiny_dsa.model import TinyDSAWeights

    import torch

    config = config or _tiny_config()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    weights = TinyDSAWeights(config, seed, torch.device("cpu"))
    save_file(_tensors(weights), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config_json(config, seed), indent=2, sort_keys=True) + "\n")
    return out


def write_hf_cache_checkpoint(cache_dir: str | os.PathLike[str], repo_id: str, *, revision: str | None = None,
                              seed: int = 0, config: Any = None) -> Path:  # fmt: skip
    """Write the checkpoint into a Hugging Face hub cache (``HF_HUB_CACHE`` layout), as ``vllm serve
    ORG/NAME --revision SHA`` finds a downloaded model offline. Returns the snapshot directory."""
    revision = revision or "0" * 40
    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    snapshot = write_checkpoint(repo / "snapshots" / revision, seed=seed, config=config)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def resolve_model_dir(model: str, revision: str | None) -> Path:
    """The directory of ``vllm serve``'s model argument: a local directory, or a repository id found in
    the Hugging Face cache (offline; this engine never downloads)."""
    local = Path(model)
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    # Read at call time (the hub reads its variables once, at import).
    cache_dir = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None)
    try:
        return Path(snapshot_download(model, revision=revision, local_files_only=True, cache_dir=cache_dir))
    except Exception as exc:  # the hub raises several types for "not in the cache"
        raise FileNotFoundError(
            f"model {model!r} (revision {revision or 'main'}) is neither a directory nor in the Hugging Face cache"
            f" ({os.environ.get('HF_HUB_CACHE') or os.environ.get('HF_HOME') or 'default location'}): {exc}."
            " Write one with `python -m hisparse_runtime.cpu_engine checkpoint`."
        ) from exc


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a model directory written by :func:`write_checkpoint`; every tensor's shape is checked."""
    import torch
    from safetensors.torch import load_file

    from hisparse_kernels.tiny_dsa.model import TinyDSAWeights

    root = Path(path)
    doc = json.loads((root / CONFIG_FILE).read_text())
    tiny = doc.get(FORMAT_KEY)
    if not isinstance(tiny, dict) or tiny.get("format") != FORMAT_VERSION:
        raise ValueError(f"{root / CONFIG_FILE} has no `{FORMAT_KEY}` block of format {FORMAT_VERSION}:"
                         " the CPU engine serves only tiny DSA checkpoints it wrote itself")  # fmt: skip
    fields = {ours: doc[hf] for hf, ours in _HF_KEYS.items() if hf in doc}
    fields.update({k: tiny[k] for k in _TINY_KEYS if k in tiny})
    config = _tiny_config(fields)
    seed = int(tiny.get("seed", 0))
    weights = TinyDSAWeights(config, seed, torch.device("cpu"))  # right shapes; values replaced below
    stored = load_file(str(root / WEIGHTS_FILE))
    expected = _tensors(weights)
    if set(stored) != set(expected):
        raise ValueError(f"{root / WEIGHTS_FILE}: tensors {sorted(set(stored) ^ set(expected))[:5]} do not"
                         " match config.json")  # fmt: skip
    for name, tensor in stored.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{root / WEIGHTS_FILE}: {name} has shape {tuple(tensor.shape)}, config.json"
                             f" implies {tuple(expected[name].shape)}")  # fmt: skip
    weights.embed, weights.final_norm, weights.lm_head = stored["embed"], stored["final_norm"], stored["lm_head"]
    for i, layer in enumerate(weights.layers):
        for name in layer:
            layer[name] = stored[f"layers.{i}.{name}"]
    return Checkpoint(root, config, weights, seed, doc)


def perturb_output_head(checkpoint: Checkpoint) -> None:
    """A stand-in for a build that computes different tokens (``HISPARSE_CPU_ENGINE_PERTURB``): the output
    head's columns move by one, so every logit lands on the next token id and every greedy token changes."""
    checkpoint.weights.lm_head = checkpoint.weights.lm_head.roll(1, dims=1)

