"""Image benchmark: the operator and CPU runtime images built here (``hisparse dev images``), cold and
cached, exported, imported into a containerd of the benchmark's own and run. Prints a table, writes JSON.

    .venv/bin/python e2e/benchmarks/images_bench.py --cold    # removes this builder's cache first (keeps the wheelhouse)
    .venv/bin/python e2e/benchmarks/images_bench.py           # whatever the cache holds

Phases per image: ``first`` (a build from what the cache holds: cold with ``--cold``), ``warm`` (the same
inputs again: a cache hit), ``rebuild`` (the image built again on the bases in the store, as after a change
to the project's sources), ``import`` (``ctr -n k8s.io images import``) and ``run`` (a container of the
image running its CLI's ``--help``). Disk: the archive, buildah's store, containerd's root after import.
It is a benchmark, not a test: a cold run takes many minutes and about 35 GB of disk at its peak.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / d) for d in ("devcluster", "operator", "runtime", "kernels")]

from hisparse_devcluster import images  # noqa: E402
from hisparse_devcluster.images import _spec  # noqa: E402
from hisparse_devcluster.images.containerd import PrivateContainerd  # noqa: E402

HELP = {"hisparse-operator": ["hisparse", "--help"], "hisparse-runtime-cpu": ["hisparse-runtime", "--help"]}


def _du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False).stdout.split()
    return int(out[0]) if out else 0


def _gib(n: float) -> float:
    return round(n / 2**30, 2)


def _machine() -> dict[str, object]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    tool = {t: subprocess.run([t, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[0]
            for t in ("buildah", "containerd", "mmdebstrap")}
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": _gib(mem), "kernel": platform.release(),
            "python": platform.python_version(), "tools": tool,
            "buildah_driver": os.environ.get("HISPARSE_BUILDAH_DRIVER") or "overlay"}


def _timed(fn) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    value = fn()
    return round(time.monotonic() - start, 1), value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cold", action="store_true", help="remove the builder's storage, bases and archives first")
    ap.add_argument("--only", action="append", choices=sorted(HELP), help="images to measure (default both)")
    ap.add_argument("--out", type=Path, default=REPO / "e2e" / "benchmarks" / "results" / "images.json")
    args = ap.parse_args()
    names = args.only or list(HELP)
    root = images.cache_root()
    if args.cold:
        for path in list(root.iterdir()) if root.exists() else []:
            if path.name != "wheels":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    results: dict[str, dict[str, object]] = {}
    for name in names:
        first_s, built = _timed(lambda: images.ensure([name])[name])
        warm_s, _ = _timed(lambda: images.ensure([name]))
        rebuild_s, rebuilt = _timed(lambda: images.ensure([name], rebuild=True)[name])
        results[name] = {"ref": rebuilt.ref, "first_s": first_s, "first_cold": args.cold, "warm_s": warm_s,
                         "rebuild_s": rebuild_s, "rebuild_build_s": rebuilt.build_s, "export_s": rebuilt.export_s,
                         "archive_gib": _gib(rebuilt.archive_bytes)}
    store_bytes = _du(root / "storage")
    with tempfile.TemporaryDirectory(prefix="images-bench-") as tmp:
        with PrivateContainerd.start(Path(tmp)) as ctd:
            for name in names:
                built = images.cached([name])[name]
                import_s, refs = _timed(lambda: ctd.import_image(built.archive))
                run_s, proc = _timed(lambda: ctd.run(built.ref, HELP[name]))
                assert refs == [built.ref] and proc.returncode == 0, (refs, proc.stderr)
                results[name].update(import_s=import_s, run_help_s=run_s)
            containerd_bytes = _du(ctd.root)
    report = {
        "benchmark": "operator and CPU runtime images built here (buildah, Debian-made bases, local wheelhouse), "
                     "loaded with ctr -n k8s.io images import into a private containerd",
        "date": time.strftime("%Y-%m-%d"),
        "machine": _machine(),
        "images": results,
        "disk_gib": {"buildah_storage": _gib(store_bytes), "containerd_root_after_import": _gib(containerd_bytes),
                     "wheelhouse": _gib(_du(root / "wheels" / _spec.wheelhouse_hash())),
                     "archives": _gib(sum(images.cached([n])[n].archive_bytes for n in names))},
    }
    print(f"{'image':<22}{'first s':>9}{'warm s':>8}{'rebuild s':>11}{'export s':>10}{'GiB':>7}{'import s':>10}"
          f"{'run s':>7}")
    for name, r in results.items():
        print(f"{name:<22}{r['first_s']:>9}{r['warm_s']:>8}{r['rebuild_s']:>11}{r['export_s']:>10}"
              f"{r['archive_gib']:>7}{r['import_s']:>10}{r['run_help_s']:>7}")
    print("disk GiB:", report["disk_gib"], "(first build was cold)" if args.cold else "")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
