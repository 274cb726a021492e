"""Weights and per-layer math of the tiny DSA model (MLA + lightning indexer + top-k sparse attention).

Decode attention is written in the absorbed MLA form: a KV row is the normalized latent ``c``
(``kv_lora_rank``) followed by the rotated key ``k_rope`` (``qk_rope_head_dim``), stored as bf16. Both
serving paths feed the same functions with KV rows gathered from different places, so identical
rows give bit-identical activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["TinyDSAConfig", "TinyDSAWeights"]


@dataclass(frozen=True)
class TinyDSAConfig:
    """Shape of the model and of its KV cache."""

    vocab_size: int = 512
    hidden_size: int = 256
    num_layers: int = 8
    num_heads: int = 4
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 64
    index_n_heads: int = 4
    index_head_dim: int = 32
    index_topk: int = 64
    """K: KV rows each query attends to."""
    index_topk_freq: int = 4
    """Layer l runs the indexer when ``l % index_topk_freq == 0``; the next ones reuse its top-k."""
    hot_slots: int = 128
    """H: LRU slots per request in the hot buffer (default 2K)."""
    block_size: int = 16
    num_blocks: int = 2048
    max_batch: int = 32
    rope_theta: float = 10000.0

    @property
    def kv_row_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def kv_row_bytes(self) -> int:
        return self.kv_row_dim * 2  # bf16

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def is_full_layer(self, layer: int) -> bool:
        return layer % self.index_topk_freq == 0


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class TinyDSAWeights:
    """Random weights drawn from ``seed`` (CPU generator, so every device gets the same values)."""

    def __init__(self, config: TinyDSAConfig, seed: int, device: torch.device) -> None:
        self.config = c = config
        gen = torch.Generator().manual_seed(seed)

        def w(*shape: int, fan_in: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) / math.sqrt(fan_in)).to(device)

        d = c.hidden_size
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        self.embed = w(c.vocab_size, d, fan_in=1)
        self.final_norm = torch.ones(d, device=device)
        self.lm_head = w(d, c.vocab_size, fan_in=d)
        self.layers = []
        for layer in range(c.num_layers):
            p = {
                "attn_norm": torch.ones(d, device=device),
                "mlp_norm": torch.ones(d, device=device),
                "kv_norm": torch.ones(c.kv_lora_rank, device=device),
                "w_q": w(d, c.num_heads * qk, fan_in=d),
                "w_dkv": w(d, c.kv_row_dim, fan_in=d),
                "w_uk": w(c.num_heads, c.qk_nope_head_dim, c.kv_lora_rank, fan_in=c.qk_nope_head_dim),
                "w_uv": w(c.num_heads, c.kv_lora_rank, c.v_head_dim, fan_in=c.kv_lora_rank),
                "w_o": w(c.num_heads * c.v_head_dim, d, fan_in=c.num_heads * c.v_head_dim),
                "w_up": w(d, 2 * d, fan_in=d),
                "w_down": w(2 * d, d, fan_in=2 * d),
            }
            if c.is_full_layer(layer):
                p["w_iq"] = w(d, c.index_n_heads * c.index_head_dim, fan_in=d)
                p["w_ik"] = w(d, c.index_head_dim, fan_in=d)
                p["w_iw"] = w(d, c.index_n_heads, fan_in=d)
            self.layers.append(p)
        half = c.qk_rope_head_dim // 2
        self.inv_freq = (1.0 / (c.rope_theta ** (torch.arange(half, dtype=torch.float32) / half))).to(device)

    # ----------------------------------------------------------------------------- pieces
    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotate the last dim of ``x`` [..., N, rope] (or [N, rope]) by positions ``pos`` [N]."""
        ang = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cos(ang), torch.sin(ang)
        while cos.dim() < x.dim():
            cos, sin = cos[:, None, :], sin[:, None, :]
        x1, x2 = x[..., ::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.flatten(-2)

    def attn_input(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        return _rms_norm(x, self.layers[layer]["attn_norm"])

    def kv_rows(self, h: torch.Tensor, pos: torch.Tensor, layer: int) -> torch.Tensor:
        """KV rows [N, kv_lora_rank + rope] in bf16 for hidden states ``h`` [N, D]."""
        c = self.config
        p = self.layers[layer]
        ckv = h @ p["w_dkv"]
        latent = _rms_norm(ckv[:, : c.kv_lora_rank], p["kv_norm"])
        k_rope = self.rope(ckv[:, c.kv_lora_rank:], pos)
        return torch.cat([latent, k_rope], dim=-1).to(torch.bfloat16)

    def index_keys(self, h: torch.Tensor, layer: int) -> torch.Tensor:
        return h @ self.layers[layer]["w_ik"]

    def index_scores(self, h: torch.Tensor, keys: torch.Tensor, layer: int) -> torch.Tensor:
        """Lightning indexer: ``sum_j w_j(t) * relu(q_j(t) . k_s)``; ``h`` [N, D], ``keys`` [N, S, d] -> [N, S]."""
        c = self.config
        p = self.layers[layer]
        q = (h @ p["w_iq"]).view(-1, c.index_n_heads, c.index_head_dim)
        wts = h @ p["w_iw"]
        s = torch.relu(torch.einsum("njd,nsd->njs", q, keys))
        return torch.einsum("nj,njs->ns", wts, s)

    def attention(self, h: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor,
                  layer: int) -> torch.Tensor:
        """Sparse MLA over gathered rows ``kv`` [N, K, row] (bf16), ``valid`` [N, K] -> [N, D]."""
        c = self.config
        p = self.layers[layer]
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        q = (h @ p["w_q"]).view(-1, c.num_heads, qk)
        q_lat = torch.einsum("nhd,hdc->nhc", q[..., : c.qk_nope_head_dim], p["w_uk"])
        q_rope = self.rope(q[..., c.qk_nope_head_dim:], pos)
        kvf = kv.to(torch.float32)
        latent, k_rope = kvf[..., : c.kv_lora_rank], kvf[..., c.kv_lora_rank:]
        scores = (torch.einsum("nhc,nkc->nhk", q_lat, latent) + torch.einsum("nhr,nkr->nhk", q_rope, k_rope))
        scores = scores / math.sqrt(qk)
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        o_lat = torch.einsum("nhk,nkc->nhc", probs, latent)
        o = torch.einsum("nhc,hcv->nhv", o_lat, p["w_uv"]).reshape(h.shape[0], -1)
        return o @ p["w_o"]

    def mlp(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        p = self.layers[layer]
        hh = _rms_norm(x, p["mlp_norm"])
        return torch.nn.functional.gelu(hh @ p["w_up"]) @ p["w_down"]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.final_norm) @ self.lm_head
