"""The host placement policy inside vLLM 0.33's own allocator code, on CPU.

``install`` patches ``HiSparseSourceManager.bind_host_pool``; these tests call the wheel's
``bind_host_pool`` (which builds vLLM's ``SharedEventQueueBlockPool``) and then drive vLLM's
``BlockPool`` methods (``get_new_blocks``, ``free_blocks``, ``touch``, hash eviction) with the policy
in place, against the same calls without it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed in this environment")

from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import HiSparseSourceManager  # noqa: E402

from hisparse_runtime.plugin import placement  # noqa: E402


@pytest.fixture(autouse=True)
def _stock_after() -> None:
    yield
    placement.install("vllm")
    assert placement.installed_policy() is None


def host_pool(num_blocks: int = 64) -> BlockPool:
    """The host pool exactly as vLLM's HiSparse host manager builds it (its own bind_host_pool)."""
    device_pool = BlockPool(8, enable_caching=True, hash_block_size=16)
    manager = SimpleNamespace(block_pool=device_pool, enable_caching=True,
                              kv_cache_spec=SimpleNamespace(prefix_cacheable=True))
    HiSparseSourceManager.bind_host_pool(manager, num_blocks)
    return manager.block_pool


def cache(pool: BlockPool, block, key: int) -> None:  # noqa: ANN001 - a vLLM KVCacheBlock
    h = make_block_hash_with_group_id(key.to_bytes(8, "little"), 0)
    block.set_block_hash(h, 16)
    pool.cached_block_hash_to_block.insert(h, block)


def churn(pool: BlockPool) -> list[int]:
    """Requests of a few blocks come and go (full blocks cached, freed tail first); the ids a late
    request is handed."""
    live: list[list] = []
    key = 0
    rng = np.random.default_rng(3)
    for _ in range(200):
        if live and (len(live) > 6 or rng.random() < 0.4):
            req = live.pop(int(rng.integers(len(live))))
            pool.free_blocks(reversed(req))
        n = int(rng.integers(1, 6))
        if n <= pool.get_num_free_blocks():
            blocks = pool.get_new_blocks(n)
            for b in blocks[:-1]:
                key += 1
                cache(pool, b, key)
            live.append(blocks)
        free = pool.free_block_queue.get_all_free_blocks()
        assert pool.get_num_free_blocks() == len(free)
        held = [b.block_id for req in live for b in req]
        assert len(held) == len(set(held)), "a block was handed out twice"
        assert not set(held) & {b.block_id for b in free}
    return sorted(b.block_id for req in live for b in req)


def test_install_patches_vllms_host_pool_and_restores_it() -> None:
    assert placement.install("pack") is True
    assert placement.install("pack") is True  # idempotent: no patch over the patch
    assert placement.installed_policy() == "pack"
    pool = host_pool()
    assert type(pool).__name__ == "SharedEventQueueBlockPool"  # vLLM's own host pool class
    assert type(pool.free_block_queue).__name__ == "PackedFreeBlockQueue"
    placement.install("vllm")
    assert type(host_pool().free_block_queue).__name__ == "FreeKVCacheBlockQueue"


def test_pack_hands_out_lowest_free_ids_uncached_first() -> None:
    placement.install("pack")
    pool = host_pool(16)
    a = pool.get_new_blocks(6)
    assert [b.block_id for b in a] == [1, 2, 3, 4, 5, 6]
    for i, b in enumerate(a[:3]):
        cache(pool, b, 100 + i)  # blocks 1-3 hold a prefix; 4-6 do not
    pool.free_blocks(reversed(a))
    # uncached blocks first, lowest id first (vLLM's stock pool would hand out 6, 5, 4 and then 7)
    assert [b.block_id for b in pool.get_new_blocks(4)] == [4, 5, 6, 7]
    # a prefix hit takes a cached block off the free list (vLLM's touch)
    hit = pool.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id((101).to_bytes(8, "little"), 0))
    assert hit is not None and hit.block_id == 2
    pool.touch([hit])
    rest = pool.get_new_blocks(pool.get_num_free_blocks())
    ids = [b.block_id for b in rest]
    assert ids == list(range(8, 16)) + [1, 3]  # cached blocks last, lowest first; 2 is held
    # vLLM's own eviction dropped the hashes of the cached blocks it handed out again
    assert pool.cached_block_hash_to_block.get_one_block(
        make_block_hash_with_group_id((100).to_bytes(8, "little"), 0)) is None
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


def test_stock_order_differs_on_the_same_calls() -> None:
    pool = host_pool(16)
    a = pool.get_new_blocks(6)
    pool.free_blocks(reversed(a))
    assert [b.block_id for b in pool.get_new_blocks(4)] != [1, 2, 3, 4]


def test_pack_keeps_a_churning_pool_low() -> None:
    stock = churn(host_pool(64))
    placement.install("pack")
    packed = churn(host_pool(64))
    assert len(packed) == len(stock)  # same requests held
    assert max(packed) < max(stock)


def test_policy_from_env_names_the_variable_and_choices() -> None:
    assert placement.policy_from_env({}) == "vllm"
    assert placement.policy_from_env({placement.ENV: "pack"}) == "pack"
    with pytest.raises(ValueError, match="HISPARSE_HOST_PLACEMENT='tight'.*pack, vllm"):
        placement.policy_from_env({placement.ENV: "tight"})


def test_hook_check_names_what_vllm_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert placement.hook_missing() is None
    monkeypatch.delattr(HiSparseSourceManager, "bind_host_pool")
    assert placement.hook_missing() == "HiSparseSourceManager.bind_host_pool"
