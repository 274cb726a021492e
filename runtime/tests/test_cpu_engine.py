"""The CPU engine (a stand-in for ``vllm serve``, named so) as real processes on loopback: vLLM's own
parser on the rendered argv, greedy tokens equal to the tiny DSA model computed in-process, P/D with
the KV pulled over NIXL (UCX, DRAM), ``/metrics`` in vLLM's names, the decode readiness probe, and the
SIGTERM drain.

The engines serve the rendered argv of ``examples/hisparse-deployment.yaml``'s roles made CPU-sized
(the tiny model, one GPU's layout, a 1 GiB host pool, ``maxModelLen`` within the model); the test only
appends ``--port`` so that parallel runs on one machine do not collide (argparse: the last one wins).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from hisparse_runtime import podstate, probes
from hisparse_runtime.engine import (
    LIVENESS_PATH,
    PROBE_PORT,
    READINESS_PATH,
    EngineOptions,
    HiSparseSettings,
    ModelSettings,
    ParallelSettings,
    render_argv,
)
from hisparse_runtime.engine.hisparse import DRAIN_SECONDS
from prometheus_client.parser import text_string_to_metric_families
from rtsupport import REPO_DIR, Child, free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # real engine processes (each imports vLLM)

REPO_ID = "hisparse-test/tiny-dsa"
REVISION = "1" * 40
MODEL = "tiny-dsa"
ENGINE = [sys.executable, "-m", "hisparse_runtime.cpu_engine"]
PROMPTS = [list(range(7, 47)), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4] * 5]


# ---------------------------------------------------------------------------------------- settings
def example_settings(example: str, role: str):
    """A role of a documented example, CPU-sized: what the CPU example of the real node renders."""
    from hisparse_operator.api import role_settings, validate

    d, errors = validate(yaml.safe_load((REPO_DIR / "examples" / example).read_text()))
    assert not errors and d is not None
    s = role_settings(d, role)
    update: dict = {
        "model": ModelSettings(source=f"hf://{REPO_ID}", revision=REVISION, served_model_name=MODEL,
                               index_topk=32, index_topk_freq=2),
        "parallelism": ParallelSettings(gpus_per_node=1),
        "engine": s.engine.model_copy(update={"max_model_len": 2048}),
        # Today's fixed 64 GiB host-memory headroom (HOST_POOL_HEADROOM_GIB) sets the floor of a
        # HiSparse decode's memory request; nothing here allocates it.
        "memory_request_gib": 66.0,
        "peer_host": "127.0.0.1" if role == "decode" else None,
    }  # fmt: skip
    if s.hisparse is not None:
        update["hisparse"] = HiSparseSettings(host_pool_gib=1)
    return s.model_copy(update=update)


def engine_argv(settings, port: int) -> list[str]:
    argv = render_argv(settings)
    assert argv[:2] == ["vllm", "serve"]
    return [*argv[1:], "--port", str(port)]


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    from hisparse_runtime.cpu_engine import write_hf_cache_checkpoint

    cache = tmp_path_factory.mktemp("hf") / "hub"
    write_hf_cache_checkpoint(cache, REPO_ID, revision=REVISION, seed=0)
    return cache


def hub_env(hub: Path, **extra: str) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", **extra}


@pytest.fixture(scope="module")
def reference(hub):
    """The tiny DSA model of the same checkpoint, in this process."""
    import torch

    from hisparse_kernels.tiny_dsa import TinyDSA
    from hisparse_runtime.cpu_engine import load_checkpoint

    torch.set_num_threads(1)
    ck = load_checkpoint(hub / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / REVISION)
    model = TinyDSA(ck.config, seed=ck.seed, device="cpu")
    return lambda prompt, n, hisparse=True: model.generate(prompt, n, hisparse=hisparse)


class Engine:
    def __init__(self, child: Child, port: int, side_channel: int | None) -> None:
        self.child, self.port, self.side_channel = child, port, side_channel
        self.url = f"http://127.0.0.1:{port}"

    def complete(self, **body) -> dict:
        r = httpx.post(self.url + "/v1/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    def metrics(self) -> dict[str, list]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    def sample(self, family: str, suffix: str = "", **labels: str) -> float:
        for s in self.metrics()[family]:
            if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise AssertionError(f"no sample {family}{suffix} {labels}")


def launch(children, hub: Path, argv: list[str], **env: str) -> Child:
    child = Child([*ENGINE, *argv], **hub_env(hub, **env))
    children.append(child)
    return child


def wait_ready(child: Child, port: int) -> Engine:
    # Importing vLLM for its parser is the slow part: seconds on an idle machine, minutes on a busy one.
    ready = child.next_json(900)
    assert ready["event"] == "ready" and ready["port"] == port, ready
    return Engine(child, port, ready.get("side_channel_port"))


def start_engine(children, hub: Path, argv: list[str], port: int, **env: str) -> Engine:
    return wait_ready(launch(children, hub, argv, **env), port)


@pytest.fixture(scope="module")
def pd(hub, tmp_path_factory):
    """A prefill engine and a HiSparse decode engine from the example's CPU-sized roles. Decode reads its
    transfer-fault switch from ``decode.fault_file`` (empty: no fault)."""
    started: list[Child] = []
    fault_file = tmp_path_factory.mktemp("fault") / "fault"
    fault_file.write_text("")
    try:
        p_port, d_port = free_port(), free_port()
        p = launch(started, hub, engine_argv(example_settings("hisparse-deployment.yaml", "prefill"), p_port),
                   VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))
        d = launch(started, hub, engine_argv(example_settings("hisparse-deployment.yaml", "decode"), d_port),
                   VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()),
                   HISPARSE_CPU_ENGINE_FAULT_FILE=str(fault_file))
        prefill, decode = wait_ready(p, p_port), wait_ready(d, d_port)  # both start at once
        decode.fault_file = fault_file
        yield prefill, decode
    finally:
        for child in started:
            child.stop()


# ---------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("example", ["hisparse-deployment.yaml", "deepseek-v32-single-node.yaml"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_vllm_parser_accepts_the_examples_roles(example, role, hub, monkeypatch):
    from hisparse_runtime.cpu_engine.args import parse_serve_argv
    from hisparse_runtime.cpu_engine.checkpoint import resolve_model_dir

    s = example_settings(example, role)
    cfg = parse_serve_argv(render_argv(s)[1:], environ={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert cfg.served_model_name == MODEL and cfg.port == s.vllm_port
    assert cfg.block_size == s.engine.block_size and cfg.max_model_len == 2048
    assert cfg.nixl and cfg.kv_role == ("kv_consumer" if role == "decode" else "kv_producer")
    assert cfg.hisparse_host_pool_gib == (1 if role == "decode" else None)
    for key, value in hub_env(hub).items():
        monkeypatch.setenv(key, value)
    assert (resolve_model_dir(cfg.model, cfg.revision) / "config.json").exists()


def test_what_vllm_refuses_is_refused(hub):
    """An unknown flag is vLLM's argparse error (exit 2); a HiSparse decode without
    --scheduler-reserve-full-isl is vLLM's startup error (exit 1); so is a max_model_len past the model."""
    argv = render_argv(example_settings("hisparse-deployment.yaml", "decode"))[1:]
    unknown = subprocess.run([*ENGINE, *argv, "--hisparse-pool-gib", "160"], capture_output=True, text=True,
                             env={**os.environ, **hub_env(hub)}, timeout=900)  # fmt: skip
    assert unknown.returncode == 2, unknown.stderr[-2000:]
    assert "unrecognized arguments: --hisparse-pool-gib" in unknown.stderr
    no_isl = subprocess.run([*ENGINE, *argv, "--no-scheduler-reserve-full-isl", "--port", str(free_port())],
                            capture_output=True, text=True, env={**os.environ, **hub_env(hub)}, timeout=900)
    assert no_isl.returncode == 1 and "HiSparse requires --scheduler-reserve-full-isl" in no_isl.stderr
    too_long = subprocess.run([*ENGINE, *argv, "--max-model-len", "4096", "--port", str(free_port())],
                              capture_output=True, text=True, env={**os.environ, **hub_env(hub)}, timeout=900)
    assert too_long.returncode == 1 and "max_model_len (4096) is greater" in too_long.stderr


def test_preflight_reads_the_checkpoints_config_json(hub):
    """The model directory is real enough for preflight's model check: it passes as written and fails
    when the declared DSA facts disagree with it."""
    from hisparse_runtime.preflight.checks import PreflightContext, model_config

    snapshot = hub / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / REVISION
    s = example_settings("hisparse-deployment.yaml", "decode")
    ok = model_config(PreflightContext(settings=s, model_dir=snapshot))
    assert ok is not None and ok.ok and "index_topk=32, index_topk_freq=2" in ok.message
    wrong = s.model_copy(update={"model": s.model.model_copy(update={"index_topk": 2048})})
    bad = model_config(PreflightContext(settings=wrong, model_dir=snapshot))
    assert bad is not None and not bad.ok and "index_topk is 32 but model.indexTopk declares 2048" in bad.message


def test_perturbed_output_head_changes_every_greedy_token(tmp_path):
    """The fault switch canary tests use for a build that computes different tokens."""
    import torch

    from hisparse_runtime.cpu_engine import load_checkpoint, write_checkpoint
    from hisparse_runtime.cpu_engine.checkpoint import perturb_output_head

    ck = load_checkpoint(write_checkpoint(tmp_path / "m", seed=3))
    hidden = torch.randn(5, ck.config.hidden_size, generator=torch.Generator().manual_seed(0))
    before = (hidden @ ck.weights.lm_head).argmax(-1)
    perturb_output_head(ck)
    after = (hidden @ ck.weights.lm_head).argmax(-1)
    assert torch.equal(after, (before + 1) % ck.config.vocab_size)


def test_the_entrypoint_picks_the_engine_from_the_image_setting():
    from hisparse_runtime.serve import engine_command

    argv = render_argv(example_settings("hisparse-deployment.yaml", "decode"))
    assert engine_command(argv, {}) == argv  # vLLM itself, unchanged
    assert engine_command(argv, {"HISPARSE_SERVING_ENGINE": "vllm"}) == argv
    assert engine_command(argv, {"HISPARSE_SERVING_ENGINE": "cpu"}) == [*ENGINE, *argv[1:]]  # same arguments
    with pytest.raises(ValueError, match="HISPARSE_SERVING_ENGINE='gpu' is not one of"):
        engine_command(argv, {"HISPARSE_SERVING_ENGINE": "gpu"})


# ---------------------------------------------------------------------------------------- serving
def test_completions_are_the_in_process_tokens(pd, reference):
    prefill, decode = pd
    for prompt in PROMPTS:
        want = reference(prompt, 12)
        assert want == reference(prompt, 12, hisparse=False)  # the model's own parity, for the record
        for engine in (prefill, decode):  # full KV on prefill, HiSparse host pool + hot buffer on decode
            out = engine.complete(prompt=prompt, max_tokens=12, return_token_ids=True)
            choice = out["choices"][0]
            assert choice["token_ids"] == want and choice["prompt_token_ids"] == prompt
            assert choice["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 12
            assert out["object"] == "text_completion" and out["model"] == MODEL


def test_text_prompt_logprobs_and_models(pd, reference):
    _, decode = pd
    out = decode.complete(prompt="the quick brown fox", max_tokens=5, logprobs=3, return_token_ids=True)
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == list(b"the quick brown fox")
    assert choice["token_ids"] == reference(list(b"the quick brown fox"), 5)
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"]) == 5
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 3 and logprob < 0 and top[token] == logprob == max(top.values())  # greedy = top-1
    models = httpx.get(decode.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert httpx.get(decode.url + "/health", timeout=10).status_code == 200
    bad = httpx.post(decode.url + "/v1/completions", json={"model": "other", "prompt": [1]}, timeout=30)
    assert bad.status_code == 404 and "does not exist" in bad.json()["error"]["message"]


def test_pd_decode_pulls_the_kv_over_nixl(pd, reference):
    from hisparse_runtime.testing.pd_proxy import PREFILLER_HEADER, PDProxy

    prefill, decode = pd
    prompt = PROMPTS[1]
    before_bytes = decode.sample("vllm:nixl_bytes_transferred", "_sum")
    before_external = decode.sample("vllm:prompt_tokens_by_source", "_total", source="external_kv_transfer")
    before_local = decode.sample("vllm:prompt_tokens_by_source", "_total", source="local_compute")
    with PDProxy(decode.url) as proxy:
        r = httpx.post(proxy.url + "/v1/completions", timeout=120, headers={PREFILLER_HEADER: f"127.0.0.1:{prefill.port}"},
                       json={"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0,
                             "return_token_ids": True})  # fmt: skip
        assert r.status_code == 200, r.text
        assert proxy.prefills == [{"to": f"127.0.0.1:{prefill.port}", "status": 200}]
    assert r.json()["choices"][0]["token_ids"] == reference(prompt, 10)
    # Decode read every prompt block from prefill (4 layers of KV rows + 2 index-key layers per block)
    # and computed only the last prompt token itself: a decode that recomputed the prompt fails here.
    block = 64
    blocks = -(-len(prompt) // block)
    expected = blocks * block * (4 * (128 + 32) * 2 + 2 * 16 * 4)
    assert decode.sample("vllm:nixl_bytes_transferred", "_sum") - before_bytes == expected
    assert decode.sample("vllm:prompt_tokens_by_source", "_total", source="external_kv_transfer") - before_external \
        == len(prompt) - 1  # fmt: skip
    assert decode.sample("vllm:prompt_tokens_by_source", "_total", source="local_compute") - before_local == 1
    # Prefill held the blocks until decode's NIXL notification freed them.
    deadline = time.monotonic() + 10
    while prefill.sample("vllm:kv_cache_usage_perc") != 0.0:
        assert time.monotonic() < deadline, "prefill never freed the blocks decode read"
        time.sleep(0.1)


def _pd_tokens(prefill, decode, prompt: list[int], n: int) -> list[int]:
    from hisparse_runtime.testing.pd_proxy import PREFILLER_HEADER, PDProxy

    with PDProxy(decode.url) as proxy:
        r = httpx.post(proxy.url + "/v1/completions", timeout=120, headers={PREFILLER_HEADER: f"127.0.0.1:{prefill.port}"},
                       json={"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0,
                             "return_token_ids": True})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize("fault", ["pull-nothing", "corrupt"])
def test_a_transfer_that_moved_nothing_or_garbage_changes_the_tokens(pd, reference, fault):
    """Negative controls of the token check: the same prompt first decodes right from a real transfer, which
    leaves its KV in decode's blocks; a pull that then moves nothing into the same (reused) blocks, or whose
    bytes arrive overwritten, must give other tokens. Without the poisoning of freed blocks, the skipped pull
    finds the earlier request's KV there and the tokens come out right: the check would pass on nothing."""
    prefill, decode = pd
    prompt = PROMPTS[0]
    assert _pd_tokens(prefill, decode, prompt, 8) == reference(prompt, 8)
    bytes_before = decode.sample("vllm:nixl_bytes_transferred", "_sum")
    decode.fault_file.write_text(fault)
    try:
        tokens = _pd_tokens(prefill, decode, prompt, 8)
    finally:
        decode.fault_file.write_text("")
    # The engine reports the bytes as moved either way: only the tokens can tell.
    assert decode.sample("vllm:nixl_bytes_transferred", "_sum") > bytes_before
    assert tokens != reference(prompt, 8), f"{fault}: the tokens are right although the KV was not transferred"
    assert _pd_tokens(prefill, decode, prompt, 8) == reference(prompt, 8)  # and a real transfer again is right


def test_freed_blocks_hold_no_earlier_request_s_kv(tmp_path):
    """What a finished request leaves in its blocks is overwritten once they are free (both KV modes)."""
    import torch

    from hisparse_runtime.cpu_engine import load_checkpoint, write_checkpoint
    from hisparse_runtime.cpu_engine.runner import POISON, EngineRequest, Runner

    weights = load_checkpoint(write_checkpoint(tmp_path / "m", seed=3)).weights
    for hisparse in (False, True):
        runner = Runner(weights, hisparse=hisparse, on_finish=lambda req: None)
        runner.start()
        try:
            req = EngineRequest("r", PROMPTS[1], 4)
            runner.submit(req)
            assert req.done.wait(120) and req.error is None
            used = sorted(set(range(weights.config.num_blocks)) - set(runner.free_blocks))
            assert not used, "every block is free again"
            slots = torch.arange(len(PROMPTS[1]))  # the first request's blocks are the first ones popped
            rows = runner.kv.pool.tensor.view(torch.bfloat16) if hisparse else runner.kv.kv
            assert bool((rows[:, slots] == POISON).all()) and bool((runner.index_cache[:, slots] == POISON).all())
        finally:
            runner.stop()


def test_decode_whose_pull_fails_answers_an_error_never_a_recompute(pd):
    """kv_load_failure_policy=fail (rendered for decode): an unreachable prefill is a 500, counted as a
    failed NIXL transfer, and nothing is computed locally in its place."""
    _, decode = pd
    failed = decode.sample("vllm:nixl_num_failed_transfers", "_total")
    local = decode.sample("vllm:prompt_tokens_by_source", "_total", source="local_compute")
    r = httpx.post(decode.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4, "kv_transfer_params": {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[0]],
            "remote_engine_id": "gone", "remote_request_id": "cmpl-gone-0", "remote_host": "127.0.0.1",
            "remote_port": free_port(), "tp_size": 1}})  # fmt: skip
    assert r.status_code == 500 and "NIXL handshake" in r.json()["error"]["message"]
    assert decode.sample("vllm:nixl_num_failed_transfers", "_total") == failed + 1
    assert decode.sample("vllm:prompt_tokens_by_source", "_total", source="local_compute") == local


def test_prefill_reply_carries_vllms_kv_transfer_params(pd):
    prefill, _ = pd
    out = prefill.complete(prompt=PROMPTS[0], max_tokens=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})  # fmt: skip
    params = out["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_host"] == "127.0.0.1" and params["remote_port"] == prefill.side_channel
    assert params["remote_request_id"].startswith("cmpl-") and params["remote_engine_id"]
    assert len(params["remote_block_ids"][0]) == 1 and params["tp_size"] == 1  # 40 tokens, 64 per block


def test_metrics_carry_vllm_and_plugin_names(pd):
    prefill, decode = pd
    decode.complete(prompt=PROMPTS[0], max_tokens=4)
    families = decode.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                 "vllm:generation_tokens", "vllm:request_success", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:nixl_bytes_transferred", "hisparse_hot_buffer_hits", "hisparse_hot_buffer_misses",
                 "hisparse_swapped_in_bytes", "hisparse_host_pool_size_bytes", "hisparse_build_info"):  # fmt: skip
        assert name in families, name
    assert decode.sample("vllm:generation_tokens", "_total", model_name=MODEL, engine="0") >= 4
    assert decode.sample("vllm:time_to_first_token_seconds", "_count") >= 1
    assert decode.sample("hisparse_host_pool_size_bytes", model_name=MODEL) == 1 << 30
    # The HiSparse path really ran: top-k rows were resolved through the hot buffer.
    assert decode.sample("hisparse_hot_buffer_hits", "_total") + decode.sample("hisparse_hot_buffer_misses", "_total") > 0
    assert not any(s.value for s in prefill.metrics().get("hisparse_hot_buffer_hits", []))  # no HiSparse on prefill


def test_decode_readiness_probe_passes_against_the_engines(pd, tmp_path, monkeypatch):
    from hisparse_runtime.engine import KVTransferSettings, NixlSettings
    from hisparse_runtime.nixl_check import SourceBuffer, publish
    from hisparse_runtime.testing.pd_proxy import PDProxy

    monkeypatch.setenv("HISPARSE_STATE_DIR", str(tmp_path / "state"))
    prefill, decode = pd
    s = example_settings("hisparse-deployment.yaml", "decode")
    s = s.model_copy(update={"kv_transfer": KVTransferSettings(nixl=NixlSettings(link_check_port=free_port()))})
    before = decode.sample("vllm:nixl_bytes_transferred", "_count")
    with SourceBuffer(1 << 20, 4, backends=["UCX"]) as source, PDProxy(decode.url) as sidecar:
        publisher = publish(source, "127.0.0.1", s.kv_transfer.nixl.link_check_port)
        try:
            code, why = probes.ready(s, 60.0, vllm_port=decode.port, sidecar_port=sidecar.port,
                                     prefill_http_port=prefill.port)  # fmt: skip
        finally:
            publisher.close()
    assert code == probes.EXIT_OK, why
    assert decode.sample("vllm:nixl_bytes_transferred", "_count") == before + 1  # the probe's prompt was pulled
    assert podstate.age_seconds(podstate.DATA_PATH_OK) is not None
    proof = json.loads((tmp_path / "state" / podstate.DATA_PATH_OK).read_text())
    assert proof["prefill"] == "127.0.0.1" and proof["nixl_bytes_verified"] == 1 << 20, proof
    assert proof["completion_tokens"] == 1


# ---------------------------------------------------------------------------------------- drain
def test_sigterm_finishes_in_flight_requests_then_exits(hub, children, reference):
    port = free_port()
    argv = engine_argv(example_settings("hisparse-deployment.yaml", "decode"), port)
    assert argv[argv.index("--shutdown-timeout") + 1] == str(DRAIN_SECONDS)  # the rendered drain, nothing added
    engine = start_engine(children, hub, argv, port, VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
                          VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))  # fmt: skip
    result: dict = {}

    def long_request() -> None:
        r = httpx.post(engine.url + "/v1/completions", timeout=300,
                       json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 200, "return_token_ids": True})
        result["status"], result["body"] = r.status_code, r.json()

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 60
    while engine.sample("vllm:num_requests_running") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    engine.child.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    refused = httpx.post(engine.url + "/v1/completions", json={"model": MODEL, "prompt": [1], "max_tokens": 1}, timeout=30)
    assert refused.status_code == 503  # draining: new work is refused while in-flight work finishes
    t.join(300)
    assert engine.child.proc.wait(60) == 0
    assert result["status"] == 200 and result["body"]["choices"][0]["token_ids"] == reference(PROMPTS[0], 200)


def test_sigterm_with_vllms_default_timeout_aborts_in_flight(hub, children):
    """The negative control of the rendered ``--shutdown-timeout``: without it (vLLM's default, 0), SIGTERM
    aborts the request in flight."""
    port = free_port()
    argv = engine_argv(example_settings("deepseek-v32-single-node.yaml", "prefill"), port)
    i = argv.index("--shutdown-timeout")
    del argv[i:i + 2]
    engine = start_engine(children, hub, argv, port, VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
                          VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))  # fmt: skip
    result: dict = {}

    def long_request() -> None:
        r = httpx.post(engine.url + "/v1/completions", timeout=120,
                       json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 1500})
        result["status"] = r.status_code

    t = threading.Thread(target=long_request)
    t.start()
    deadline = time.monotonic() + 60
    while engine.sample("vllm:num_requests_running") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    engine.child.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert result["status"] == 503  # aborted, and answered
    assert engine.child.proc.wait(30) == 0


def test_entrypoint_runs_the_cpu_engine_and_drains_it_on_sigterm(hub, tmp_path, reference):
    """``hisparse-runtime serve`` with ``HISPARSE_SERVING_ENGINE=cpu``: the rendered decode argv served by
    the CPU engine, SIGTERM forwarded, the pod marked draining (live) while the in-flight request
    finishes, exit 0. Runs in a network namespace of its own, where the role's rendered port is free."""
    from hisparse_runtime.engine import KVTransferSettings, NixlSettings

    s = example_settings("hisparse-deployment.yaml", "decode")
    s = s.model_copy(update={"kv_transfer": KVTransferSettings(nixl=NixlSettings())})  # the rendered drain (120 s)
    config = tmp_path / "decode.json"
    config.write_text(json.dumps(s.to_json_dict()))
    env = {**hub_env(hub), "HISPARSE_SERVING_ENGINE": "cpu", "HISPARSE_STATE_DIR": str(tmp_path / "state"),
           "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}  # fmt: skip
    driver = f"ip link set lo up && exec {sys.executable} {__file__} {config} {PROMPTS[0][0]} {len(PROMPTS[0])}"
    child = Child(["unshare", "--net", "sh", "-c", driver], **env)
    try:
        result = child.next_json(900)
    finally:
        child.stop()
    assert result["exit_code"] == 0, result
    assert result["live_while_draining"] == [0, "draining: alive while vLLM shuts down and the host pool unpins"]
    assert result["refused_while_draining"] == 503
    assert result["http_while_draining"] == {LIVENESS_PATH: 200, READINESS_PATH: 503}
    # The checks ran while the request was still in flight: a drain that had ended would say nothing.
    assert result["in_flight_after_checks"], result
    assert result["status"] == 200 and result["token_ids"] == reference(PROMPTS[0], DRAIN_TOKENS)


DRAIN_TOKENS = 600
"""The request in flight at SIGTERM: long enough to outlast the checks made while the pod drains (with 100
tokens it once finished first under load, the entrypoint exited, and a check met a closed port)."""


def _entrypoint_driver(config: str, first: int, length: int) -> None:
    """Inside the namespace: start the entrypoint, load it, SIGTERM it, report one JSON line."""
    from rtsupport import cli

    prompt = list(range(first, first + length))
    proc = subprocess.Popen(cli("serve", "--role", "decode", "--config", config, "--skip-preflight"),
                            env=os.environ.copy(), stdout=subprocess.DEVNULL)  # fmt: skip
    url = "http://127.0.0.1:8200"
    out: dict = {}
    try:
        deadline = time.monotonic() + 500
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the engine never became healthy"
            time.sleep(0.2)

        def request() -> None:
            r = httpx.post(url + "/v1/completions", timeout=300, json={"model": MODEL, "prompt": prompt,
                           "max_tokens": DRAIN_TOKENS, "return_token_ids": True})  # fmt: skip
            out["status"], out["token_ids"] = r.status_code, r.json()["choices"][0].get("token_ids")

        t = threading.Thread(target=request)
        t.start()
        while "vllm:num_requests_running{" not in (m := httpx.get(url + "/metrics", timeout=5).text) or \
                'vllm:num_requests_running{engine="0",model_name="tiny-dsa"} 0.0' in m:  # fmt: skip
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        out["refused_while_draining"] = httpx.post(url + "/v1/completions", timeout=30,
                                                   json={"model": MODEL, "prompt": [1], "max_tokens": 1}).status_code
        out["live_while_draining"] = list(probes.live(None, 2.0))
        # What the kubelet sees: the entrypoint's own probe server, on the port the pod's probes name.
        out["http_while_draining"] = {path: httpx.get(f"http://127.0.0.1:{PROBE_PORT}{path}", timeout=30).status_code
                                      for path in (LIVENESS_PATH, READINESS_PATH)}
        out["in_flight_after_checks"] = t.is_alive()
        t.join(300)
        out["exit_code"] = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _entrypoint_driver(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
