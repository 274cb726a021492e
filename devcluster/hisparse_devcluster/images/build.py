"""Builds the plan of :mod:`._spec` with buildah, with no registry, and exports each product image as a
docker-archive tar that ``ctr -n k8s.io images import`` loads.

Everything lives under ``${HISPARSE_CACHE:-~/.cache/hisparse}/images/``:

- ``storage/``, ``run/``: buildah's image store (overlay driver, chroot isolation, as root). The bases
  stay there, so a change to the project's sources rebuilds only the small top layer of an image.
- ``wheels/<hash>/``: the wheelhouse, one wheel per line of the lock (``pip download`` through the host's
  pip, so its cache serves what ``scripts/setup`` already fetched). Image builds read it over a bind mount
  with ``--no-index``: no network, exactly the lock's versions, nothing left in the image.
- ``<name>-<hash>.tar`` and ``<name>-<hash>.json``: a product image's archive and its record (reference,
  size, build and export seconds). A record whose hash matches the current inputs is the cache hit.
- ``logs/``: one log per step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from .._state import cache_home
from . import _spec as spec
from ._run import ImageError, heavy_lock, output, require, run

Echo = Callable[[str], None]
DRIVER_ENV: Final = "HISPARSE_BUILDAH_DRIVER"
DEFAULT_DRIVER: Final = "overlay"
"""overlay shares the 11 GB layer of the CPU runtime between its base and the image; vfs copies it whole
for every image and container (set HISPARSE_BUILDAH_DRIVER=vfs where overlay cannot mount)."""
WHEELHOUSE_MOUNT: Final = "/mnt/hisparse-wheelhouse"
PIP_MOUNT: Final = "/mnt/hisparse-pip"
PYTHON_VERSION_LABEL: Final = "dev.hisparse.python-version"


def cache_root() -> Path:
    return cache_home() / "images"


@dataclass(frozen=True)
class BuiltImage:
    """A product image ready to load: ``archive`` holds ``ref``."""

    name: str
    ref: str
    archive: str
    input_hash: str
    archive_bytes: int
    build_s: float
    export_s: float
    built_at: str

    @classmethod
    def load(cls, path: Path) -> BuiltImage | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


@dataclass(frozen=True)
class Store:
    """buildah with this cache's storage."""

    root: Path

    @property
    def driver(self) -> str:
        return os.environ.get(DRIVER_ENV) or DEFAULT_DRIVER

    def buildah(self, *args: str) -> list[str]:
        return ["buildah", "--root", str(self.root / "storage"), "--runroot", str(self.root / "run"),
                "--storage-driver", self.driver, *args]

    @property
    def env(self) -> dict[str, str]:
        return {"BUILDAH_ISOLATION": "chroot", "TMPDIR": str(self.tmp)}

    @property
    def tmp(self) -> Path:
        path = self.root / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def log(self, step: str) -> Path:
        return self.root / "logs" / f"{step}.log"

    def has_image(self, ref: str) -> bool:
        return subprocess.run(self.buildah("inspect", "--type", "image", ref), capture_output=True,
                              env={**os.environ, **self.env}, check=False).returncode == 0

    def inspect(self, ref: str, step: str) -> dict[str, object]:
        data: dict[str, object] = json.loads(output(step, self.buildah("inspect", "--type", "image", ref),
                                                    env=self.env, fix="rebuild: hisparse dev images --rebuild"))
        return data

    def label(self, ref: str, key: str, step: str) -> str:
        config = self.inspect(ref, step).get("Docker") or {}
        labels = ((config.get("config") or {}).get("Labels") or {}) if isinstance(config, dict) else {}
        return str(labels.get(key, ""))

    def archive(self, name: str, input_hash: str) -> Path:
        return self.root / f"{name}-{input_hash}.tar"

    def record(self, name: str, input_hash: str) -> Path:
        return self.root / f"{name}-{input_hash}.json"


# ---- the wheelhouse --------------------------------------------------------------------------------------

def ensure_wheelhouse(store: Store, echo: Echo) -> Path:
    """``wheels/<hash>/``: one wheel per pin of the lock and the build requirements, plus a pip.conf that
    points builds at it (``wheels/<hash>.pip/``)."""
    digest = spec.wheelhouse_hash()
    wheels = store.root / "wheels" / digest
    pipdir = store.root / "wheels" / f"{digest}.pip"
    if not (wheels / ".complete").exists():
        step = "wheelhouse"
        echo(f"images: downloading the wheelhouse for {spec.LOCK.name} (once per lock; pip's cache serves what "
             f"scripts/setup fetched) ...")
        partial = wheels.with_name(f"{digest}.partial")
        partial.mkdir(parents=True, exist_ok=True)
        # An interrupted download resumes with what is missing only (pip would ask the index about every pin).
        missing = _missing_pins(partial)
        seconds = 0.0
        if missing:
            pins = partial / "missing.txt"
            pins.write_text("".join(f"{name}=={version}\n" for name, version in missing))
            seconds = run(step, [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest",
                                 str(partial), "-r", str(pins)], store.log(step),
                          fix="check that PyPI is reachable (pip's proxy and certificate settings), then run it again")
            pins.unlink()
        if still := _missing_pins(partial):
            raise ImageError(step, f"pip downloaded no file for {still[:5]}{' ...' if len(still) > 5 else ''}",
                             f"check {spec.LOCK.name} and {spec.BUILD_REQUIREMENTS.name} against PyPI")
        (partial / ".complete").write_text(f"{seconds:.1f}\n")
        shutil.rmtree(wheels, ignore_errors=True)
        partial.rename(wheels)
        for other in wheels.parent.iterdir():  # wheelhouses of earlier locks
            if not other.name.startswith(digest):
                shutil.rmtree(other, ignore_errors=True)
        echo(f"images: wheelhouse ready in {seconds:.0f}s ({_du(wheels) / 2**30:.1f} GiB)")
    pipdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spec.LOCK, pipdir / "constraints.txt")
    (pipdir / "pip.conf").write_text(
        "# Written by hisparse_devcluster.images: image builds install from the local wheelhouse only.\n"
        f"[global]\nno-index = true\nfind-links = {WHEELHOUSE_MOUNT}\n"
        f"constraint = {PIP_MOUNT}/constraints.txt\n")
    return wheels


def _missing_pins(folder: Path) -> list[tuple[str, str]]:
    """Pins of the lock and the build requirements with no wheel or sdist in ``folder`` (names as pip
    normalizes them in file names)."""
    def norm(text: str) -> str:
        return re.sub(r"[-_.]+", "_", text).lower()

    have = {norm(p.name) for p in folder.iterdir()}
    pins = [*spec.lock_pins().items(), *spec.pins(spec.BUILD_REQUIREMENTS).items()]
    return [(name, version) for name, version in pins
            if not any(f.startswith(f"{norm(name)}_{norm(version)}_") or f == f"{norm(name)}_{norm(version)}_tar_gz"
                       for f in have)]


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- targets ---------------------------------------------------------------------------------------------

def _build_debian(store: Store, target: spec.Target, echo: Echo) -> float:
    base = target.spec
    assert isinstance(base, spec.DebianBase)
    step = f"base {base.name}"
    echo(f"images: {step}: mmdebstrap {base.suite} minbase with {', '.join(base.packages)} "
         f"(stands in for {base.stands_in_for}) ...")
    fix_net = f"check that {base.mirrors[0]} is reachable, then run it again"
    with tempfile.TemporaryDirectory(dir=store.tmp) as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        seconds = run(step, ["mmdebstrap", "--variant=minbase", "--mode=root", f"--include={','.join(base.packages)}",
                             "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
                             "--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
                             "--aptopt=Acquire::Retries \"3\"", base.suite, str(rootfs), *base.mirrors],
                      store.log(f"base-{base.name}"), fix=fix_net)
        log = store.log(f"base-{base.name}")
        fix = "read the log; remove the cache's storage/ folder if it is damaged, then run it again"
        ctr = output(step, store.buildah("from", "scratch"), env=store.env, fix=fix).strip()
        try:
            seconds += run(step, store.buildah("add", ctr, str(rootfs), "/"), log, env=store.env, fix=fix)
            config = ["config", "--label", f"dev.hisparse.stands-in-for={base.stands_in_for}"]
            if "python3" in base.packages:  # a Python base: its CPython release is a label Dockerfiles read
                version = output(step, store.buildah("run", ctr, "--", "python3", "-c",
                                                     "import platform; print(platform.python_version())"),
                                 env=store.env, fix=fix).strip()
                config += ["--cmd", '["python3"]', "--label", f"{PYTHON_VERSION_LABEL}={version}"]
            for key, value in base.env:
                config += ["--env", f"{key}={value}"]
            run(step, store.buildah(*config, ctr), log, env=store.env, fix=fix)
            seconds += run(step, store.buildah("commit", "--rm", "--format", "docker", ctr, target.ref), log,
                           env=store.env, fix=fix)
        except BaseException:
            subprocess.run(store.buildah("rm", ctr), capture_output=True, env={**os.environ, **store.env}, check=False)
            raise
    return seconds


def _build_binary(store: Store, target: spec.Target, echo: Echo) -> float:
    image = target.spec
    assert isinstance(image, spec.BinaryImage) and target.binary is not None
    step = f"build {image.name}"
    echo(f"images: {step}: {target.binary.name} {target.version} on {image.base} ({image.description}) ...")
    log, fix = store.log(image.name), "read the log; rebuild the binary with e2e/tools/build.sh, then run it again"
    ctr = output(step, store.buildah("from", "--pull-never", target.base_refs["BASE"]), env=store.env, fix=fix).strip()
    path = image.path
    try:
        seconds = run(step, store.buildah("copy", "--chmod", "0755", ctr, str(target.binary), path), log,
                      env=store.env, fix=fix)
        run(step, store.buildah("config", "--entrypoint", json.dumps([path]), "--cmd", "", "--user", image.user,
                                "--label", f"dev.hisparse.input-hash={target.input_hash}",
                                "--label", f"org.opencontainers.image.version={target.version}", ctr),
            log, env=store.env, fix=fix)
        seconds += run(step, store.buildah("commit", "--rm", "--format", "docker", ctr, target.ref), log,
                       env=store.env, fix=fix)
    except BaseException:
        subprocess.run(store.buildah("rm", ctr), capture_output=True, env={**os.environ, **store.env}, check=False)
        raise
    return seconds


def _stage_context(image: spec.DockerfileImage, into: Path) -> None:
    for rel in image.context_files():
        dest = into / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.REPO_ROOT / rel, dest)


def _build_dockerfile(store: Store, target: spec.Target, wheels: Path, echo: Echo) -> float:
    image = target.spec
    assert isinstance(image, spec.DockerfileImage)
    step = f"build {image.name}"
    echo(f"images: {step}: buildah bud -f {image.dockerfile.relative_to(spec.REPO_ROOT)} ({image.description}) ...")
    args = {**image.resolved_build_args(), **target.base_refs}
    if image.python_version_arg:
        base_ref = next(iter(target.base_refs.values()))
        args[image.python_version_arg] = store.label(base_ref, PYTHON_VERSION_LABEL, step)
    pipdir = wheels.with_name(f"{wheels.name}.pip")
    argv = store.buildah("bud", "--isolation", "chroot", "--pull-never", f"--layers={str(image.layers).lower()}",
                         "--format", "docker",
                         "--volume", f"{wheels}:{WHEELHOUSE_MOUNT}:ro", "--volume", f"{pipdir}:{PIP_MOUNT}:ro",
                         "--volume", f"{pipdir / 'pip.conf'}:/etc/pip.conf:ro",
                         "--label", f"dev.hisparse.input-hash={target.input_hash}")
    for key, value in sorted(args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    with tempfile.TemporaryDirectory(dir=store.tmp) as context:
        _stage_context(image, Path(context))
        argv += ["-f", str(image.dockerfile), "-t", target.ref, context]
        return run(step, argv, store.log(image.name), env=store.env,
                   fix=f"read the log; fix {image.dockerfile.relative_to(spec.REPO_ROOT)} or what it copies, then "
                       f"run `hisparse dev images` again")


def _export(store: Store, target: spec.Target) -> tuple[Path, float]:
    step = f"export {target.name}"
    archive = store.archive(target.name, target.input_hash)
    partial = archive.with_suffix(".tar.partial")
    partial.unlink(missing_ok=True)
    seconds = run(step, store.buildah("push", "--quiet", target.ref, f"docker-archive:{partial}:{target.ref}"),
                  store.log(target.name), env=store.env,
                  fix=f"free disk space under {store.root} (the archive is as large as the image), then run it again")
    partial.rename(archive)
    return archive, seconds


def _forget_older(store: Store, target: spec.Target) -> None:
    """Archives, records and stored images of this name from other inputs: only the current one is kept."""
    # Exactly <name>-<hash>.<suffix>: another image's name may start with this one's (prometheus-operator).
    mine = re.compile(rf"{re.escape(target.name)}-[0-9a-f]+\.(tar|json|tar\.partial)")
    for path in store.root.glob(f"{target.name}-*"):
        if mine.fullmatch(path.name) and target.input_hash not in path.name:
            path.unlink(missing_ok=True)
    repo = target.ref.rpartition(":")[0]
    listing = output("prune", store.buildah("images", "--format", "{{.Name}}:{{.Tag}}"), env=store.env, fix="")
    for ref in listing.split():
        if ref.rpartition(":")[0] == repo and ref != target.ref:
            run("prune", store.buildah("rmi", "--force", ref), store.log("prune"), env=store.env, fix="")


# ---- the entry point -------------------------------------------------------------------------------------

def cached(names: Iterable[str] = spec.SHIPPED) -> dict[str, BuiltImage]:
    """Product images whose archive matches the current inputs (no tool runs)."""
    store = Store(cache_root())
    out = {}
    for target in spec.plan(tuple(names)):
        if target.shipped:
            record = BuiltImage.load(store.record(target.name, target.input_hash))
            if record is not None and Path(record.archive).exists():
                out[target.name] = record
    return out


def ensure(names: Iterable[str] = spec.SHIPPED, *, rebuild: bool = False, echo: Echo = print) -> dict[str, BuiltImage]:
    """Build what is missing of ``names`` (product images) and return each one's archive.

    A product image whose archive matches its inputs' hash is returned at once (``rebuild``: built again
    anyway); otherwise its missing bases are built first (a base already in the store is reused, also with
    ``rebuild``). Failures raise :class:`ImageError`."""
    names = tuple(names)
    try:
        targets = spec.plan(names)
    except (KeyError, FileNotFoundError) as e:
        raise ImageError("plan", str(e), "name an image of `hisparse dev images --help`, or restore the file") from e
    store = Store(cache_root())
    ready = {} if rebuild else cached(names)
    wanted = [t for t in targets if t.shipped and t.name not in ready]
    if not wanted:
        for name, built in ready.items():
            echo(f"images: {name}: cached ({built.ref}, {built.archive_bytes / 2**30:.2f} GiB)")
        return ready
    require("buildah", "mmdebstrap", step="tools")
    store.root.mkdir(parents=True, exist_ok=True)
    by_name = {t.name: t for t in targets}
    needed: list[spec.Target] = []

    def need(t: spec.Target) -> None:
        deps = t.spec.bases.values() if isinstance(t.spec, spec.DockerfileImage) else \
            (t.spec.base,) if isinstance(t.spec, spec.BinaryImage) else ()
        for dep in deps:
            need(by_name[dep])
        if t not in needed:
            needed.append(t)

    for t in wanted:
        need(t)
    with heavy_lock():  # once for the whole build: other heavy work waits instead of slipping in between steps
        _build_all(store, needed, ready, echo)
    return {name: ready[name] for name in (t.name for t in targets if t.shipped)}


def _build_all(store: Store, needed: list[spec.Target], ready: dict[str, BuiltImage], echo: Echo) -> None:
    wheels: Path | None = None
    for target in needed:
        if not target.shipped and store.has_image(target.ref):
            continue  # a base with these inputs is in the store (remove the cache folder for a cold build)
        started = time.monotonic()
        if isinstance(target.spec, spec.DebianBase):
            seconds = _build_debian(store, target, echo)
        elif isinstance(target.spec, spec.BinaryImage):
            seconds = _build_binary(store, target, echo)
        else:
            wheels = wheels or ensure_wheelhouse(store, echo)
            seconds = _build_dockerfile(store, target, wheels, echo)
        if not target.shipped:
            _forget_older(store, target)
            echo(f"images: {target.name}: built in {time.monotonic() - started:.0f}s ({target.ref})")
            continue
        # Older archives go before the export, not after: two runtime archives (about 10 GiB each) at once
        # filled a developer's disk mid-export.
        _forget_older(store, target)
        archive, export_s = _export(store, target)
        built = BuiltImage(name=target.name, ref=target.ref, archive=str(archive), input_hash=target.input_hash,
                           archive_bytes=archive.stat().st_size, build_s=round(seconds, 1),
                           export_s=round(export_s, 1), built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        store.record(target.name, target.input_hash).write_text(json.dumps(asdict(built), indent=2) + "\n")
        ready[target.name] = built
        echo(f"images: {target.name}: built in {seconds:.0f}s, exported in {export_s:.0f}s "
             f"({built.ref}, {built.archive_bytes / 2**30:.2f} GiB: {archive})")


def load(import_image: Callable[[str], object], names: Iterable[str] = spec.SHIPPED, *,
         tag_image: Callable[[str, str], object] | None = None, echo: Echo = print) -> dict[str, str]:
    """Build what is missing of ``names``, then hand each archive to ``import_image`` (the real node's
    ``import_image``, or :meth:`PrivateContainerd.import_image`) and, with ``tag_image(ref, alias)``, tag
    each project image ``localhost/<name>:dev`` too; returns name -> image reference."""
    refs = {}
    names = tuple(names)
    ready = ensure(names, echo=echo)  # plan errors become ImageError here
    aliases = {t.name: t.alias for t in spec.plan(names)}
    for name, built in ready.items():
        started = time.monotonic()
        try:
            import_image(built.archive)
            if tag_image is not None and aliases.get(name):
                tag_image(built.ref, str(aliases[name]))
        except ImageError:
            raise
        except Exception as e:  # the node's own error types: one message with the step all the same
            raise ImageError(f"load {name}", f"importing {built.archive} failed: {e}",
                             f"check the node's containerd (its log) and free disk space (the image is "
                             f"{built.archive_bytes / 2**30:.1f} GiB), then run it again") from e
        echo(f"images: {name}: loaded {built.ref} in {time.monotonic() - started:.0f}s")
        refs[name] = built.ref
    return refs
