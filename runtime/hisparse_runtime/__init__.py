"""hisparse in-pod runtime: entrypoint, preflight, probes, vLLM plugin, parity client, link checks.

The engine core (:mod:`hisparse_runtime.engine`) is the part the operator imports too."""
