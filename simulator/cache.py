"""Per-replica prefix cache with a GPU tier and a host tier, radix-style over prompt segments.

The workload's segments (:mod:`simulator.workload`) form a tree: a segment's parent is the
segment before it on every prompt path. A replica's cache holds a set of segments per tier:

* **GPU tier** (capacity ``C`` tokens, shared with running requests' private KV): a segment is
  *locked* while a running request uses it, may be *pinned* by a policy until a time (a TTL), and
  is evicted **leaf first** as in SGLang's radix cache (only segments with no GPU-resident child
  are candidates), in the order a policy's key gives (smallest first: LRU = last access time).
* **host tier** (capacity ``host_ratio × C``): segments evicted from the GPU are written to host
  memory (HiCache-style write-back); a host hit is loaded back at ``pcie_s_per_token`` per token
  instead of being recomputed. The host tier evicts in its own key order.

A prompt's cached prefix is the longest run of path segments resident on the GPU, followed by the
longest run resident on the host (:meth:`ReplicaCache.match`).
"""
from __future__ import annotations

import heapq
from typing import Callable, Sequence

import numpy as np

#: Share of the host tier freed beyond need when it is full (batching host evictions).
HOST_EVICT_SLACK = 0.02

#: key(seg, now) -> float: segments with the smallest key are evicted first.
EvictKey = Callable[[int, float], float]


class EvictionOrder:
    """A tier's whole eviction order at once: ``order(tier, now)`` returns the segments of
    ``tier`` (seg -> last access) in the order a key would evict them (smallest first, ties by
    segment). A policy whose key is cheap to compute for every segment together (arrays) gives
    one instead of a per-segment key; the host tier then evicts along it."""

    def __init__(self, order: Callable[[dict, float], list]) -> None:
        self.order = order


def lru_order(tier: dict, now: float = 0.0) -> list:
    """Segments of ``tier`` by ``(last access, segment)``: the order of an LRU key."""
    n = len(tier)
    segs = np.fromiter(tier.keys(), np.int64, n)
    times = np.fromiter(tier.values(), np.float64, n)
    return segs[np.lexsort((segs, times))].tolist()


class ReplicaCache:
    """Resident segments of one replica (see the module docstring)."""

    def __init__(self, capacity: int, host_capacity: int, seg_tokens: Sequence[int],
                 seg_parent: Sequence[int]) -> None:
        self.capacity = int(capacity)
        self.host_capacity = int(host_capacity)
        self.seg_tokens = seg_tokens
        self.seg_parent = seg_parent
        self.gpu: dict[int, float] = {}          # seg -> last access time
        self.host: dict[int, float] = {}         # seg -> last access time
        self.lock: dict[int, int] = {}
        self.gpu_children: dict[int, int] = {}
        self.pinned: dict[int, float] = {}       # seg -> pinned until
        #: GPU segments with no GPU child and no lock: the eviction candidates (pins aside).
        self.leaves: set[int] = set()
        self.gpu_used = 0
        self.host_used = 0
        self.swap_used = 0
        self.locked_tokens = 0
        self.evicted_tokens = 0
        self.host_written_tokens = 0
        #: Called with (seg, tier) when a segment leaves a tier ("gpu" or "host").
        self.on_evict: Callable[[int, str], None] | None = None

    # --- lookup -------------------------------------------------------------------------------
    def match(self, path: Sequence[int]) -> tuple[int, int, int]:
        """``(gpu_tokens, host_tokens, n_gpu_segments)`` of the cached prefix of ``path``.

        The host run starts where the GPU run ends; it continues through segments that are on the
        host (a segment also on the GPU after a host miss cannot happen: eviction is leaf first).
        """
        gpu_tok = host_tok = 0
        n_gpu = 0
        gpu, host, tok = self.gpu, self.host, self.seg_tokens
        i, n = 0, len(path)
        while i < n and path[i] in gpu:
            gpu_tok += tok[path[i]]
            i += 1
        n_gpu = i
        while i < n and path[i] in host:
            host_tok += tok[path[i]]
            i += 1
        return gpu_tok, host_tok, n_gpu

    # --- GPU residency ------------------------------------------------------------------------
    def insert_gpu(self, seg: int, now: float) -> None:
        """Make ``seg`` resident on the GPU (computed or loaded back)."""
        if seg in self.gpu:
            self.gpu[seg] = now
            return
        self.gpu[seg] = now
        self.gpu_used += self.seg_tokens[seg]
        if seg not in self.lock and not self.gpu_children.get(seg):
            self.leaves.add(seg)
        p = self.seg_parent[seg]
        if p >= 0:
            self.gpu_children[p] = self.gpu_children.get(p, 0) + 1
            self.leaves.discard(p)

    def lock_path(self, segs: Sequence[int], now: float) -> None:
        for s in segs:
            n = self.lock.get(s, 0)
            if n == 0:
                self.locked_tokens += self.seg_tokens[s]
                self.leaves.discard(s)
            self.lock[s] = n + 1
            self.gpu[s] = now

    def unlock_path(self, segs: Sequence[int], now: float) -> None:
        for s in segs:
            n = self.lock[s] - 1
            if n == 0:
                del self.lock[s]
                self.locked_tokens -= self.seg_tokens[s]
                if not self.gpu_children.get(s):
                    self.leaves.add(s)
            else:
                self.lock[s] = n
            self.gpu[s] = now

    def pin(self, seg: int, until: float) -> None:
        """Keep ``seg`` on the GPU until ``until`` (a TTL); later pins extend, never shorten."""
        if seg in self.gpu and until > self.pinned.get(seg, -1.0):
            self.pinned[seg] = until

    def unpin(self, seg: int) -> None:
        self.pinned.pop(seg, None)

    def _evictable(self, seg: int, now: float) -> bool:
        if seg in self.lock or self.gpu_children.get(seg, 0) > 0:
            return False
        until = self.pinned.get(seg)
        if until is not None:
            if until > now:
                return False
            del self.pinned[seg]
        return True

    def evict_gpu(self, need: int, now: float, key: EvictKey | None,
                  host_key: EvictKey | EvictionOrder | None = None,
                  to_host: Callable[[int], bool] | None = None) -> int:
        """Evict unlocked, unpinned segments, leaf first in ``key`` order (None: LRU, the last
        access time), until ``need`` tokens are freed or nothing is evictable; returns the tokens
        freed. Evicted segments are written to the host tier when it has capacity (and
        ``to_host(seg)`` agrees), evicting there in ``host_key`` order (None: LRU)."""
        if need <= 0:
            return 0
        lru = key is None
        gpu = self.gpu
        # the candidates: leaves that are unlocked, childless and not pinned (an expired pin is
        # dropped on the way: ``_evictable`` inlined, it runs once per leaf and eviction)
        lock, children, pinned = self.lock, self.gpu_children, self.pinned
        heap = []
        for s in list(self.leaves):
            if s in lock or children.get(s, 0) > 0:
                continue
            until = pinned.get(s)
            if until is not None:
                if until > now:
                    continue
                del pinned[s]
            heap.append((gpu[s] if lru else key(s, now), s))
        heapq.heapify(heap)
        freed = 0
        while heap and freed < need:
            _, s = heapq.heappop(heap)
            if s not in self.gpu or not self._evictable(s, now):
                continue
            freed += self._drop_gpu(s)
            if self.host_capacity > 0 and (to_host is None or to_host(s)):
                self.insert_host(s, now, host_key)
            p = self.seg_parent[s]
            if p >= 0 and p in self.gpu and self._evictable(p, now):
                heapq.heappush(heap, (gpu[p] if lru else key(p, now), p))
        return freed

    def _drop_gpu(self, seg: int) -> int:
        del self.gpu[seg]
        self.leaves.discard(seg)
        self.pinned.pop(seg, None)
        t = self.seg_tokens[seg]
        self.gpu_used -= t
        self.evicted_tokens += t
        p = self.seg_parent[seg]
        if p >= 0:
            n = self.gpu_children[p] - 1
            if n:
                self.gpu_children[p] = n
            else:
                del self.gpu_children[p]
                if p in self.gpu and p not in self.lock:
                    self.leaves.add(p)
        if self.on_evict is not None:
            self.on_evict(seg, "gpu")
        return t

    # --- host tier ----------------------------------------------------------------------------
    def insert_host(self, seg: int, now: float, key: EvictKey | EvictionOrder | None = None) -> bool:
        """Write ``seg`` to host memory, evicting host segments (``key`` order, default LRU)."""
        t = self.seg_tokens[seg]
        if seg in self.host:
            self.host[seg] = now
            return True
        cap = self.host_capacity - self.swap_used
        if t > cap:
            return False
        if self.host_used + t > cap:
            # evict down to a low watermark (HOST_EVICT_SLACK of the tier below what this write
            # needs) so that one ordering pass serves many writes
            target = cap - t - int(self.host_capacity * HOST_EVICT_SLACK)
            if key is None or isinstance(key, EvictionOrder):
                # the whole order at once (LRU: by access time): no key call per segment
                order = lru_order(self.host) if key is None else key.order(self.host, now)
                for s in order:
                    if self.host_used <= target:
                        break
                    self.drop_host(s)
            else:
                heap = [(key(s, now), s) for s in self.host]
                heapq.heapify(heap)
                while heap and self.host_used > target:
                    _, s = heapq.heappop(heap)
                    self.drop_host(s)
        self.host[seg] = now
        self.host_used += t
        self.host_written_tokens += t
        return True

    def reserve_host(self, tokens: int, now: float) -> bool:
        """Claim host memory for swapped-out KV, evicting host segments (LRU); False if too big."""
        if tokens > self.host_capacity - self.swap_used:
            return False
        if self.host_used + self.swap_used + tokens > self.host_capacity:
            for s in sorted(self.host, key=self.host.get):
                self.drop_host(s)
                if self.host_used + self.swap_used + tokens <= self.host_capacity:
                    break
        self.swap_used += tokens
        return True

    def release_host(self, tokens: int) -> None:
        self.swap_used -= tokens

    def drop_host(self, seg: int) -> None:
        del self.host[seg]
        self.host_used -= self.seg_tokens[seg]
        if self.on_evict is not None:
            self.on_evict(seg, "host")

    def touch_host(self, seg: int, now: float) -> None:
        if seg in self.host:
            self.host[seg] = now
