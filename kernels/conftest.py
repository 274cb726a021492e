"""Test configuration of the kernels package: import path and markers."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config) -> None:  # noqa: ANN001
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU with compute capability >= 9.0 and nvcc")
    config.addinivalue_line("markers", "slow: long-running (the full-size parity run)")
