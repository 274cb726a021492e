"""Fixtures the CPU parity tests share: the small tiny-DSA model and its full-KV tokens (computed once)."""

from __future__ import annotations

import pytest
from tinysupport import SMALL, small_requests


@pytest.fixture(scope="session")
def model():  # noqa: ANN201  (torch is imported only where the tests need it)
    pytest.importorskip("torch")
    from hisparse_kernels.tiny_dsa import TinyDSA

    return TinyDSA(SMALL, seed=1, device="cpu")


@pytest.fixture(scope="session")
def baseline(model):  # noqa: ANN001, ANN201
    return model.generate_batch(small_requests(), hisparse=False)
