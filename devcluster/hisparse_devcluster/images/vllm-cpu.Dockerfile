# syntax=docker/dockerfile:1
#
# STAND-IN for vllm/vllm-openai:v0.33.0 (the GPU runtime image's base), for the local cluster only: a
# machine with no GPU and no registry cannot have that image. It carries what runtime/Dockerfile and the
# runtime rely on from it, at the versions of requirements/test.lock: python3 with pip, vLLM 0.33.0's
# Python package (its parser and config classes), torch 2.14.0 (PyPI's CUDA build; it imports on CPU
# with its nvidia-* wheels), NIXL and Mooncake. It has no CUDA toolkit and no GPU driver, so the CUDA
# kernels are not compiled on it and vLLM itself cannot serve on it (the runtime's CPU engine does).
#
# Built by `hisparse dev images` from the local wheelhouse (no index), one layer per RUN (`--layers`):
# PYTHON_IMAGE is the Debian-made Python base; the package arguments are the lock's pins.

ARG PYTHON_IMAGE

FROM ${PYTHON_IMAGE}

ARG CUDA_LIBRARY_PACKAGES
ARG TORCH_PACKAGES
ARG PACKAGES
ARG NO_DEPS_PACKAGES

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# About 11 GB in all, in three slices of about 3 GB: storing a layer takes several times its size in
# transient disk, so one 11 GB layer needs ~40 GB free where three need ~15. The CUDA libraries and torch
# go in without a resolver run (the last step's resolver checks them against the lock's pins); NIXL's
# wheel declares torch and numpy, which vLLM brings already. The bytecode stays: the runtime user cannot
# write the venv, and vLLM's import would compile it at every start.
# hadolint ignore=SC2086
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps ${CUDA_LIBRARY_PACKAGES}
# hadolint ignore=SC2086
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps ${TORCH_PACKAGES}
# hadolint ignore=SC2086
RUN /opt/venv/bin/pip install --no-cache-dir ${PACKAGES} \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps ${NO_DEPS_PACKAGES}

# The venv comes first, as vLLM's image puts its Python first: `python3 -m pip` installs into it.
# HISPARSE_SERVING_ENGINE=cpu: the runtime's entrypoint supervises its CPU engine instead of `vllm serve`
# (same argv), and preflight reports the GPU checks as not needed. Only this stand-in base sets it.
ENV PATH="/opt/venv/bin:${PATH}" \
    VIRTUAL_ENV=/opt/venv \
    VLLM_TARGET_DEVICE=cpu \
    HISPARSE_SERVING_ENGINE=cpu
