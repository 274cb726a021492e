"""The reconcile work queue on real threads: coalescing, and a stop that does not run the backlog."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hisparse_operator.controller.workqueue import Key, ReconcileQueue

A, B, C, LAST = ("ns", "a"), ("ns", "b"), ("ns", "c"), ("ns", "last")
WAIT = 10.0  # generous: only a broken queue ever waits this long


class Recorder:
    """Work that records its keys; the first call for a key in ``hold`` blocks until :attr:`release`."""

    def __init__(self, *hold: Key, fail: Key | None = None) -> None:
        self.calls: list[Key] = []
        self.hold, self.fail = set(hold), fail
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, key: Key) -> None:
        self.calls.append(key)
        if key in self.hold:
            self.hold.discard(key)
            self.entered.set()
            assert self.release.wait(WAIT)
        if key == self.fail:
            raise RuntimeError("apiserver unavailable")


def wait_until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_requests_while_running_become_one_more_pass_and_queued_ones_one_run() -> None:
    work = Recorder(A)
    q = ReconcileQueue(work, workers=1)
    q.request(A)
    assert work.entered.wait(WAIT)
    for _ in range(5):
        assert q.request(A) and q.request(B)  # A running: marked dirty; B queued once
    q.request(LAST)  # behind B on the one worker: its run marks the end
    work.release.set()
    wait_until(lambda: LAST in work.calls)
    q.stop()
    q.join()
    assert work.calls.count(A) == 2, work.calls  # the first pass and exactly one more
    assert work.calls.count(B) == 1, work.calls


def test_stop_drops_the_queue_and_a_running_key_does_not_go_round_again() -> None:
    work = Recorder(A)
    q = ReconcileQueue(work, workers=1)
    q.request(A)
    assert work.entered.wait(WAIT)
    q.request(B)
    q.request(C)
    q.request(A)  # dirty: would go round again
    dropped, running = q.stop()
    assert (dropped, running) == (2, {A})
    assert not work.release.is_set()  # stop returned while A was still in flight: it does not wait for it
    assert not q.request(B) and q.stopping  # refused once stopping
    work.release.set()
    q.join()
    assert work.calls == [A], work.calls  # B and C never ran; A ran once


def test_work_that_raises_does_not_stop_the_queue() -> None:
    work = Recorder(fail=A)
    q = ReconcileQueue(work, workers=1)
    q.request(A)
    q.request(B)
    wait_until(lambda: B in work.calls)
    q.stop()
    q.join()
    assert work.calls == [A, B]
    assert q.request(A) is False
