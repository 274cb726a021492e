"""Start and stop control-plane processes by PID, each in its own process group.

Each server runs in a new POSIX session (so its process group id is its PID) with
output in a log file. A PID is recorded with the process start time from
``/proc``, so a later ``stop`` from another Python process never signals an
unrelated process that happens to reuse the PID.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# Loaded in the parent: the child between fork and exec should do as little as possible.
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ProcRecord:
    """What is needed to find, restart and stop one server process."""

    name: str
    pid: int
    start_ticks: int
    """Field 22 of /proc/PID/stat: distinguishes this process from a later one with the same PID."""
    argv: tuple[str, ...]
    log: str

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["argv"] = list(self.argv)
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> ProcRecord:
        return cls(
            name=str(d["name"]),
            pid=int(d["pid"]),  # type: ignore[call-overload]
            start_ticks=int(d["start_ticks"]),  # type: ignore[call-overload]
            argv=tuple(d["argv"]),  # type: ignore[arg-type]
            log=str(d["log"]),
        )


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may hold spaces)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int:
    fields = _stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    return int(fields[19])  # field 22 overall; fields[0] is field 3


def is_running(rec: ProcRecord) -> bool:
    """True while the recorded process exists and is not a zombie."""
    fields = _stat_fields(rec.pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == rec.start_ticks


def _die_with_parent() -> None:
    # Runs in the child before exec: if the thread that started the cluster
    # dies (even by SIGKILL), the kernel sends SIGTERM, so test runs leak nothing.
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    tie_to_parent: bool,
    env: dict[str, str] | None = None,
) -> tuple[ProcRecord, subprocess.Popen[bytes]]:
    """Start ``argv`` in a new POSIX session, appending stdout and stderr to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
            preexec_fn=_die_with_parent if tie_to_parent else None,
        )
    try:
        ticks = start_ticks(proc.pid)
    except ProcessLookupError:
        ticks = -1  # already gone; callers see it as not running and read the log
    return ProcRecord(name, proc.pid, ticks, tuple(argv), str(log)), proc


def stop(
    rec: ProcRecord,
    *,
    grace_s: float = 10.0,
    reap: Callable[[], object] | None = None,
) -> None:
    """SIGTERM the process group, then SIGKILL it after ``grace_s``; waits until gone.

    ``reap`` (e.g. ``Popen.poll``) collects the exit status when this Python
    process is the parent, so the child does not linger as a zombie.
    """

    def alive() -> bool:
        if reap is not None:
            reap()
        if is_running(rec):
            return True
        if reap is not None:
            reap()  # it may have become a zombie after the first reap: collect it now
        # Children left in the group after the leader exited; if the PID itself
        # shows up, it was reused by an unrelated session leader: leave it alone.
        members = group_members(rec.pid)
        return bool(members) and rec.pid not in members

    if not alive():
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(rec.pid, sig)  # pgid == pid: started with start_new_session
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not alive():
                return
            time.sleep(0.05)
    raise RuntimeError(f"{rec.name} (pid {rec.pid}) survived SIGKILL; see {rec.log}")


def log_tail(path: str | Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def group_members(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes in process group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found
