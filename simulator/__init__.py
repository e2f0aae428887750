"""Trace-driven simulator of an LLM serving cluster replaying agent workflows (``profiler simulate``).

It answers "what would this policy (or this cluster) do to my agents' job completion times?"
without a GPU, by replaying workflows closed-loop on a discrete-event model of SGLang-like
replicas, and comparing policies on the same calls, arrivals and hardware in one run.

==========================  ==============================================================
module                      job
==========================  ==============================================================
:mod:`.calibration`         iteration time ``t0 + a·P + a_ctx·X + c·K``, fit on measured logs
:mod:`.config`              cluster constants, each with its default's source
:mod:`.workload`            calls, dependencies, gaps and prompt prefix segments from records
:mod:`.cache`               per-replica radix-style prefix cache, GPU tier + host tier
:mod:`.engine`              the event loop: routing, admission, batching, preemption, accounting
:mod:`.policy`              what a policy decides: router, scheduler, cache policy
:mod:`.baselines`           sglang-default, least-load, autellix-plas, continuum-ttl,
                            mori-idleness, belady, oracle-srpt (references: belady, oracle-srpt)
:mod:`.ours`                ours: drives ``policies`` (+ ablation variants)
:mod:`.sources`             logs (ingest + split by workflow) or generated workloads; the
                            train-split profile
:mod:`.runner`              load levels, arrivals, one comparison over policies × loads
:mod:`.metrics`             JCT, throughput, TTFT, hit ratios, recompute, preemptions, idle
:mod:`.report`              terminal tables, Markdown, the JCT-vs-load PNG, ``--json``
==========================  ==============================================================
"""
