"""A vLLM-shaped CPU engine: a stand-in for ``vllm serve`` on nodes without a GPU.

What it stands in for: the executable the runtime's entrypoint supervises. Where the CPU runtime image
sets ``HISPARSE_SERVING_ENGINE=cpu``, ``hisparse-runtime serve`` runs
``python -m hisparse_runtime.cpu_engine`` with exactly the argv it renders for ``vllm serve``, so the
entrypoint's preflight, probes, SIGTERM drain, the llm-d sidecar and the EPP meet a process that
behaves like vLLM on the paths they use.

What it does, for real:

- parses the argv with vLLM 0.33.0's own ``serve`` parser and config classes (``AsyncEngineArgs``,
  ``KVTransferConfig``, ``hisparse_host_pool_gib``); what vLLM's parser refuses exits 2, and vLLM's
  HiSparse startup rules that need no GPU exit 1 with vLLM's words (:mod:`.args`);
- serves a tiny DSA model (``hisparse_kernels.tiny_dsa``: MLA, lightning indexer, top-k sparse
  attention, index sharing) with real weights from a model directory (``config.json`` with
  ``index_topk`` etc. + ``model.safetensors``, :mod:`.checkpoint`), on CPU, with continuous batching;
  a decode engine with a ``HiSparseConnector`` decodes through the HiSparse host pool and hot buffer
  with the kernels' CPU ops (:mod:`.runner`);
- speaks vLLM's OpenAI API: ``/v1/completions`` (greedy, ``return_token_ids``, ``logprobs``,
  ``kv_transfer_params``), ``/health``, ``/v1/models``, ``/metrics`` with vLLM's metric names and the
  project plugin's (:mod:`.server`, :mod:`.metrics`);
- does P/D over NIXL (UCX, DRAM): a prefill keeps the request's KV blocks in its NIXL-registered cache
  and answers with vLLM's ``kv_transfer_params``; decode READs those blocks into its own cache (the
  HiSparse host pool) and continues from them, recomputing only the last prompt token (:mod:`.kv_transfer`);
- drains on SIGTERM as vLLM does with ``--shutdown-timeout``.

What it does not do: run any model but its own tiny DSA checkpoints; use GPUs, tensor/data/expert
parallelism (parsed, then served by one CPU process), CUDA graphs, quantized KV (``--kv-cache-dtype``
is parsed; rows are bf16), sampling (every request decodes greedily; a non-zero temperature is refused),
streaming, chat completions, prefix caching (the counters stay at zero hits), a real tokenizer (UTF-8
bytes); pair with a real vLLM (its NIXL handshake is its own small JSON protocol on vLLM's side-channel
host and port, and Mooncake is not driven).
"""

from __future__ import annotations

from hisparse_runtime.cpu_engine.checkpoint import (
    TINY_CONFIG,
    load_checkpoint,
    write_checkpoint,
    write_hf_cache_checkpoint,
)

__all__ = ["TINY_CONFIG", "load_checkpoint", "main", "write_checkpoint", "write_hf_cache_checkpoint"]


def main(argv: list[str] | None = None) -> int:
    from hisparse_runtime.cpu_engine.cli import main as _main

    return _main(argv)
