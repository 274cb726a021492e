"""The real node's image store, kept across clusters on one machine.

A real node's containerd normally lives and dies with its cluster, so every new cluster imports every image
again: minutes for the ~10 GiB CPU runtime image (containerd writes the layers, then unpacks them). Here the
node's containerd root (content, unpacked snapshots, image records) is kept under
``${HISPARSE_CACHE}/node-images/containerd-<version>``, so an image that did not change is imported once per
machine, as a user's node keeps the images it pulled.

- **One node at a time.** A node claims the store by writing its state file's path into ``owner.json``; a
  node that finds the store held by a live node uses a root of its own, as before.
- **Images only.** Before its containerd stops, the holder deletes every task and container (pods, sandboxes)
  through containerd, and images not used for :data:`KEEP_UNUSED_S` (or never recorded, such as tags made
  with ``ctr images tag``), letting containerd collect what they alone held. A store whose holder died, or
  whose clean-up failed, is wiped at the next claim, never trusted.
- **Which images it holds** is containerd's own answer (``ctr images check``: the manifest and whether it is
  unpacked), compared with the archive's manifest or config digest; ``uses.json`` only says when an image
  was last used.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from .._state import cache_home
from . import host

KEEP_UNUSED_S: Final = 3 * 24 * 3600
"""An image no node used for this long is removed from the store when a node leaves it."""
DISABLE_ENV: Final = "HISPARSE_NODE_IMAGE_STORE"
"""Set to ``0`` for a node whose containerd root is its own (every image imported afresh)."""
OWNER_FILE: Final = "owner.json"
USES_FILE: Final = "uses.json"
CRI_STATE_DIRS: Final = ("io.containerd.grpc.v1.cri/containers", "io.containerd.grpc.v1.cri/sandboxes")
"""Per-container folders the CRI plugin keeps in the root; they go with the containers."""


def containerd_version() -> str:
    """``1.6.20~ds1`` from ``containerd --version`` (its metadata format is the store's key)."""
    out = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=False, timeout=30).stdout
    parts = out.split()
    return parts[2] if len(parts) >= 3 else "unknown"


def store_dir() -> Path:
    return cache_home() / "node-images" / f"containerd-{containerd_version()}"


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") != "0"


@contextlib.contextmanager
def _locked(base: Path) -> Iterator[None]:
    base.parent.mkdir(parents=True, exist_ok=True)
    with open(base.parent / f"{base.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _owner(base: Path) -> str | None:
    try:
        return str(json.loads((base / OWNER_FILE).read_text())["state"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def claim(state: Path, *, alive: Callable[[Path], bool], base: Path | None = None) -> Path | None:
    """Take the store for the node whose state file is ``state``; returns the containerd root to use, or
    None when the store is held by a live node (or turned off). A store left by a dead holder is wiped."""
    if not enabled():
        return None
    base = base or store_dir()
    with _locked(base):
        owner = _owner(base)
        if owner is not None and owner != str(state):
            if alive(Path(owner)):
                return None
            wipe(base)
        elif owner == str(state):
            wipe(base)  # this node's own earlier start died before its teardown
        (base / "root").mkdir(parents=True, exist_ok=True)
        (base / OWNER_FILE).write_text(json.dumps({"state": str(state), "since": time.time()}) + "\n")
    return base / "root"


def holder_root(state: Path, root: Path) -> Path | None:
    """The store's base folder when ``root`` is the store's root held by ``state``; else None."""
    base = root.parent
    return base if root.name == "root" and _owner(base) == str(state) else None


def release(base: Path, state: Path, *, clean: bool) -> None:
    """Give the store back once the holder's containerd stopped: CRI's per-container folders go; a store not
    left clean is wiped."""
    with _locked(base):
        if _owner(base) != str(state):
            return
        if clean:
            for d in CRI_STATE_DIRS:
                target = base / "root" / d
                if target.is_dir():
                    for child in target.iterdir():
                        host.remove_tree(child)
        else:
            wipe(base)
        (base / OWNER_FILE).unlink(missing_ok=True)


def wipe(base: Path) -> None:
    """Remove the store's contents (never through a mount)."""
    root = base / "root"
    if host.mounts_under((root,)):
        host.unmount_all((root,))
    host.remove_tree(root)
    (base / USES_FILE).unlink(missing_ok=True)


# ---- what the store holds -------------------------------------------------------------------------------


def archive_digests(archive: Path) -> dict[str, tuple[str, str]]:
    """Image name -> ("config" | "manifest", digest) for a docker-archive (its config's digest) or an OCI
    archive (its manifest's digest): what containerd's record of the imported image must match."""
    from .node import _normalize

    out: dict[str, tuple[str, str]] = {}
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        if "manifest.json" in names:
            f = tar.extractfile("manifest.json")
            assert f is not None
            for m in json.load(f):
                config = str(m.get("Config", ""))
                digest = "sha256:" + Path(config).name.removesuffix(".json")
                for t in m.get("RepoTags") or []:
                    out[_normalize(t)] = ("config", digest)
        elif "index.json" in names:
            f = tar.extractfile("index.json")
            assert f is not None
            for m in json.load(f).get("manifests", []):
                a = m.get("annotations") or {}
                name = a.get("io.containerd.image.name") or a.get("org.opencontainers.image.ref.name")
                if name:
                    out[_normalize(name)] = ("manifest", str(m["digest"]))
    return out


def held(ctr: Callable[..., subprocess.CompletedProcess[str]], wanted: dict[str, tuple[str, str]]) -> bool:
    """Whether containerd holds every image of ``wanted``, complete, unpacked, with the digests given."""
    if not wanted:
        return False
    rows = {}
    for line in ctr("images", "check", *[f"name=={n}" for n in wanted]).stdout.splitlines()[1:]:
        tokens = line.split()
        if len(tokens) >= 4:
            rows[tokens[0]] = (tokens[2], tokens[-1] == "true", "complete" in tokens)
    for name, (kind, digest) in wanted.items():
        row = rows.get(name)
        if row is None or not row[1] or not row[2]:
            return False
        manifest = row[0]
        if kind == "manifest" and manifest != digest:
            return False
        if kind == "config":
            try:
                config = json.loads(ctr("content", "get", manifest).stdout).get("config", {}).get("digest")
            except ValueError:
                return False
            if config != digest:
                return False
    return True


def record_use(base: Path, names: list[str]) -> None:
    with _locked(base):
        uses = _uses(base)
        now = time.time()
        uses.update({n: now for n in names})
        (base / USES_FILE).write_text(json.dumps(uses, indent=1, sort_keys=True) + "\n")


def _uses(base: Path) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads((base / USES_FILE).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def stale(base: Path, images: list[str], *, now: float | None = None) -> list[str]:
    """The images of ``images`` to remove when a node leaves the store: never recorded, or unused too long."""
    now = time.time() if now is None else now
    uses = _uses(base)
    return [i for i in images if now - uses.get(i, 0.0) > KEEP_UNUSED_S]


def remove_unused(base: Path, ctr: Callable[..., subprocess.CompletedProcess[str]], images: list[str]) -> None:
    """Remove the stale images and let containerd collect their content and snapshots at once."""
    gone = stale(base, images)
    if gone:
        ctr("images", "rm", "--sync", *gone)
    with _locked(base):
        uses = {k: v for k, v in _uses(base).items() if k not in gone}
        (base / USES_FILE).write_text(json.dumps(uses, indent=1, sort_keys=True) + "\n")


__all__ = ["KEEP_UNUSED_S", "archive_digests", "claim", "held", "holder_root", "record_use", "release",
           "remove_unused", "stale", "store_dir", "wipe"]
