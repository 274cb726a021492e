"""A one-layer image archive (docker-archive format) from a directory: the node's own images only.

The pause container and CoreDNS are single static binaries, and the e2e tests need nothing more than
busybox; for these a layer is a tar of a small root filesystem, and ``ctr images import`` loads the
archive into the node's containerd. The project's real images are built elsewhere (from their
Dockerfiles); this is not an image builder.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

__all__ = ["write_image_archive"]

# Fixed timestamps and owners: the same inputs give the same archive, hence the same image id.
_EPOCH = 0


def _layer(rootfs: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(rootfs.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(rootfs)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = _EPOCH
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def write_image_archive(
    out: Path,
    ref: str,
    rootfs: Path,
    *,
    entrypoint: list[str],
    cmd: list[str] | None = None,
    user: str = "",
    env: list[str] | None = None,
) -> Path:
    """Write ``rootfs`` as a one-layer linux/amd64 image named ``ref`` to the tar ``out``."""
    layer = _layer(rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": entrypoint,
            "Cmd": cmd,
            "User": user,
            "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "hisparse devcluster"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((config_name, config_bytes), (layer_name, layer),
                           ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = _EPOCH
            tar.addfile(info, io.BytesIO(data))
    return out
