"""The real node's image store (``hisparse_devcluster.realnode.image_store``): an image imported by one node
is found by the next node of the machine without importing it again; a changed archive is imported; what a
node leaves in the store is images only; stale images go; a store held by a live node is not shared, and one
whose holder died is wiped.

The containerd checks run on a private containerd (Debian's, as the node's); the two node lives run on the
real node of the session's cluster, with the store under a temporary ``HISPARSE_CACHE``.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_realnode import BUSYBOX_IMAGE, busybox_archive, busybox_pod, pod, wait_pods_ready
from hisparse_devcluster import Cluster, Tools
from hisparse_devcluster.images.containerd import PrivateContainerd
from hisparse_devcluster.realnode import RealNode, RealNodeError, write_image_archive
from hisparse_devcluster.realnode import image_store as S

pytestmark = pytest.mark.host


@pytest.fixture
def ctd(tmp_path: Path) -> Iterator[PrivateContainerd]:
    with PrivateContainerd.start(tmp_path / "containerd") as c:
        yield c


def _manifest_only(archive: Path, out: Path) -> Path:
    """``archive``'s manifest.json and config alone: a tar that names the image but holds none of its layers,
    so ``ctr images import`` of it fails; a store that skips the import returns the names."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        manifest = json.load(src.extractfile("manifest.json"))  # type: ignore[arg-type]
        for name in ("manifest.json", manifest[0]["Config"]):
            data = src.extractfile(name).read()  # type: ignore[union-attr]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return out


def _changed_busybox(tmp: Path) -> Path:
    """The busybox image under the same name, with one more file: another config digest."""
    root = tmp / "rootfs2"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    shutil.copy2("/bin/busybox", root / "bin" / "busybox")
    (root / "etc" / "changed").write_text("2\n")
    return write_image_archive(tmp / "busybox-2.tar", BUSYBOX_IMAGE, root, entrypoint=[], cmd=["/bin/sh"])


def test_held_compares_containerd_s_record_with_the_archive(ctd: PrivateContainerd, tmp_path: Path) -> None:
    archive = busybox_archive(tmp_path / "a" / "busybox.tar")
    wanted = S.archive_digests(archive)
    assert list(wanted) == [BUSYBOX_IMAGE] and wanted[BUSYBOX_IMAGE][0] == "config"
    assert not S.held(ctd.ctr, wanted)  # not imported yet
    ctd.import_image(archive)
    assert S.held(ctd.ctr, wanted)
    changed = S.archive_digests(_changed_busybox(tmp_path / "b"))
    assert changed[BUSYBOX_IMAGE] != wanted[BUSYBOX_IMAGE]
    assert not S.held(ctd.ctr, changed)  # same name, other content: must be imported
    assert not S.held(ctd.ctr, {**wanted, "localhost/absent:1": wanted[BUSYBOX_IMAGE]})
    assert not S.held(ctd.ctr, {})  # nothing compared is not "held"


def test_remove_unused_drops_stale_and_unrecorded_images(ctd: PrivateContainerd, tmp_path: Path) -> None:
    base = tmp_path / "store"
    base.mkdir()
    ctd.import_image(busybox_archive(tmp_path / "a" / "busybox.tar"))
    ctd.ctr("images", "tag", BUSYBOX_IMAGE, "localhost/alias:1")
    ctd.ctr("images", "tag", BUSYBOX_IMAGE, "localhost/old:1")
    S.record_use(base, [BUSYBOX_IMAGE, "localhost/old:1"])
    uses = json.loads((base / S.USES_FILE).read_text())
    uses["localhost/old:1"] = time.time() - S.KEEP_UNUSED_S - 60
    (base / S.USES_FILE).write_text(json.dumps(uses))
    S.remove_unused(base, ctd.ctr, ctd.images())
    assert ctd.images() == [BUSYBOX_IMAGE]
    assert set(json.loads((base / S.USES_FILE).read_text())) == {BUSYBOX_IMAGE}


def test_claim_is_exclusive_and_a_dead_holder_s_store_is_wiped(tmp_path: Path) -> None:
    base = tmp_path / "store"
    a, b = tmp_path / "a" / "state.json", tmp_path / "b" / "state.json"
    root = S.claim(a, alive=lambda _: True, base=base)
    assert root == base / "root" and S.holder_root(a, root) == base
    (root / "marker").write_text("images")
    assert S.claim(b, alive=lambda p: p == a, base=base) is None  # held by a live node
    assert S.holder_root(b, root) is None
    assert (root / "marker").exists()
    assert S.claim(b, alive=lambda _: False, base=base) == base / "root"  # the holder died
    assert not (root / "marker").exists(), "a dead holder's store must be wiped, not trusted"
    S.release(base, b, clean=True)
    assert S.claim(a, alive=lambda _: True, base=base) == base / "root"
    (root / "marker").write_text("images")
    S.release(base, a, clean=False)  # a teardown that could not leave images only
    assert not (root / "marker").exists()


def test_second_node_finds_the_first_node_s_image(cluster: Cluster, tools: Tools, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    base = S.store_dir()
    archive = busybox_archive(tmp_path / "images" / "busybox.tar")
    ns = "image-store"
    cluster.kubectl("create", "namespace", ns)
    node = RealNode(cluster, tools=tools).start()
    try:
        assert Path(node._state.containerd_root) == base / "root"  # type: ignore[union-attr]
        with pytest.raises(RealNodeError, match="import an image"):
            node.import_image(_manifest_only(archive, tmp_path / "images" / "manifest-only.tar"))
        assert node.import_image(archive) == [BUSYBOX_IMAGE]
        node.ctr("images", "tag", BUSYBOX_IMAGE, "localhost/unrecorded:1")
        cluster.apply([busybox_pod("first", ns, "exec /bin/busybox sleep 3600")])
        wait_pods_ready(cluster, ns, ["first"])
        first = pod(cluster, ns, "first")["status"]["containerStatuses"][0]["containerID"].split("//")[-1]
    finally:
        node.stop()
    assert not node.leftovers(), node.leftovers()
    assert not (base / S.OWNER_FILE).exists(), "the store is given back"
    for d in S.CRI_STATE_DIRS:
        assert not any((base / "root" / d).iterdir()) if (base / "root" / d).is_dir() else True

    node = RealNode(cluster, tools=tools).start()
    try:
        images = node.images()
        assert BUSYBOX_IMAGE in images and "localhost/unrecorded:1" not in images
        containers = node.ctr("containers", "list", "--quiet").stdout.split()
        assert first not in containers, "a pod's container of the last node was left in the store"
        # The archive that names the image but holds no layer is enough now: the import is skipped.
        assert node.import_image(_manifest_only(archive, tmp_path / "images" / "manifest-only.tar")) == [BUSYBOX_IMAGE]
        changed = _changed_busybox(tmp_path / "changed")
        assert node.import_image(changed) == [BUSYBOX_IMAGE]
        assert S.held(node.ctr, S.archive_digests(changed))
        cluster.apply([busybox_pod("second", ns, "test -f /etc/changed && exec /bin/busybox sleep 3600")])
        wait_pods_ready(cluster, ns, ["second"])
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        node.stop()
    assert not node.leftovers(), node.leftovers()
