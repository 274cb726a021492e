"""A loopback server that speaks the part of the Hugging Face hub's file API ``huggingface_hub`` uses to
download a model snapshot, serving files from local directories. Point ``HF_ENDPOINT`` at it.

Endpoints (as the hub answers them):

- ``GET /api/models/{repo}/revision/{rev}``: model info, ``sha`` the resolved commit, ``siblings``.
- ``GET /api/models/{repo}/tree/{rev}?recursive=...``: the file list (``type``, ``path``, ``size``, ``oid``).
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: a file, with ``X-Repo-Commit``, ``ETag`` and
  ``Content-Length``.

With a ``token``, every request must carry ``Authorization: Bearer <token>``: a wrong one gets 401 with
the hub's ``Invalid credentials in Authorization header``, a missing one the 401 ``RepoNotFound`` the
hub gives for private repositories. An unknown revision gets 404 ``RevisionNotFound``. Every request is
recorded (method, path) so a test can assert that nothing was fetched.

A STAND-IN for the hub (or a mirror of it) where none can be reached: in tests on loopback, and as a pod
of the dev cluster's real node (``python -m hisparse_runtime.testing.hub_server``), where each request is
also printed, one ``<METHOD> <path>`` line, so a test reads from the pod's log what was fetched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    """One model repository: ``commits`` maps a commit sha to its directory, ``refs`` a branch or tag
    name to a commit sha."""

    commits: dict[str, Path]
    refs: dict[str, str] = field(default_factory=dict)

    def resolve(self, rev: str) -> str | None:
        rev = self.refs.get(rev, rev)
        return rev if rev in self.commits else None

    def files(self, commit: str) -> dict[str, Path]:
        root = self.commits[commit]
        return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


class HubServer:
    def __init__(self, repos: dict[str, HubRepo], *, token: str | None = None, host: str = "127.0.0.1",
                 port: int = 0, on_request: Callable[[str, str], None] | None = None) -> None:
        self.repos = repos
        self.token = token
        self.requests: list[tuple[str, str]] = []
        self._on_request = on_request
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def file_requests(self) -> list[tuple[str, str]]:
        with self._lock:
            return [r for r in self.requests if "/resolve/" in r[1]]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:  # quiet test output
                pass

            def do_GET(self) -> None:
                self._serve(body=True)

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def _send(self, status: int, headers: dict[str, str], payload: bytes, body: bool) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _error(self, status: int, code: str | None, message: str, body: bool) -> None:
                headers = {"Content-Type": "application/json", "X-Error-Message": message}
                if code:
                    headers["X-Error-Code"] = code
                self._send(status, headers, json.dumps({"error": message}).encode(), body)

            def _serve(self, *, body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                with server._lock:
                    server.requests.append((self.command, path))
                    if server._on_request is not None:
                        server._on_request(self.command, path)
                auth = self.headers.get("Authorization")
                if server.token is not None and auth != f"Bearer {server.token}":
                    if auth:
                        self._error(401, None, "Invalid credentials in Authorization header", body)
                    else:
                        self._error(401, "RepoNotFound", "Repository not found", body)
                    return
                if path.startswith("/api/models/"):
                    self._api(path.removeprefix("/api/models/"), body)
                else:
                    self._resolve(path.lstrip("/"), body)

            def _repo(self, rest: str, marker: str) -> tuple[str, HubRepo, str] | None:
                repo_id, sep, tail = rest.partition(marker)
                repo = server.repos.get(repo_id)
                return (repo_id, repo, tail) if sep and repo is not None else None

            def _api(self, rest: str, body: bool) -> None:
                for marker in ("/revision/", "/tree/"):
                    found = self._repo(rest, marker)
                    if found is None:
                        continue
                    repo_id, repo, tail = found
                    rev = tail.split("/", 1)[0]
                    commit = repo.resolve(rev)
                    if commit is None:
                        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
                        return
                    files = repo.files(commit)
                    if marker == "/revision/":
                        info = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": server.token is not None,
                                "siblings": [{"rfilename": name} for name in files]}
                    else:
                        info = [{"type": "file", "path": name, "size": p.stat().st_size,
                                 "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for name, p in files.items()]
                    self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)
                    return
                self._error(404, "RepoNotFound", "Repository not found", body)

            def _resolve(self, rest: str, body: bool) -> None:
                found = self._repo(rest, "/resolve/")
                if found is None:
                    self._error(404, "RepoNotFound", "Repository not found", body)
                    return
                _, repo, tail = found
                rev, _, name = tail.partition("/")
                commit = repo.resolve(rev)
                if commit is None:
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
                    return
                p = repo.files(commit).get(name)
                if p is None:
                    self._error(404, "EntryNotFound", f"{name} does not exist", body)
                    return
                data = p.read_bytes()
                self._send(200, {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                                 "Content-Type": "application/octet-stream"}, data, body)

        return Handler


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> None:
    """Serve one repository until killed: ``--commit SHA=DIR`` (repeatable) and ``--ref NAME=SHA``."""
    ap = argparse.ArgumentParser(prog="python -m hisparse_runtime.testing.hub_server", description=main.__doc__)
    ap.add_argument("--repo", required=True, help="ORG/NAME, as in hf://ORG/NAME")
    ap.add_argument("--commit", type=_pair, action="append", required=True, metavar="SHA=DIR")
    ap.add_argument("--ref", type=_pair, action="append", default=[], metavar="NAME=SHA")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args(argv)
    repo = HubRepo(commits={sha: Path(d) for sha, d in args.commit}, refs=dict(args.ref))
    unknown = [f"{name}={sha}" for name, sha in repo.refs.items() if sha not in repo.commits]
    if unknown:
        ap.error(f"--ref names no --commit: {unknown}")

    def show(method: str, path: str) -> None:
        print(method, path, flush=True)

    server = HubServer({args.repo: repo}, host=args.host, port=args.port, on_request=show)
    print(f"serving hf://{args.repo} ({len(repo.commits)} commit(s)) on {server.endpoint}", flush=True)
    try:
        server._httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._httpd.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
