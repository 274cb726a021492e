"""CPU simulation of a decode fleet's host-pool traffic under vLLM's placement and ``pack``.

Drives vLLM 0.33's own ``BlockPool`` (the class HiSparse's host manager uses) through churn: a
fixed number of running requests, each arriving with its whole prompt (P/D: the KV lands at
admission), a share of them reusing one of a few long shared prefixes (prefix caching through the
pool's own ``touch`` and hash eviction), decoding one block every ``block_size`` tokens, and freed
in vLLM's order when done. After warm-up (the pool full of cached blocks) it samples steps: each
running request's top-k token positions (recent tokens plus positions spread over its context) mapped
through its block table to host slots of one layer's span, and the 2 MiB regions those rows touch.

Run: ``python -m hisparse_runtime.plugin.placement_sim --out DIR [--running 128 --name full]``
(writes ``NAME_sim.json`` and ``NAME_trace.npz``, the slots the GPU benchmark swaps in; the
committed ones are in ``kernels/results/footprint/``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hisparse_runtime.plugin.placement import apply

ROW = 656
REGION = 2 << 20


@dataclass
class Fleet:
    layer_span_gib: float = 64 / 24  # the GPU benchmark's pool: 64 GiB, 24 layers (160 GiB / 61 layers)
    block_size: int = 64
    running: int = 64
    topk: int = 2048
    max_context: int = 128 * 1024
    shared_prefixes: int = 8
    shared_prefix_tokens: int = 8192
    shared_fraction: float = 0.5
    median_context: int = 24 * 1024
    seed: int = 0
    blocks: int = field(init=False)

    def __post_init__(self) -> None:
        self.blocks = int(self.layer_span_gib * (1 << 30)) // (ROW * self.block_size)


class Sim:
    def __init__(self, fleet: Fleet, policy: str) -> None:
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

        self.f, self.policy = fleet, policy
        self.rng = np.random.default_rng(fleet.seed)
        self.pool = BlockPool(fleet.blocks, enable_caching=True, hash_block_size=fleet.block_size)
        apply(self.pool, policy)
        self._hash = lambda key: make_block_hash_with_group_id(key.to_bytes(16, "little"), 0)  # noqa: E731
        self.next_key = 1
        self.prefix_keys = {p: [self._new_key() for _ in range(fleet.shared_prefix_tokens // fleet.block_size)]
                             for p in range(fleet.shared_prefixes)}
        self.reqs: list[dict] = []
        self.prefix_hits = 0
        self.prefix_lookups = 0

    def _new_key(self) -> int:
        self.next_key += 1
        return self.next_key

    def _cache(self, block, key: int) -> None:  # noqa: ANN001 - a vLLM KVCacheBlock
        h = self._hash(key)
        block.set_block_hash(h, self.f.block_size)
        self.pool.cached_block_hash_to_block.insert(h, block)

    def admit(self) -> bool:
        """Admit one request; False when the pool cannot hold its prompt now."""
        f = self.f
        ctx = int(min(f.max_context, max(1024, self.rng.lognormal(np.log(f.median_context), 0.9))))
        out = int(self.rng.integers(256, 4096))
        blocks = []
        keys: list[int] = []
        if self.rng.random() < f.shared_fraction:
            keys = list(self.prefix_keys[int(self.rng.integers(f.shared_prefixes))])[: ctx // f.block_size]
            for key in keys:
                self.prefix_lookups += 1
                hit = self.pool.cached_block_hash_to_block.get_one_block(self._hash(key))
                if hit is None:
                    break
                self.prefix_hits += 1
                self.pool.touch([hit])
                blocks.append(hit)
        need = -(-ctx // f.block_size) - len(blocks)
        if need > self.pool.get_num_free_blocks():
            self.pool.free_blocks(reversed(blocks))
            return False
        fresh = self.pool.get_new_blocks(need)
        for i, block in enumerate(fresh):
            j = len(blocks) + i
            if (j + 1) * f.block_size <= ctx:  # full blocks get a hash (shared prefix: its key)
                self._cache(block, keys[j] if j < len(keys) else self._new_key())
        blocks.extend(fresh)
        self.reqs.append({"blocks": blocks, "len": ctx, "left": out})
        return True

    def finish(self, i: int) -> None:
        req = self.reqs.pop(i)
        self.pool.free_blocks(reversed(req["blocks"]))  # vLLM frees a request tail first

    def step(self) -> None:
        f = self.f
        for i in reversed(range(len(self.reqs))):
            req = self.reqs[i]
            req["len"] += 1
            req["left"] -= 1
            if req["len"] % f.block_size == 0:
                self._cache(req["blocks"][-1], self._new_key())
            if req["left"] <= 0 or req["len"] >= f.max_context:
                self.finish(i)
            elif req["len"] % f.block_size == 1:
                if self.pool.get_num_free_blocks() == 0:
                    self.finish(i)  # preempted: the pool is full
                else:
                    req["blocks"].extend(self.pool.get_new_blocks(1))
        while len(self.reqs) < f.running and self.admit():
            pass

    def topk_slots(self) -> np.ndarray:
        """[running, topk] host slots of one step (-1 padding): a quarter from the last 4K tokens,
        the rest spread over the whole context."""
        f = self.f
        out = np.full((64, f.topk), -1, dtype=np.int32)  # the benchmark's 64 request rows
        for r, req in enumerate(self.reqs[:64]):
            n = req["len"]
            if n <= f.topk:
                pos = np.arange(n)
            else:
                recent = self.rng.integers(max(0, n - 4096), n, size=f.topk // 4)
                spread = self.rng.integers(0, n, size=f.topk)
                pos = np.unique(np.concatenate([recent, spread]))[: f.topk]
                if pos.size < f.topk:
                    pool = np.setdiff1d(np.arange(n), pos)
                    pos = np.concatenate([pos, self.rng.choice(pool, f.topk - pos.size, replace=False)])
            ids = np.array([b.block_id for b in req["blocks"]], dtype=np.int64)
            out[r, : pos.size] = ids[pos // f.block_size] * f.block_size + pos % f.block_size
        return out


def footprint(slots: np.ndarray) -> dict:
    s = slots[slots >= 0].astype(np.int64) * ROW
    regions = np.unique(s // REGION)
    per_req = [np.unique(row[row >= 0].astype(np.int64) * ROW // REGION).size for row in slots]
    return {"rows": int(s.size), "regions_2mib": int(regions.size),
            "touched_gib": regions.size * REGION / (1 << 30), "span_gib": float((s.max() - s.min()) / (1 << 30)),
            "regions_per_request_median": float(np.median(per_req))}


def run(fleet: Fleet, policy: str, warm_steps: int, samples: int, gap: int) -> tuple[dict, list[np.ndarray]]:
    sim = Sim(fleet, policy)
    for _ in range(warm_steps):
        sim.step()
    traces, figs = [], []
    for _ in range(samples):
        for _ in range(gap):
            sim.step()
        slots = sim.topk_slots()
        traces.append(slots)
        figs.append(footprint(slots))
    live = sum(len(r["blocks"]) for r in sim.reqs) * fleet.block_size * ROW / (1 << 30)
    summary = {
        "policy": policy, "live_kv_gib": live,
        "touched_gib_median": float(np.median([f["touched_gib"] for f in figs])),
        "regions_2mib_median": float(np.median([f["regions_2mib"] for f in figs])),
        "span_gib_median": float(np.median([f["span_gib"] for f in figs])),
        "regions_per_request_median": float(np.median([f["regions_per_request_median"] for f in figs])),
        "prefix_hit_rate": sim.prefix_hits / max(1, sim.prefix_lookups),
        "free_blocks_end": sim.pool.get_num_free_blocks(), "steps": figs,
    }
    return summary, traces


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warm-steps", type=int, default=30000)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--gap", type=int, default=500)
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--median-context", type=int, default=24 * 1024)
    parser.add_argument("--name", default="placement")
    args = parser.parse_args()
    fleet = Fleet(running=args.running, median_context=args.median_context)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"fleet": {k: v for k, v in vars(fleet).items()}, "row_bytes": ROW, "region_bytes": REGION,
              "warm_steps": args.warm_steps, "samples": args.samples, "gap": args.gap, "policies": {}}
    arrays = {}
    rows = []
    for policy in ("vllm", "pack"):
        summary, traces = run(fleet, policy, args.warm_steps, args.samples, args.gap)
        result["policies"][policy] = summary
        for i, t in enumerate(traces):
            arrays[f"{policy}/step{i}"] = t
        rows.append((policy, summary))
    (args.out / f"{args.name}_sim.json").write_text(json.dumps(result, indent=1))
    np.savez_compressed(args.out / f"{args.name}_trace.npz", **arrays)
    print(f"layer span {fleet.layer_span_gib:.2f} GiB, {fleet.blocks} blocks of {fleet.block_size} tokens, "
          f"{fleet.running} running, top-k {fleet.topk}")
    print(f"{'policy':<8} {'live KV GiB':>11} {'touched GiB':>11} {'2MiB regions':>12} {'span GiB':>9} "
          f"{'regions/req':>11} {'prefix hits':>11}")
    for policy, s in rows:
        print(f"{policy:<8} {s['live_kv_gib']:>11.2f} {s['touched_gib_median']:>11.2f} "
              f"{s['regions_2mib_median']:>12.0f} {s['span_gib_median']:>9.2f} "
              f"{s['regions_per_request_median']:>11.0f} {s['prefix_hit_rate']:>11.1%}")


if __name__ == "__main__":
    main()
