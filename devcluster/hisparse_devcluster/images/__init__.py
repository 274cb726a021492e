"""Images built here from the project's own Dockerfiles, with no registry (the local cluster only).

``operator/Dockerfile`` and ``runtime/Dockerfile`` are built with Debian's buildah on bases made from
Debian packages (``mmdebstrap``) in place of the public ones, chosen by each Dockerfile's base build
argument, so the Dockerfile users build is the one tested. The CPU runtime image starts from a STAND-IN
for ``vllm/vllm-openai`` (``vllm-cpu.Dockerfile``: vLLM's Python package, torch, NIXL, Mooncake, no CUDA);
the GPU image shares every step of ``runtime/Dockerfile`` but its base. Images are cached by the hash
of their inputs under ``${HISPARSE_CACHE:-~/.cache/hisparse}/images/`` and exported as docker-archive
tars that ``ctr -n k8s.io images import`` loads.

    built = ensure()                      # {"hisparse-operator": BuiltImage, "hisparse-runtime-cpu": ...}
    refs = load(node.import_image)        # the same, then each archive imported: {name: reference}
    pushed = push(built, "registry.example.com/inference", tag="0.1.0")  # skopeo copy to a registry
"""

from ._run import ImageError
from ._spec import DEV_TAG, SHIPPED, SHORT_NAMES, plan
from .build import BuiltImage, cache_root, cached, ensure, load
from .containerd import PrivateContainerd
from .push import check_target, push

__all__ = [
    "DEV_TAG",
    "SHIPPED",
    "SHORT_NAMES",
    "BuiltImage",
    "ImageError",
    "PrivateContainerd",
    "cache_root",
    "cached",
    "check_target",
    "ensure",
    "load",
    "plan",
    "push",
]
