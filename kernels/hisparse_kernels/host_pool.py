"""Pinned host pool: page-aligned memory, registered with CUDA at its exact size.

Kernels read and write it through UVA (the device address of a registered page equals its host
address), so no ``cudaMemcpy`` is involved. Unlike ``pin_memory()``, the allocation is not rounded up
by a caching allocator, and :meth:`HostPool.close` unregisters it at a known point instead of
whenever the garbage collector gets to it.
"""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["HostPool"]


class HostPool:
    """``[num_layers, num_slots, row_bytes]`` uint8 of page-locked host memory.

    ``pin=False`` (or no CUDA) gives the same layout in ordinary memory, for the CPU reference path.
    Use as a context manager or call :meth:`close`; views handed out must not be used after it.
    """

    def __init__(self, num_layers: int, num_slots: int, row_bytes: int, *, pin: bool = True) -> None:
        import torch

        if row_bytes <= 0 or row_bytes % 16:
            raise ValueError(f"row_bytes={row_bytes} must be a positive multiple of 16")
        if num_layers <= 0 or num_slots <= 0:
            raise ValueError("num_layers and num_slots must be positive")
        self.shape = (num_layers, num_slots, row_bytes)
        self.nbytes = num_layers * num_slots * row_bytes
        self._map: mmap.mmap | None = mmap.mmap(-1, self.nbytes)  # anonymous: page-aligned
        # numpy holds a buffer export of the mapping and torch holds the array, so the pages stay
        # mapped while any view is alive (torch.frombuffer alone would not keep the export).
        array = np.frombuffer(self._map, dtype=np.uint8)
        self._tensor: torch.Tensor | None = torch.from_numpy(array).view(self.shape)
        self.registered = False
        if pin and torch.cuda.is_available():
            from hisparse_kernels.ops import ensure_loaded

            ensure_loaded()
            # cudaHostRegister(portable | mapped) at the exact size; the ops remember the range so
            # their launch checks need no driver call.
            torch.ops.hisparse.host_register(self._tensor.data_ptr(), self.nbytes)
            self.registered = True

    @property
    def tensor(self) -> "torch.Tensor":
        if self._tensor is None:
            raise RuntimeError("HostPool is closed")
        return self._tensor

    def layer(self, index: int) -> "torch.Tensor":
        """uint8 [num_slots, row_bytes] view of one layer (what the ops take as ``host_pool``)."""
        return self.tensor[index]

    def close(self) -> None:
        """Unregister now (after the device is idle), then release the memory."""
        if self._tensor is None:
            return
        if self.registered:
            import torch

            torch.cuda.synchronize()
            self.registered = False
            torch.ops.hisparse.host_unregister(self._tensor.data_ptr())
        self._tensor = None
        try:
            assert self._map is not None
            self._map.close()
        except BufferError:
            pass  # a caller still holds a view: the pages are unmapped when the last one goes
        self._map = None

    def __enter__(self) -> "HostPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
