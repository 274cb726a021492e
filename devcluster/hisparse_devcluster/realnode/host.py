"""What the real node changes on the host, made and undone here: its network namespace, its cgroup
root, mounts below its own directories, and processes that escaped their process group.

Each function acts only on names derived from one node instance (:class:`.plan.Names`), so it
never touches another cluster's node or anything else on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import plan
from .plan import NODE_IP, Names

CGROUP_FS = Path("/sys/fs/cgroup")


class HostError(RuntimeError):
    """A host command failed; the message holds the command and its output."""


def run(*argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and res.returncode != 0:
        raise HostError(f"{' '.join(argv)} exited {res.returncode}: {(res.stderr or res.stdout).strip()}")
    return res


# ---- what the host offers -----------------------------------------------------------------------------


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones and the v2 ``unified``)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] in ("cgroup", "cgroup2"):
            found.append(Path(fields[1].replace("\\040", " ")))
    return found


def cgroup_v1_hybrid() -> bool:
    """True on a cgroup v1 (or hybrid) host: the layout the node's configuration is written for."""
    return (CGROUP_FS / "memory" / "memory.limit_in_bytes").exists()


# ---- network namespace ------------------------------------------------------------------------------


def netns_exists(names: Names) -> bool:
    return names.netns_path.exists()


def create_netns(names: Names) -> None:
    """The node's namespace: loopback up, a veth pair (both ends inside) with the node IP, and the
    routes of :func:`.plan.netns_routes`. All of it goes with the namespace."""
    ns = names.netns
    a, b = names.veth
    run("ip", "netns", "add", ns)
    run("ip", "-n", ns, "link", "set", "lo", "up")
    run("ip", "-n", ns, "link", "add", a, "type", "veth", "peer", "name", b)
    run("ip", "-n", ns, "addr", "add", f"{NODE_IP}/32", "dev", a)
    run("ip", "-n", ns, "link", "set", a, "up")
    run("ip", "-n", ns, "link", "set", b, "up")
    for route in plan.netns_routes(names):
        run("ip", "-n", ns, "route", "add", *route)
    # Pods' packets to Services are routed through the namespace (DNAT to the node IP or a pod).
    run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")


def delete_netns(names: Names) -> None:
    if netns_exists(names):
        run("ip", "netns", "delete", names.netns)


def host_links(names: Names) -> list[str]:
    """Links in the host's namespace that carry this instance's names (there should be none)."""
    out = run("ip", "-o", "link", "show", check=False).stdout
    mine = (*names.veth, names.bridge)
    return [ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines()
            if any(f" {n}:" in ln or f" {n}@" in ln for n in mine)]


# ---- cgroups ----------------------------------------------------------------------------------------


def create_cgroup_root(names: Names) -> None:
    """The kubelet's ``cgroupRoot`` in every v1 hierarchy; cpuset needs its cpus and mems set."""
    rel = names.cgroup_root.lstrip("/")
    for h in cgroup_hierarchies():
        d = h / rel
        d.mkdir(exist_ok=True)
        if (h / "cpuset.cpus").exists():
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((h / f).read_text())


def cgroup_dirs(names: Names) -> list[Path]:
    rel = names.cgroup_root.lstrip("/")
    return [h / rel for h in cgroup_hierarchies() if (h / rel).is_dir()]


def _walk_dirs(root: Path) -> list[Path]:
    """Every directory under ``root``; ones removed while walking are skipped (cgroups of exiting containers)."""
    return [Path(d) for d, _, _ in os.walk(root, onerror=lambda _e: None)]


def cgroup_pids(names: Names) -> set[int]:
    """Every process in the node's cgroups (containers, and whatever else landed there)."""
    pids: set[int] = set()
    for root in cgroup_dirs(names):
        for procs in (d / "cgroup.procs" for d in _walk_dirs(root)):
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except (OSError, ValueError):
                continue
    return pids


def remove_cgroup_root(names: Names, timeout: float = 10.0) -> list[Path]:
    """Remove the node's cgroup trees, deepest first; returns what could not be removed."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for root in cgroup_dirs(names):
            for d in sorted((p for p in _walk_dirs(root) if p != root), key=lambda p: -len(p.parts)) + [root]:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# ---- processes ----------------------------------------------------------------------------------------


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def shim_pids(names: Names) -> set[int]:
    """containerd shims serving this node's containerd: they are started with its socket's path."""
    sock = str(names.containerd_sock)
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            argv = _cmdline(int(entry.name))
            if argv and "containerd-shim" in Path(argv[0]).name and sock in argv:
                found.add(int(entry.name))
    return found


def netns_pids(names: Names) -> set[int]:
    """Processes whose network namespace is the node's."""
    try:
        target = os.stat(names.netns_path)
    except FileNotFoundError:
        return set()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            found.add(int(entry.name))
    return found


def kill_all(pids: set[int], sig: signal.Signals = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    """Wait until none of ``pids`` is alive (zombies count as gone); returns those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        alive = {p for p in pids if _alive(p)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rindex(")") + 2:].split()[0] != "Z"


# ---- container log links --------------------------------------------------------------------------

CONTAINER_LOG_LINKS = Path("/var/log/containers")
"""Where every kubelet links its containers' logs (a fixed path in the kubelet, not configurable)."""


def container_log_links(names: Names) -> list[Path]:
    """This node's links in :data:`CONTAINER_LOG_LINKS` (they point into its ``podLogsDir``)."""
    if not CONTAINER_LOG_LINKS.is_dir():
        return []
    mine = str(names.pod_logs) + "/"
    return [p for p in CONTAINER_LOG_LINKS.iterdir() if p.is_symlink() and os.readlink(p).startswith(mine)]


# ---- mounts -------------------------------------------------------------------------------------------


def mounts_under(paths: tuple[Path, ...]) -> list[Path]:
    """Mount points below any of ``paths`` (from /proc/self/mountinfo), deepest first."""
    roots = [str(p.resolve()) if p.exists() else str(p) for p in paths]
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == r or point.startswith(r + "/") for r in roots):
            found.append(Path(point))
    return sorted(set(found), key=lambda p: -len(p.parts))


def unmount_all(paths: tuple[Path, ...]) -> list[Path]:
    """Unmount everything below ``paths`` (lazily, deepest first); returns what is still mounted."""
    for _ in range(5):
        points = mounts_under(paths)
        if not points:
            return []
        for point in points:
            run("umount", "-l", str(point), check=False)
    return mounts_under(paths)


def remove_tree(path: Path) -> None:
    """Remove ``path`` unless something is still mounted below it (never delete through a mount)."""
    if path.exists() and not mounts_under((path,)):
        shutil.rmtree(path, ignore_errors=True)
