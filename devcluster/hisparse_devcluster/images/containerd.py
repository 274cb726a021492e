"""A containerd of its own (Debian's package) to check the images: private root, state and socket, no
CRI plugin, started and stopped by the caller. It is how the tests prove that an archive loads the way
the node's containerd loads it (``ctr -n k8s.io images import``) and that a container of it runs.

    with PrivateContainerd.start(workdir) as ctd:
        refs = ctd.import_image(archive)
        print(ctd.run(refs[0], ["hisparse", "--help"]).stdout)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .. import _procs as procs
from ._run import ImageError, require

NAMESPACE: Final = "k8s.io"
"""The namespace the kubelet's CRI reads images from."""


@dataclass
class PrivateContainerd:
    root: Path
    state: Path
    socket: Path
    record: procs.ProcRecord
    popen: subprocess.Popen[bytes]

    @classmethod
    @contextlib.contextmanager
    def start(cls, workdir: Path, *, timeout: float = 30.0) -> Iterator[PrivateContainerd]:
        require("containerd", "ctr", step="containerd")
        workdir.mkdir(parents=True, exist_ok=True)
        root = workdir / "root"
        # A unix socket path must stay under 108 bytes: state and socket live in a short /tmp folder.
        state = Path(tempfile.mkdtemp(prefix="hsctd-", dir="/tmp"))
        socket = state / "containerd.sock"
        config = workdir / "config.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{root}"\nstate = "{state / "state"}"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{socket}"\n'
            f'[ttrpc]\n  address = "{socket}.ttrpc"\n'
            '[debug]\n  level = "info"\n')
        record, popen = procs.spawn("containerd", ["containerd", "--config", str(config)], workdir / "containerd.log",
                                    tie_to_parent=True)
        ctd = cls(root, state, socket, record, popen)
        try:
            deadline = time.monotonic() + timeout
            while ctd.ctr("version", check=False).returncode:
                if popen.poll() is not None or time.monotonic() > deadline:
                    raise ImageError("containerd", f"containerd did not come up; last lines of {record.log}:\n"
                                                   f"{procs.log_tail(record.log)}",
                                     "read the log; another containerd may hold the same root")
                time.sleep(0.2)
            yield ctd
        finally:
            ctd.stop()

    def ctr(self, *args: str, check: bool = True, timeout: float = 1800.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode:
            raise ImageError(f"ctr {args[0]}", f"ctr {' '.join(args[:3])} exited {proc.returncode}: "
                                               f"{proc.stderr.strip()[-2000:]}", f"read {self.record.log}")
        return proc

    def images(self) -> list[str]:
        return self.ctr("images", "list", "--quiet").stdout.split()

    def import_image(self, archive: str | Path) -> list[str]:
        """``ctr -n k8s.io images import``: the references it loaded."""
        before = set(self.images())
        self.ctr("images", "import", str(archive))
        return sorted(set(self.images()) - before) or self.images()

    def run(self, ref: str, argv: Sequence[str], *, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """A container of ``ref`` running ``argv`` (replacing the image's entrypoint and command), removed after."""
        return self.ctr("run", "--rm", ref, f"check-{uuid.uuid4().hex[:8]}", *argv, check=False, timeout=timeout)

    def stop(self) -> None:
        for task in self.ctr("tasks", "list", "--quiet", check=False, timeout=30).stdout.split():
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False, timeout=30)
            self.ctr("tasks", "delete", "--force", task, check=False, timeout=30)  # the shim exits with it
        for container in self.ctr("containers", "list", "--quiet", check=False, timeout=30).stdout.split():
            self.ctr("containers", "delete", container, check=False, timeout=30)
        procs.stop(self.record, grace_s=10.0, reap=self.popen.poll)
        # What containerd mounted (snapshots of running containers) goes before its folders do.
        for mount in reversed(_mounts_under(self.root, self.state)):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.state, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)


def _mounts_under(*dirs: Path) -> list[str]:
    prefixes = tuple(str(d.resolve()) + os.sep for d in dirs)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mount = line.split()[4].replace("\\040", " ")
            if mount.startswith(prefixes):
                out.append(mount)
    return out


def leftover_mounts(*dirs: Path) -> list[str]:
    """Mounts still under ``dirs`` (tests assert there are none after stop)."""
    return _mounts_under(*dirs)
