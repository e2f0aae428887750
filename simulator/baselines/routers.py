"""Routers of the baselines: which replica a newly issued call goes to.

None of them knows a call's output length (they are non-clairvoyant, as deployed routers are).
"""
from __future__ import annotations

from collections import OrderedDict

from simulator.engine import Request
from simulator.policy import Router


def _serves(sim, req: Request, r: int) -> bool:
    """Does replica ``r`` still take new calls of ``req``'s pool? (An autoscaler may have moved
    or drained it; with fixed pools always true for a replica the router chose before.)"""
    return sim.pool_of_replica(r) == sim.pool_of_replica(sim.candidates(req)[0].idx)


class RoundRobin(Router):
    """SGLang router's ``round_robin`` policy: replicas in turn, whatever the session."""

    def __init__(self) -> None:
        self._next: dict[int, int] = {}

    def route(self, req: Request) -> int:
        reps = self.sim.candidates(req)
        key = self.sim.pool_of_replica(reps[0].idx)   # one turn counter per model pool
        n = self._next.get(key, 0)
        self._next[key] = n + 1
        return reps[n % len(reps)].idx


class LeastLoad(Router):
    """The replica with the fewest outstanding tokens (KV of running calls + waiting prompts)."""

    def route(self, req: Request) -> int:
        return min(self.sim.candidates(req), key=lambda rep: (rep.load_tokens(), rep.idx)).idx


class StickyLeastLoad(LeastLoad):
    """Session affinity: a workflow's calls go where its previous call ran (its KV is there);
    a new workflow goes to the least-loaded replica. Given to the cache-centric baselines
    (``continuum-ttl``, ``mori-idleness``, ``belady``), whose papers assume the session's KV is on
    the engine that serves it."""

    def __init__(self) -> None:
        self.home: dict[object, int] = {}

    def route(self, req: Request) -> int:
        key = self.sim.home_key(req)
        r = self.home.get(key)
        if r is None or not _serves(self.sim, req, r):   # new session, or its home left the pool
            r = self.home[key] = super().route(req)
        return r


class AutellixRouter(Router):
    """Autellix's load balancer: calls with prompts longer than ``long_prompt_tokens`` (2048) are
    pinned to the engine that served their program (data locality); shorter calls go to the
    least-used engine (fewest running + waiting calls)."""

    def __init__(self, long_prompt_tokens: int = 2048) -> None:
        self.long_prompt_tokens = long_prompt_tokens
        self.home: dict[object, int] = {}

    def route(self, req: Request) -> int:
        key = self.sim.home_key(req)
        home = self.home.get(key)
        if home is not None and not _serves(self.sim, req, home):   # its home left the pool
            home = None
        if req.call.input_tokens > self.long_prompt_tokens and home is not None:
            return home
        r = min(self.sim.candidates(req), key=lambda rep: (len(rep.running) + len(rep.waiting), rep.idx)).idx
        if req.call.input_tokens > self.long_prompt_tokens or home is None:
            self.home[key] = r
        return r


class CacheAware(Router):
    """SGLang router's default ``cache_aware`` policy (sgl-router, ``src/policies/cache_aware.rs``),
    at the defaults of ``py_src/sglang_router/router_args.py`` (``RouterArgs``: ``policy =
    "cache_aware"``, ``cache_threshold = 0.3``, ``balance_abs_threshold = 64``,
    ``balance_rel_threshold = 1.5``, ``eviction_interval_secs = 120``, ``max_tree_size = 2**26``).

    Per call, with ``load(r)`` = requests the router has in flight on replica ``r`` (running +
    waiting: what ``Worker::load()`` counts)::

        imbalanced = max_load − min_load > abs_threshold  and  max_load > rel_threshold · min_load
        imbalanced → the least-loaded replica
        else       → m = longest prefix match of the prompt in the router's approximate tree
                     m / prompt > cache_threshold → the replica holding that prefix
                     otherwise                    → the replica with the smallest tree

    and the chosen replica's tree gets the prompt either way. The tree is the router's own
    record of the text it sent each replica (it never asks the engines what they hold), so a
    prefix the engine already evicted still attracts its session. Every
    ``eviction_interval_s`` the least recently used entries of each replica's tree are evicted
    down to ``max_tree_size`` characters. The tree stores characters; the simulator has tokens,
    converted at ``chars_per_token`` (4, a common English BPE ratio). A prompt's path segments
    are inserted whole and the call's own segment with its prompt part only (the router never
    sees the output, so a later prompt's match stops inside the previous output). Ties between
    replicas holding the longest match go to the most recent access (the Rust tree returns one
    tenant of the deepest matched node).
    """

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, eviction_interval_s: float = 120.0,
                 max_tree_size: int = 2 ** 26, chars_per_token: float = 4.0) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_tokens = max_tree_size / chars_per_token
        self.counts = {"imbalanced": 0, "cache_hit": 0, "cache_miss": 0}

    def bind(self, sim) -> None:
        super().bind(sim)
        n = len(sim.replicas)
        #: per replica: segment -> [tokens recorded, last access], least recently used first
        #: (an access moves the entry to the end; simulated time never goes back, so the order
        #: is by last access and the entries of one instant are contiguous)
        self.tree: list[OrderedDict[int, list]] = [OrderedDict() for _ in range(n)]
        self.size = [0.0] * n
        self._next_evict = self.eviction_interval_s

    def on_replica_reset(self, replica: int) -> None:
        """A restarted worker: sgl-router drops its tree when a worker is removed."""
        self.tree[replica] = OrderedDict()
        self.size[replica] = 0.0

    def _match(self, r: int, path: tuple[int, ...]) -> tuple[float, float]:
        tree, tok = self.tree[r], self.sim.workload.seg_tokens
        got, last = 0.0, -1.0
        for s in path:
            e = tree.get(s)
            if e is None:
                break
            got += e[0]
            last = e[1]
            if e[0] < tok[s]:      # only the prompt part of an earlier call's own segment
                break
        return got, last

    def _insert(self, r: int, req: Request) -> None:
        tree, tok, now = self.tree[r], self.sim.workload.seg_tokens, self.sim.now
        call = req.call
        for s, n in [*((s, tok[s]) for s in call.path), (call.own_seg, call.own_prompt_tokens)]:
            e = tree.get(s)
            if e is None:
                tree[s] = [n, now]
                self.size[r] += n
            else:
                if n > e[0]:
                    self.size[r] += n - e[0]
                    e[0] = n
                e[1] = now
                tree.move_to_end(s)

    def _evict(self) -> None:
        for r, tree in enumerate(self.tree):
            # LRU first; among equal times the newer (deeper) segment first: leaves before parents.
            # The tree is kept in access order, so the oldest instant's entries lead it: take
            # them, newest segment first, until the tree fits (no sort of the whole tree).
            while self.size[r] > self.max_tree_tokens and tree:
                t = next(iter(tree.values()))[1]
                group = []
                for s, e in tree.items():
                    if e[1] != t:
                        break
                    group.append(s)
                for s in sorted(group, reverse=True):
                    self.size[r] -= tree.pop(s)[0]
                    if self.size[r] <= self.max_tree_tokens:
                        break

    def route(self, req: Request) -> int:
        sim = self.sim
        while sim.now >= self._next_evict:
            self._evict()
            self._next_evict += self.eviction_interval_s
        reps = sim.candidates(req)      # one router (tree) per model, as sgl-router keeps
        loads = [len(rep.running) + len(rep.waiting) for rep in reps]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            r = reps[loads.index(lo)].idx
            self.counts["imbalanced"] += 1
        else:
            best, best_t, r = 0.0, -1.0, -1
            for rep in reps:
                m, t = self._match(rep.idx, req.call.path)
                if m > best or (m == best and m > 0 and t > best_t):
                    best, best_t, r = m, t, rep.idx
            if r >= 0 and best / max(req.call.input_tokens, 1) > self.cache_threshold:
                self.counts["cache_hit"] += 1
            else:
                r = self._on_miss(reps, loads)
                self.counts["cache_miss"] += 1
        self._insert(r, req)
        return r

    def _on_miss(self, reps: list, loads: list[int]) -> int:
        """The replica a prompt without a good match goes to: the one with the smallest tree."""
        return min(reps, key=lambda rep: (self.size[rep.idx], rep.idx)).idx
