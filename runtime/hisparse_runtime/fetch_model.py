"""``hisparse-runtime fetch-model``: fill the model cache with one revision of an ``hf://`` model.

Runs as the operator's download Job (``SharedVolume`` cache) or as a serving pod's first init container
(``NodeCache``, ``PodEphemeral``). It resolves the revision to a commit once, downloads that commit's files with
``huggingface_hub.snapshot_download`` into ``--dest`` (``HF_ENDPOINT`` and ``HF_TOKEN`` as the library
reads them), and writes the marker (:data:`MODEL_MARKER_FILE`: source, revision, commit, every file with
its size) last, atomically. The marker is what "filled" means:

- a run that finds a marker for the same source and revision downloads nothing (a restarted Job or pod);
- a run interrupted before the marker resumes: files already complete are not fetched again;
- preflight refuses to start vLLM on a directory whose marker is missing or names another revision;
- pods of one node filling the same directory (``NodeCache``) take turns: a lock beside it, so the second
  finds the first one's marker and downloads nothing.

With ``--prune-under ROOT`` (the canary's download Job in a shared cache), once ``--dest`` is filled every
other revision directory under ``ROOT`` is removed except those named by ``--keep`` (the stable fleet's),
so a cache sized for two revisions never fills on the third.

Failures end with one line, ``<Reason>: <what failed and the fix>``, written to the termination log,
which the operator copies into the ``ModelReady`` condition.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from hisparse_runtime.engine import FETCH_EXIT_CODES, FETCH_SUBCOMMAND, MODEL_MARKER_FILE
from hisparse_runtime.engine.model import MODEL_SOURCE_PATTERN
from hisparse_runtime.engine.versions import RUNTIME_UID

log = logging.getLogger("hisparse.fetch_model")

TERMINATION_LOG: Final = Path("/dev/termination-log")

# Reasons: the first word of the termination message; the operator maps them onto ModelReady.
CREDENTIALS_REFUSED: Final = "CredentialsRefused"
NOT_FOUND: Final = "ModelNotFound"
DOWNLOAD_FAILED: Final = "DownloadFailed"
DISK_FULL: Final = "CacheFull"
NOT_WRITABLE: Final = "CacheNotWritable"

EXIT_CODES: Final = FETCH_EXIT_CODES
NOT_WRITABLE_ERRNOS: Final = (errno.EACCES, errno.EPERM, errno.EROFS)


class ModelMarker(BaseModel):
    """The completion marker of a cached model revision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(pattern=MODEL_SOURCE_PATTERN)
    """The ``hf://ORG/NAME`` source the files came from."""
    revision: str
    """The revision asked for (``spec.model.revision``)."""
    commit: str
    """The commit it resolved to when the cache was filled: every pod loads these bytes."""
    files: dict[str, int]
    """Every file of the commit, relative to the directory, with its size in bytes."""

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


class FetchError(Exception):
    """A download that cannot succeed as configured: ``reason`` names the kind, the message the fix."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True)
class FetchResult:
    marker: ModelMarker
    downloaded: bool
    """False when the cache already held this revision (nothing was requested from the hub)."""


def read_marker(dest: Path) -> ModelMarker | None:
    """The marker in ``dest``, or None when there is none (or it is unreadable: the fill did not finish)."""
    try:
        return ModelMarker.model_validate_json((dest / MODEL_MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def marker_problem(dest: Path, source: str, revision: str | None) -> str | None:
    """Why ``dest`` does not hold ``source`` at ``revision`` (None: it does, every file at its size)."""
    marker = read_marker(dest)
    if marker is None:
        return (f"{dest} has no readable {MODEL_MARKER_FILE}: the model cache was not filled (or its download "
                "did not finish); the fetch-model Job or init container fills it")
    if marker.source != source or (revision is not None and marker.revision != revision):
        return (f"{dest} holds {marker.source} at revision {marker.revision} (commit {marker.commit}) but the "
                f"settings declare {source} at revision {revision}: the cache directory does not match the spec")
    for name, size in marker.files.items():
        path = dest / name
        try:
            found = path.stat().st_size
        except OSError:
            return f"{path} is listed in {MODEL_MARKER_FILE} but missing: the cache was changed after it was filled"
        if found != size:
            return f"{path} is {found} bytes but was {size} when the cache was filled: the cache was changed"
    return None


def _repo(source: str) -> str:
    if not source.startswith("hf://"):
        raise FetchError(DOWNLOAD_FAILED, f"fetch-model downloads hf:// sources, not {source!r}: s3:// is streamed "
                         "by vLLM and pvc:// is mounted as it is")
    return source.removeprefix("hf://")


def _classify(exc: Exception, repo: str, revision: str) -> FetchError:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token = "HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "no HF_TOKEN is set"
    if isinstance(exc, RevisionNotFoundError):
        return FetchError(NOT_FOUND, f"revision {revision!r} of {repo} does not exist: set spec.model.revision to "
                          "a commit sha of the repository")
    if isinstance(exc, GatedRepoError):
        return FetchError(CREDENTIALS_REFUSED, f"{repo} is gated and the token has no access ({token}): accept the "
                          "model's terms with the token's account, or use a token that has")
    if isinstance(exc, RepositoryNotFoundError):
        return FetchError(NOT_FOUND, f"{repo} was not found, or is private and the token cannot read it ({token}): "
                          "check spec.model.source and the HF_TOKEN key of spec.model.credentials.secretName")
    if isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code in (401, 403):
        return FetchError(CREDENTIALS_REFUSED, f"the hub refused the credentials for {repo} "
                          f"(HTTP {exc.response.status_code}, {token}): put a valid token under the key HF_TOKEN "
                          "of the Secret named by spec.model.credentials.secretName")
    if isinstance(exc, OSError) and exc.errno in NOT_WRITABLE_ERRNOS:
        return _not_writable(exc)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return FetchError(DISK_FULL, f"the model cache is full while downloading {repo}: raise spec.model.sizeGiB "
                          "(or spec.model.cache.sizeGiB) to the checkpoint's size")
    if isinstance(exc, LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, Exception) and cause is not exc:
            return _classify(cause, repo, revision)
    return FetchError(DOWNLOAD_FAILED, f"downloading {repo} at {revision} failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}; the Job retries, resuming from the files "
                      "already downloaded")


def _not_writable(exc: OSError) -> FetchError:
    return FetchError(NOT_WRITABLE, f"cannot write {exc.filename or 'the model cache'} as UID {os.getuid()} "
                      f"({os.strerror(exc.errno or errno.EACCES)}): with cache.mode NodeCache, make "
                      f"spec.model.cache.nodePath on this node a directory owned by (or writable for) UID {RUNTIME_UID}, "
                      "as the model-artifacts guide's node setup does; a SharedVolume's storage must honour the "
                      "pod's fsGroup")


@contextlib.contextmanager
def _turn(dest: Path) -> Iterator[None]:
    """Hold the lock of ``dest`` (a file beside it): one fill of a directory at a time on a node."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(dest.parent / f".{dest.name}.lock", os.O_CREAT | os.O_RDWR, 0o660)
    except OSError as exc:
        if exc.errno in NOT_WRITABLE_ERRNOS:
            raise _not_writable(exc) from exc
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def fetch(source: str, revision: str, dest: Path, *, max_workers: int = 8) -> FetchResult:
    """Fill ``dest`` with ``source`` at ``revision`` unless its marker says it holds them already."""
    repo = _repo(source)
    marker = read_marker(dest)
    if marker is not None and marker.source == source and marker.revision == revision:
        return FetchResult(marker, downloaded=False)
    with _turn(dest):
        return _fill(source, repo, revision, dest, max_workers)


def _fill(source: str, repo: str, revision: str, dest: Path, max_workers: int) -> FetchResult:
    marker = read_marker(dest)  # again, under the lock: another pod of this node may have filled it
    if marker is not None and marker.source == source and marker.revision == revision:
        return FetchResult(marker, downloaded=False)
    from huggingface_hub import HfApi, snapshot_download

    try:
        # Resolve the revision once: a branch moving during the download must not mix two commits.
        commit = HfApi().model_info(repo, revision=revision).sha
        if not commit:
            raise FetchError(DOWNLOAD_FAILED, f"the hub gave no commit for {repo} at {revision}")
        dest.mkdir(parents=True, exist_ok=True)
        snapshot_download(repo, revision=commit, local_dir=dest, max_workers=max_workers)
    except FetchError:
        raise
    except Exception as exc:  # noqa: BLE001 (every failure becomes one reason and message)
        raise _classify(exc, repo, revision) from exc
    files = {p.relative_to(dest).as_posix(): p.stat().st_size for p in sorted(dest.rglob("*"))
             if p.is_file() and not p.relative_to(dest).as_posix().startswith(".cache/") and p.name != MODEL_MARKER_FILE}
    marker = ModelMarker(source=source, revision=revision, commit=commit, files=files)
    tmp = dest / f".{MODEL_MARKER_FILE}.tmp"
    tmp.write_text(marker.model_dump_json(indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, dest / MODEL_MARKER_FILE)  # atomic: a marker is either absent or complete
    return FetchResult(marker, downloaded=True)


def revision_dirs(root: Path) -> list[Path]:
    """The revision directories under ``root``: each holds a marker or an unfinished download (the hub
    client's ``.cache`` without a marker)."""
    found = {p.parent for p in root.rglob(MODEL_MARKER_FILE)}
    found |= {p.parent for p in root.rglob(".cache") if p.is_dir() and (p / "huggingface").is_dir()}
    return sorted(found)


def prune(root: Path, keep: list[Path]) -> list[Path]:
    """Remove every revision directory under ``root`` but those in ``keep`` (and their parents): the
    removed ones, in order."""
    kept = {k.resolve() for k in keep}
    removed = []
    for rev in revision_dirs(root):
        r = rev.resolve()
        if r in kept or any(r in k.parents for k in kept) or any(k in r.parents for k in kept):
            continue
        shutil.rmtree(rev)
        (rev.parent / f".{rev.name}.lock").unlink(missing_ok=True)  # the fill's lock (see _turn)
        removed.append(rev)
        parent = rev.parent  # empty model directories go too
        while parent != root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return removed


def add_parser(sub: Any) -> None:
    p = sub.add_parser(FETCH_SUBCOMMAND, help="download one revision of an hf:// model into the model cache",
                       description=__doc__.splitlines()[0])
    p.add_argument("--source", required=True, help="hf://ORG/NAME")
    p.add_argument("--revision", required=True, help="commit sha (or tag/branch, resolved once)")
    p.add_argument("--dest", required=True, type=Path, help="directory of this revision in the cache")
    p.add_argument("--max-workers", type=int, default=8, help="parallel file downloads (default 8)")
    p.add_argument("--prune-under", type=Path, default=None,
                   help="once --dest is filled, remove every other revision directory under this one but --keep's")
    p.add_argument("--keep", type=Path, action="append", default=[],
                   help="a revision directory --prune-under keeps (repeatable): the serving fleet's")
    p.add_argument("--termination-log", type=Path, default=TERMINATION_LOG,
                   help="where the one-line failure reason goes (the pod's termination message)")


def _terminate(path: Path, line: str) -> None:
    try:
        path.write_text(line + "\n", encoding="utf-8")
    except OSError:
        pass  # outside a pod; the line is on stderr as well


def run(args: argparse.Namespace) -> int:
    try:
        result = fetch(args.source, args.revision, args.dest, max_workers=args.max_workers)
        m = result.marker
        verb = "downloaded" if result.downloaded else "already cached"
        print(f"{m.source} at {m.revision} (commit {m.commit}): {verb}, {len(m.files)} files, {m.bytes} bytes in {args.dest}")
        if args.prune_under is not None:
            keep = [args.dest, *args.keep]
            try:
                removed = prune(args.prune_under, keep)
            except OSError as exc:  # one reason line, as for the fill (the Job retries; the files stay)
                raise (_not_writable(exc) if exc.errno in NOT_WRITABLE_ERRNOS else FetchError(
                    DOWNLOAD_FAILED, f"removing older revisions under {args.prune_under} failed: {exc}")) from exc
            print(f"kept {', '.join(str(k) for k in keep)}; removed {len(removed)} other revision(s)"
                  + (f": {', '.join(str(r) for r in removed)}" if removed else ""))
    except FetchError as exc:
        line = f"{exc.reason}: {exc}"
        print(line, file=sys.stderr)
        _terminate(args.termination_log, line)
        return EXIT_CODES[exc.reason]
    return 0
