"""The two-tier radix cache: leaf-first eviction, write-back to host, matching, pins."""
from __future__ import annotations

from simulator.cache import ReplicaCache

# segment tree: 0 (100 tokens) → 1 (50) → 2 (30);  0 → 3 (40)
TOKENS = [100, 50, 30, 40]
PARENT = [-1, 0, 1, 0]


def lru(cache):
    return lambda s, now: cache.gpu[s]


def filled(host=0):
    c = ReplicaCache(1000, host, TOKENS, PARENT)
    for t, s in enumerate([0, 1, 2, 3]):
        c.insert_gpu(s, float(t))
    return c


def test_match_walks_gpu_run_then_host_run():
    c = filled(host=1000)
    c.evict_gpu(30 + 50, 10.0, lru(c))      # leaf 2 (t=2) goes first, then its parent 1 (t=1)
    assert 2 not in c.gpu and 1 not in c.gpu and 1 in c.host and 2 in c.host
    assert c.match([0, 1, 2]) == (100, 80, 1)
    assert c.match([0, 3]) == (140, 0, 2)


def test_eviction_is_leaf_first_and_skips_locked_paths():
    c = filled()
    c.lock_path([0, 1, 2], 5.0)
    freed = c.evict_gpu(1000, 6.0, lru(c))
    assert freed == 40 and set(c.gpu) == {0, 1, 2}    # only the unlocked leaf could go
    c.unlock_path([0, 1, 2], 7.0)
    assert c.evict_gpu(1000, 8.0, lru(c)) == 180 and not c.gpu and c.gpu_used == 0


def test_pins_block_eviction_until_they_expire():
    c = filled()
    c.pin(3, until=10.0)
    c.evict_gpu(1000, 5.0, lru(c))
    assert 3 in c.gpu and 0 in c.gpu            # 3 is pinned, so its parent is not a leaf
    assert c.evict_gpu(1000, 11.0, lru(c)) == 140


def test_host_tier_evicts_to_make_room_and_accounts_tokens():
    c = filled(host=120)
    c.evict_gpu(70, 10.0, lru(c))     # leaf 2 (30), then its parent 1 (t=1, older than leaf 3)
    assert set(c.host) == {1, 2} and c.host_used == 80
    c.evict_gpu(50, 11.0, lru(c))     # leaf 3 (40) then 0 (100): the host tier drops LRU segments
    assert c.host_used <= 120 and 0 in c.host and not c.gpu
