"""Per-object retries of failed reconciles with bounded exponential backoff.

kopf does not retry ``on.event`` handlers, and the periodic re-list comes minutes later: a reconcile
that fails (the apiserver is away, a quota or an admission rule refuses a child) is run again after
``base``, ``2 x base``, ... up to ``cap`` seconds, until it succeeds. A new event for the object
reconciles it at once; the pending retry then finds itself superseded and does nothing.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

Key = tuple[str, str]


@dataclass(frozen=True)
class Backoff:
    """Delay before the n-th consecutive retry: ``base * 2**(n-1)``, at most ``cap`` seconds."""

    base: float = 1.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"backoff needs 0 < base <= cap, got base={self.base} cap={self.cap}")

    def delay(self, failures: int) -> float:
        if failures < 1:
            raise ValueError(f"failures counts from 1, got {failures}")
        return min(self.cap, self.base * 2.0 ** min(failures - 1, 62))


@dataclass
class Retries:
    """Consecutive failures per object and the token of the one retry that may still run."""

    backoff: Backoff = field(default_factory=Backoff)
    _failures: dict[Key, int] = field(default_factory=dict)
    _tokens: dict[Key, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def failed(self, key: Key) -> tuple[float, int]:
        """Record a failure: (delay before the retry, its token)."""
        with self._lock:
            n = self._failures[key] = self._failures.get(key, 0) + 1
            token = self._tokens[key] = next(self._counter)  # unique across keys and resets
            return self.backoff.delay(n), token

    def succeeded(self, key: Key) -> None:
        with self._lock:
            self._failures.pop(key, None)
            self._tokens.pop(key, None)  # any pending retry is now moot

    def due(self, key: Key, token: int) -> bool:
        """Whether the retry with ``token`` is still the latest one for ``key``."""
        with self._lock:
            return self._tokens.get(key) == token

    def failures(self, key: Key) -> int:
        with self._lock:
            return self._failures.get(key, 0)
