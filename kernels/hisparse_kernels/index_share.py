"""Index-sharing prefetch: after a full layer plans its misses, every shared layer's gather is
issued at once on a copy stream, with one event per layer, so PCIe traffic overlaps the compute of
the layers in between. Fork (copy stream waits on the compute stream) and join (compute stream waits
on a layer's event) are plain stream/event operations, so the whole pattern is capturable in a CUDA
graph. On CPU tensors the gathers run immediately and waiting is a no-op."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from hisparse_kernels.ops import gather_plan

if TYPE_CHECKING:
    import torch

    from hisparse_kernels.hot_state import HotState

__all__ = ["IndexSharePrefetcher"]


class IndexSharePrefetcher:
    """Issues the gathers of ``num_shared`` layers on one copy stream; ``wait(j)`` joins layer j."""

    def __init__(self, num_shared: int, device: "torch.device | str", *, max_blocks: int = 8,
                 priority: str = "high") -> None:
        import torch

        if priority not in ("high", "low"):
            raise ValueError(f"priority must be 'high' or 'low', got {priority!r}")
        self.device = torch.device(device)
        self.num_shared = num_shared
        self.max_blocks = max_blocks
        self.priority_name = priority
        if self.device.type == "cuda":
            # A few gather blocks (max_blocks; a capped grid uses the deep copy, 1024 threads and
            # 128 KiB in flight per block) keep PCIe busy and leave the other SMs to the compute they
            # overlap: 8 blocks keep about 1 MiB in flight, what the link needs while HBM-bound
            # kernels run beside it. Compute-bound GEMMs that fill every SM lose a wave to those 8
            # SMs; cuBLASLt's SM carveout set to max_blocks gives them back (kernels/results/NOTES.md).
            # "high": gather blocks are placed ahead of queued compute blocks; "low": behind them.
            # The capped grid's blocks stay resident for the whole copy, so the two measured the same.
            # (torch maps a priority beyond the device's range to its highest; 0 is the lowest.)
            self.stream: torch.cuda.Stream | None = torch.cuda.Stream(
                device=self.device, priority=-100 if priority == "high" else 0)
            self.events = [torch.cuda.Event() for _ in range(num_shared)]
        else:
            self.stream = None
            self.events = []

    def issue(
        self,
        state: "HotState",
        host_pools: Sequence["torch.Tensor"],
        hots: Sequence["torch.Tensor"],
        num_real_reqs: "torch.Tensor",
    ) -> None:
        """Replay ``state``'s plan into each shared layer's hot buffer (``hots[j]`` from ``host_pools[j]``)."""
        import torch

        if len(host_pools) != self.num_shared or len(hots) != self.num_shared:
            raise ValueError(f"expected {self.num_shared} shared layers, got {len(host_pools)} / {len(hots)}")
        if self.stream is None:
            for pool, hot in zip(host_pools, hots):
                gather_plan(pool, hot, state.plan_src, state.plan_dst, state.plan_count, num_real_reqs)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for j, (pool, hot) in enumerate(zip(host_pools, hots)):
                gather_plan(pool, hot, state.plan_src, state.plan_dst, state.plan_count, num_real_reqs,
                            max_blocks=self.max_blocks)
                self.events[j].record(self.stream)

    def wait(self, j: int) -> None:
        """Make the current stream wait until shared layer ``j``'s rows have landed."""
        import torch

        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self.events[j])
