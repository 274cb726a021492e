# syntax=docker/dockerfile:1
#
# STAND-IN for vllm/vllm-openai:v0.33.0 (the GPU runtime image's base), for the local cluster only: a
# machine with no GPU and no registry cannot have that image. It carries what runtime/Dockerfile and the
# runtime rely on from it, at the versions of requirements/test.lock: python3 with pip, vLLM 0.33.0's
# Python package (its parser and config classes), torch 2.14.0 (PyPI's CUDA build; it imports on CPU
# with its nvidia-* wheels), NIXL and Mooncake. It has no CUDA toolkit and no GPU driver, so the CUDA
# kernels are not compiled on it and vLLM itself cannot serve on it (the runtime's CPU engine does).
#
# Built by `hisparse dev images` from the local wheelhouse (no index): PYTHON_IMAGE is the Debian-made
# Python base; PACKAGES and NO_DEPS_PACKAGES are the lock's pins.

ARG PYTHON_IMAGE

FROM ${PYTHON_IMAGE}

ARG PACKAGES
ARG NO_DEPS_PACKAGES

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# One layer for all of it (about 11 GB, mostly torch and the nvidia-* wheels). NIXL's wheel declares
# torch and numpy, which vLLM brings already: it goes in without a resolver run of its own. The bytecode
# stays: the runtime user cannot write the venv, and vLLM's import would compile it at every start.
# hadolint ignore=SC2086
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir ${PACKAGES} \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps ${NO_DEPS_PACKAGES}

# The venv comes first, as vLLM's image puts its Python first: `python3 -m pip` installs into it.
ENV PATH="/opt/venv/bin:${PATH}" \
    VIRTUAL_ENV=/opt/venv \
    VLLM_TARGET_DEVICE=cpu
