"""Pushing the images built here to a registry, as a user does before installing on a cluster of their own.

skopeo copies each docker-archive to ``<registry>/<name>:<tag>`` (layers gzip-compressed, as ``docker push``
sends them). The project's own images (operator, CPU runtime) take the tag asked for; llm-d's and
Prometheus's keep their version tags, which manifests name. A registry with a private CA is trusted as
containers-certs.d(5) says (``/etc/containers/certs.d/<host>/ca.crt``); credentials come from
``skopeo login`` (or ``REGISTRY_AUTH_FILE``), never from the command line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from ._run import ImageError, run
from ._spec import DOCKERFILE_IMAGES
from .build import BuiltImage, cache_root

REGISTRY_PATTERN: Final = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$")
"""``host[:port][/path]``: where the images go (no scheme, no tag)."""
TAG_PATTERN: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
"""A tag as the distribution spec allows it."""


def target(image: BuiltImage, registry: str, tag: str) -> str:
    """The reference ``image`` is pushed as: the project's images under ``tag``, others under their own."""
    own = image.name in DOCKERFILE_IMAGES
    return f"{registry.rstrip('/')}/{image.name}:{tag if own else image.ref.rsplit(':', 1)[1]}"


def check_target(registry: str, tag: str) -> None:
    """Refuse a registry or tag no push could use (before anything is built or pushed)."""
    if not REGISTRY_PATTERN.match(registry):
        raise ImageError("push", f"registry {registry!r} is not host[:port][/path] (no scheme, no tag)",
                         "pass --push like registry.example.com/inference")
    if not TAG_PATTERN.match(tag):
        raise ImageError("push", f"tag {tag!r} is not a valid image tag",
                         "use letters, digits, '_', '.' and '-' (128 at most, not starting with '.' or '-')")


def push(built: dict[str, BuiltImage], registry: str, *, tag: str) -> dict[str, str]:
    """Push every image of ``built``; image name -> the reference pushed."""
    check_target(registry, tag)
    out = {}
    log = cache_root() / "logs" / "push.log"
    for name, image in built.items():
        dest = target(image, registry, tag)
        run(f"push {name}", ["skopeo", "copy", "--quiet", f"docker-archive:{image.archive}", f"docker://{dest}"], log,
            fix=f"check that {registry} answers (skopeo login for credentials; a private CA in "
                f"/etc/containers/certs.d/<host>/ca.crt), then run it again: layers it holds are not sent twice",
            timeout=max(600.0, Path(image.archive).stat().st_size / (4 << 20)))
        out[name] = dest
    return out
