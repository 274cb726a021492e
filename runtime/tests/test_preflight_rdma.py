"""Preflight's RDMA device check against a fake /dev/infiniband and sysfs laid out as a node's are: one
``uverbsN`` per verbs device the plugin mounted, ``class/infiniband_verbs/uverbsN/ibdev`` naming its HCA."""

from __future__ import annotations

from pathlib import Path

from hisparse_runtime.engine import KVTransferSettings, ModelSettings, ParallelSettings, RoleSettings
from hisparse_runtime.engine.kv_transfer import MooncakeStoreSettings
from hisparse_runtime.preflight import EXIT_CODES, PreflightContext, checks
from hisparse_runtime.preflight.facts import rdma_verbs_devices


def node(tmp_path: Path, devices: dict[str, str]) -> tuple[Path, Path]:
    """``devices``: uverbs name -> HCA name (empty: sysfs has no entry for it)."""
    dev, sysfs = tmp_path / "dev-infiniband", tmp_path / "sys"
    dev.mkdir(parents=True)
    (dev / "rdma_cm").write_text("")  # present beside the verbs devices on real nodes; not one of them
    for uverbs, hca in devices.items():
        (dev / uverbs).write_text("")
        if hca:
            entry = sysfs / "class" / "infiniband_verbs" / uverbs
            entry.mkdir(parents=True)
            (entry / "ibdev").write_text(hca + "\n")
    return dev, sysfs


def settings(role: str = "prefill", rdma: int = 0, device_name: str = "", protocol: str = "rdma") -> RoleSettings:
    return RoleSettings(
        role=role,
        model=ModelSettings(source="pvc://models/glm-5.2", served_model_name="glm", index_topk=2048),
        image="img",
        parallelism=ParallelSettings(gpus_per_node=8, tensor_parallel_size=8),
        kv_transfer=KVTransferSettings(mooncake=MooncakeStoreSettings(enabled=bool(device_name), protocol=protocol,
                                                                      device_name=device_name)),
        rdma_devices=rdma,
    )


def run(s: RoleSettings, dev: Path, sysfs: Path):
    return checks.rdma_devices(PreflightContext(settings=s, env={}, rdma_dev=dev, sysfs=sysfs))


def test_the_reader_maps_verbs_devices_to_their_hca(tmp_path: Path) -> None:
    dev, sysfs = node(tmp_path, {"uverbs0": "mlx5_0", "uverbs1": "mlx5_1", "uverbs7": ""})
    assert rdma_verbs_devices(dev, sysfs) == {"uverbs0": "mlx5_0", "uverbs1": "mlx5_1", "uverbs7": None}
    assert rdma_verbs_devices(tmp_path / "absent", sysfs) == {}


def test_not_run_when_the_role_asks_for_no_rdma_device(tmp_path: Path) -> None:
    dev, sysfs = node(tmp_path, {})
    assert run(settings(), dev, sysfs) is None
    assert run(settings(device_name="mlx5_0", protocol="tcp"), dev, sysfs) is None  # Mooncake over TCP
    assert run(settings(role="decode", device_name="mlx5_0"), dev, sysfs) is None  # the store is prefill's


def test_passes_when_the_requested_devices_are_there(tmp_path: Path) -> None:
    dev, sysfs = node(tmp_path, {"uverbs0": "mlx5_0", "uverbs1": "mlx5_1"})
    outcome = run(settings(rdma=2, device_name="mlx5_0,mlx5_1"), dev, sysfs)
    assert outcome is not None and outcome.ok, outcome
    assert "mlx5_0 (uverbs0)" in outcome.message


def test_fails_when_the_plugin_gave_the_pod_fewer_devices_than_requested(tmp_path: Path) -> None:
    dev, sysfs = node(tmp_path, {"uverbs0": "mlx5_0"})
    outcome = run(settings(role="decode", rdma=2), dev, sysfs)
    assert outcome is not None and not outcome.ok and outcome.exit_code == EXIT_CODES["rdma_devices"] == 43
    assert "spec.decode.rdma asks for 2" in outcome.message and "sees 1" in outcome.message
    assert "rdma.resourceName" in outcome.message  # the fix
    none = run(settings(role="decode", rdma=1), *node(tmp_path / "empty", {}))
    assert none is not None and not none.ok and "none" in none.message


def test_fails_when_mooncake_names_a_device_the_pod_does_not_have(tmp_path: Path) -> None:
    dev, sysfs = node(tmp_path, {"uverbs0": "mlx5_0", "uverbs1": "mlx5_1"})
    outcome = run(settings(rdma=1, device_name="mlx5_0,mlx5_3"), dev, sysfs)
    assert outcome is not None and not outcome.ok and outcome.exit_code == 43
    assert "deviceName names mlx5_3" in outcome.message and "mlx5_0, mlx5_1" in outcome.message
    assert "leave deviceName empty" in outcome.message


def test_the_check_is_last_in_exit_code_order() -> None:
    assert checks.CHECKS[-1] is checks.rdma_devices
    assert [EXIT_CODES[c.__name__] for c in checks.CHECKS] == sorted(EXIT_CODES[c.__name__] for c in checks.CHECKS)
