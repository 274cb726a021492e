"""``hisparse-runtime fetch-model`` against a loopback server speaking the hub's file API, with the real
``huggingface_hub`` client: a locally made tiny DSA checkpoint lands byte for byte, a second run fetches
nothing, wrong credentials and unknown revisions fail with one clear line, and preflight checks the
marker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rtsupport import child_env

from hisparse_runtime.engine import MODEL_MARKER_FILE
from hisparse_runtime.fetch_model import ModelMarker, marker_problem
from hisparse_runtime.testing.hub_server import HubRepo, HubServer

REPO_ID = "hisparse-test/tiny-dsa"
SOURCE = f"hf://{REPO_ID}"
COMMIT = "1f2e3d4c5b6a79880716253443526170a1b2c3d4"
TOKEN = "hf_test_token_not_a_secret"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hisparse_runtime.cpu_engine.checkpoint import write_checkpoint

    root = write_checkpoint(tmp_path_factory.mktemp("hub") / COMMIT, seed=3)
    (root / "tokenizer_config.json").write_text("{}\n")
    (root / "nested").mkdir()
    (root / "nested" / "notes.txt").write_text("a file below the repository root\n")
    return root


def _hub(checkpoint: Path, token: str | None = TOKEN) -> HubServer:
    return HubServer({REPO_ID: HubRepo(commits={COMMIT: checkpoint}, refs={"main": COMMIT})}, token=token)


def _argv(dest: Path, tmp: Path, revision: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "hisparse_runtime", "fetch-model", "--source", SOURCE, "--revision", revision,
            "--dest", str(dest), "--termination-log", str(tmp / "termination-log"), *extra]


def _env(hub: HubServer, tmp: Path, token: str | None = TOKEN) -> dict[str, str]:
    env = child_env(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
                    HF_HUB_DISABLE_XET="1")
    env.pop("HF_TOKEN", None)
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def _fetch(hub: HubServer, dest: Path, tmp: Path, *, revision: str = "main", token: str | None = TOKEN,
           extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(dest, tmp, revision, extra), capture_output=True, text=True,
                          env=_env(hub, tmp, token), timeout=120)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.relative_to(root).as_posix().startswith(".cache/") and p.name != MODEL_MARKER_FILE}


def test_download_lands_every_byte_and_a_second_run_fetches_nothing(checkpoint: Path, tmp_path: Path) -> None:
    dest = tmp_path / "cache" / "hf" / REPO_ID / "main"
    with _hub(checkpoint) as hub:
        first = _fetch(hub, dest, tmp_path)
        assert first.returncode == 0, first.stderr
        assert "downloaded" in first.stdout
        assert _tree(dest) == _tree(checkpoint)
        assert any(m == "GET" and p.endswith("/model.safetensors") for m, p in hub.file_requests())
        marker = ModelMarker.model_validate_json((dest / MODEL_MARKER_FILE).read_text())
        assert (marker.source, marker.revision, marker.commit) == (SOURCE, "main", COMMIT)
        assert marker.files == {name: len(data) for name, data in _tree(checkpoint).items()}
        assert marker_problem(dest, SOURCE, "main") is None

        hub.requests.clear()
        second = _fetch(hub, dest, tmp_path)
        assert second.returncode == 0, second.stderr
        assert "already cached" in second.stdout
        assert hub.requests == [], "a filled cache must not reach the hub at all"


def test_an_interrupted_download_resumes_without_fetching_complete_files_again(checkpoint: Path, tmp_path: Path) -> None:
    dest = tmp_path / "cache"
    with _hub(checkpoint) as hub:
        assert _fetch(hub, dest, tmp_path, revision=COMMIT).returncode == 0
        (dest / MODEL_MARKER_FILE).unlink()  # as if the pod died after the files, before the marker
        (dest / "nested" / "notes.txt").unlink()  # and before this file
        hub.requests.clear()
        again = _fetch(hub, dest, tmp_path, revision=COMMIT)
        assert again.returncode == 0, again.stderr
        got = [p for m, p in hub.file_requests() if m == "GET"]
        assert got == [f"/{REPO_ID}/resolve/{COMMIT}/nested/notes.txt"], got
        assert _tree(dest) == _tree(checkpoint)
        assert marker_problem(dest, SOURCE, COMMIT) is None


def test_a_wrong_token_fails_with_the_reason_and_leaves_no_marker(checkpoint: Path, tmp_path: Path) -> None:
    dest = tmp_path / "cache"
    with _hub(checkpoint) as hub:
        result = _fetch(hub, dest, tmp_path, token="hf_wrong")
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("CredentialsRefused: the hub refused the credentials"), line
    assert "HF_TOKEN" in line and "spec.model.credentials.secretName" in line
    assert "hf_wrong" not in result.stderr + result.stdout, "a token must never be printed"
    assert (tmp_path / "termination-log").read_text().strip() == line
    assert not (dest / MODEL_MARKER_FILE).exists()


def test_no_token_for_a_private_repository_names_the_secret(checkpoint: Path, tmp_path: Path) -> None:
    with _hub(checkpoint) as hub:
        result = _fetch(hub, tmp_path / "cache", tmp_path, token=None)
    assert result.returncode == 3, result.stderr
    assert "ModelNotFound:" in result.stderr and "no HF_TOKEN is set" in result.stderr


def test_an_unknown_revision_is_not_found(checkpoint: Path, tmp_path: Path) -> None:
    with _hub(checkpoint) as hub:
        result = _fetch(hub, tmp_path / "cache", tmp_path, revision="0" * 40)
    assert result.returncode == 3, result.stderr
    assert "ModelNotFound: revision" in result.stderr and "spec.model.revision" in result.stderr


def test_every_reason_has_the_exit_code_the_operator_reads() -> None:
    from hisparse_runtime import fetch_model as F

    assert set(F.EXIT_CODES) == {F.CREDENTIALS_REFUSED, F.NOT_FOUND, F.DOWNLOAD_FAILED, F.DISK_FULL, F.NOT_WRITABLE}


def test_marker_problems_name_what_differs(checkpoint: Path, tmp_path: Path) -> None:
    dest = tmp_path / "cache"
    assert "was not filled" in (marker_problem(dest, SOURCE, "main") or "")
    with _hub(checkpoint) as hub:
        assert _fetch(hub, dest, tmp_path).returncode == 0
    assert "the settings declare" in (marker_problem(dest, SOURCE, "v2") or "")
    (dest / "config.json").write_text(json.dumps({"index_topk": 1}))
    assert "was changed" in (marker_problem(dest, SOURCE, "main") or "")


def test_the_hub_stand_in_runs_as_a_program_and_prints_each_request(checkpoint: Path, tmp_path: Path) -> None:
    """``python -m hisparse_runtime.testing.hub_server``, as the dev cluster runs it in a pod: a branch
    resolved to its commit, every file served, one ``<METHOD> <path>`` line per request on stdout."""
    import types

    proc = subprocess.Popen(
        [sys.executable, "-m", "hisparse_runtime.testing.hub_server", "--repo", REPO_ID, "--commit",
         f"{COMMIT}={checkpoint}", "--ref", f"main={COMMIT}", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith(f"serving hf://{REPO_ID}"), first
        hub = types.SimpleNamespace(endpoint=first.rsplit(" ", 1)[1].strip())
        dest = tmp_path / "cache"
        res = _fetch(hub, dest, tmp_path, token=None)  # type: ignore[arg-type]
        assert res.returncode == 0, res.stderr
        assert _tree(dest) == _tree(checkpoint)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    gets = sorted(ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("GET ") and "/resolve/" in ln)
    assert gets == sorted(f"/{REPO_ID}/resolve/{COMMIT}/{name}" for name in _tree(checkpoint)), out
    bad = subprocess.run([sys.executable, "-m", "hisparse_runtime.testing.hub_server", "--repo", REPO_ID, "--commit",
                          f"{COMMIT}={checkpoint}", "--ref", "main=0000"], capture_output=True, text=True,
                         env=child_env(), timeout=60)
    assert bad.returncode == 2 and "--ref names no --commit" in bad.stderr, bad.stderr


def test_a_canary_fill_keeps_the_stable_revision_and_removes_the_rest_after_three(checkpoint: Path, tmp_path: Path) -> None:
    """Three revisions in a row into one cache, each fill keeping the revision served before it (as the
    canary's Job keeps the stable fleet's): after the third, the cache holds the last two, and an unfinished
    download of an abandoned revision is gone too; the kept ones still pass the marker check."""
    commits = {f"{i}" * 40: checkpoint for i in (1, 2, 3)}
    root = tmp_path / "cache"
    rev = {c: root / "hf" / REPO_ID / c for c in commits}
    c1, c2, c3 = commits
    with HubServer({REPO_ID: HubRepo(commits=commits, refs={"main": c1})}, token=TOKEN) as hub:
        assert _fetch(hub, rev[c1], tmp_path, revision=c1).returncode == 0
        second = _fetch(hub, rev[c2], tmp_path, revision=c2, extra=("--prune-under", str(root), "--keep", str(rev[c1])))
        assert second.returncode == 0, second.stderr
        assert "removed 0 other revision(s)" in second.stdout
        stale = root / "hf" / "someone" / "older-model" / "main" / ".cache" / "huggingface"
        stale.mkdir(parents=True)  # a download of another model that never finished
        third = _fetch(hub, rev[c3], tmp_path, revision=c3, extra=("--prune-under", str(root), "--keep", str(rev[c2])))
        assert third.returncode == 0, third.stderr
    assert "removed 2 other revision(s)" in third.stdout, third.stdout
    assert sorted(p.name for p in (root / "hf" / REPO_ID).iterdir() if p.is_dir()) == sorted([c2, c3])
    assert sorted(p.name for p in (root / "hf" / REPO_ID).iterdir() if not p.is_dir()) == sorted(
        [f".{c2}.lock", f".{c3}.lock"]), "a removed revision's lock file stays behind"
    assert not (root / "hf" / "someone").exists(), "an emptied model directory stays"
    for c in (c2, c3):
        assert marker_problem(rev[c], SOURCE, c) is None


def test_two_pods_of_one_node_filling_one_directory_take_turns(checkpoint: Path, tmp_path: Path) -> None:
    """``NodeCache``: two pods on one node start at once; one downloads, the other waits for it and finds the
    marker. Every file is requested from the hub once."""
    dest = tmp_path / "node" / "ns" / "name" / "hf" / REPO_ID / "main"
    with _hub(checkpoint) as hub:
        env = _env(hub, tmp_path)
        for i in (0, 1):
            (tmp_path / f"pod{i}").mkdir()
        procs = [subprocess.Popen(_argv(dest, tmp_path / f"pod{i}", "main"), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**env, "HF_HOME": str(tmp_path / f"hf{i}")})
                 for i in (0, 1)]
        outs = [p.communicate(timeout=120) for p in procs]
        gets = [path for m, path in hub.file_requests() if m == "GET"]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    verbs = sorted("downloaded" if "downloaded" in o else "already cached" for o, _ in outs)
    assert verbs == ["already cached", "downloaded"], outs
    assert sorted(gets) == sorted(set(gets)) and len(gets) == len(_tree(checkpoint)), gets
    assert _tree(dest) == _tree(checkpoint)


def test_a_node_directory_it_cannot_write_fails_with_the_reason_and_the_fix(checkpoint: Path, tmp_path: Path) -> None:
    """The node's directory read-only to the fetcher (here a read-only bind mount in a mount namespace of
    the test's own; on a node, the root-owned directory the kubelet creates): one line naming the path,
    the UID and the field to fix, exit code 6, and nothing downloaded."""
    import shutil

    node = tmp_path / "node"
    node.mkdir()
    dest = node / "ns" / "name" / "hf" / REPO_ID / "main"
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for a read-only mount of the test's own")
    with _hub(checkpoint) as hub:
        argv = " ".join(f"'{a}'" for a in _argv(dest, tmp_path, "main"))
        result = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro '{node}' '{node}' && exec {argv}"],
                                capture_output=True, text=True, env=_env(hub, tmp_path), timeout=120)
        assert hub.file_requests() == []
    assert result.returncode == 6, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("CacheNotWritable: cannot write") and str(node / "ns") in line, line
    assert "spec.model.cache.nodePath" in line and "10001" in line, line
    assert (tmp_path / "termination-log").read_text().strip() == line
