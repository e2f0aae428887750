"""The annotation contract: one typed model of the per-call prediction message.

The predictor's answer for one LLM call travels in several shapes — the nested JSON
``sys_annotations`` (what the sidecar returns and the gateway splices into a request), SGLang's
flat ``custom_params`` dict of scalars plus its integer ``priority``, and engine dialects rendered
from :meth:`Annotation.flat`. The policies, the gateway, the SGLang plugin and the simulator read
the :class:`Annotation` object itself (its fields and derived properties). All of them are derived from :class:`Annotation` by the functions of this
module, so **a field is added in one place**: declare it here, fill it in
``predictors.predictor.Predictor``, and every rendering, the sidecar's OpenAPI schema and the
parsers follow.

=====================================  ==============================================================
function                               does
=====================================  ==============================================================
:meth:`Annotation.from_dict`           today's ``sys_annotations`` JSON (lenient: malformed → None)
:meth:`Annotation.to_dict`             → that JSON (absent values omitted; same keys as before)
:meth:`Annotation.flat`                → flat dict of scalars (``None`` = unknown), the engine-neutral
                                       form a dialect renders (SGLang ``custom_params`` keys)
:func:`to_sglang_custom_params`        → SGLang's ``custom_params`` (= :meth:`Annotation.flat`)
:func:`from_custom_params`             SGLang's ``custom_params`` → :class:`Annotation` (the plugin)
:meth:`Annotation.sglang_priority`     → SGLang's integer ``priority`` (or None), the one rendering
                                       of the float score (:func:`sglang_priority`)
=====================================  ==============================================================

Definitions every consumer shares
---------------------------------
* ``tool_p95_s`` (:attr:`Annotation.tool_p95_s`) is the p95 of the agent's **most frequent** tool:
  the first entry of ``tool_latency``, which the predictor orders by frequency — the same tool
  whose keep-alive TTL is ``retain_s``. A consumer that knows which tool the call runs (the
  simulator, once the response names it) asks :meth:`Annotation.tool_p95_of` that tool instead.
* ``next_agent``/``next_agent_p`` are the most likely next agent and its probability.
* ``certified_alpha`` of ``output_len_upper``: bounds below the band's ``certified_alpha`` are its
  ceiling (``predictors.output_length``); the table is served as the profile wrote it.

Only the standard library is imported here: the serving path (sidecar, gateway, SGLang plugin)
loads this module without pandas, scipy, scikit-learn, SGLang or an HTTP stack. It sits next to
the ``Predictor`` facade that emits it (the lowest layer that produces the message), so the
facade needs nothing from the layers above it; ``policies`` re-exports it
(docs/architecture.md, "Annotation contract and policy bookkeeping").
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any

#: Keys every annotation echoes from app_metadata.
ID_KEYS = ("workflow_type_id", "workflow_id", "agent_id")


def num(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` (bools, strings and NaN are not numbers here)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def text(value: Any) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def _ident(value: Any) -> str | None:
    """An id as the flat form carries it (ints become strings)."""
    if isinstance(value, bool) or value is None or value == "":
        return None
    return str(value) if isinstance(value, (str, int)) else None


def _upper_table(value: Any) -> tuple[tuple[float, int], ...]:
    """``[[α, U], …]`` → ``((α, U), …)`` sorted by α descending; malformed entries are skipped."""
    out = []
    for item in value or ():
        if isinstance(item, (list, tuple)) and len(item) == 2:
            a, u = num(item[0]), num(item[1])
            if a is not None and u is not None and 0.0 < a < 1.0:
                out.append((a, int(u)))
    return tuple(sorted(out, reverse=True))


@dataclass(frozen=True, slots=True)
class ToolLatency:
    """Lognormal latency of one tool (``ln t ~ N(mu, sigma²)``) and its served quantiles (s)."""

    mu: float | None = None
    sigma: float | None = None
    p50_s: float | None = None
    p95_s: float | None = None
    ttl_s: float | None = None

    @classmethod
    def from_dict(cls, value: Any) -> "ToolLatency | None":
        if not isinstance(value, Mapping):
            return None
        return cls(*(num(value.get(f)) for f in TOOL_FIELDS))

    def to_dict(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in TOOL_FIELDS if getattr(self, f) is not None}


#: Fields of a tool-latency entry, in order.
TOOL_FIELDS = ("mu", "sigma", "p50_s", "p95_s", "ttl_s")


@dataclass(frozen=True, slots=True)
class NextAgent:
    """One possible next agent of the session and its probability."""

    agent_id: str
    p: float


# ---------------------------------------------------------------------------------------------
# Field codecs: how one kind of field is read from / written to each derived shape
# ---------------------------------------------------------------------------------------------
class Codec:
    """How one kind of :class:`Annotation` field travels in every derived shape.

    A field names its codec in its metadata (:func:`contract_field`); the shapes loop over the
    dataclass fields and ask the codec, so no shape lists fields by hand:

    * :meth:`parse` — a value of the nested JSON (``sys_annotations``) → the field's value
      (lenient: malformed → the empty value);
    * :meth:`dump` — the field's value → plain JSON;
    * :meth:`flatten` — the field's value → the scalars of its flat keys (one per key);
    * :meth:`unflatten` — those scalars back (what survives the flat form).

    ``flat_types`` are the types of the flat scalars (None: the field's own type).
    """

    flat_types: tuple[str, ...] | None = None
    #: the flat form is the value itself (one key, no conversion): the shapes skip the call
    scalar = True

    def parse(self, value: Any) -> Any:
        return num(value)

    def dump(self, value: Any) -> Any:
        return value

    def flatten(self, value: Any) -> tuple:
        return (value,)

    def unflatten(self, values: tuple) -> Any:
        return self.parse(values[0])


class _Text(Codec):
    def parse(self, value: Any) -> Any:
        return text(value)


class _Ident(Codec):
    def parse(self, value: Any) -> Any:
        return _ident(value)

    def unflatten(self, values: tuple) -> Any:
        return text(values[0])


class _Known(Codec):
    def parse(self, value: Any) -> Any:
        return value is True


class _OptBool(Codec):
    def parse(self, value: Any) -> Any:
        return value if isinstance(value, bool) else None


#: SGLang's integer ``priority`` is ``round(score · PRIORITY_SCALE)`` of the float priority score
#: (bigger runs first), clamped to ``±PRIORITY_LIMIT``: SGLang keeps it in a Python int and
#: compares it; well inside int64.
PRIORITY_SCALE = 1000.0
PRIORITY_LIMIT = 2**62


def sglang_priority(score: float, scale: float = PRIORITY_SCALE) -> int:
    """The one rendering of a priority score as SGLang's integer ``priority`` (bigger first)."""
    value = int(round(score * scale))
    return max(-PRIORITY_LIMIT, min(PRIORITY_LIMIT, value))


class _Priority(Codec):
    """The float priority score in process; every wire form (JSON, flat ``custom_params``) carries
    SGLang's integer :func:`sglang_priority` of it, as before the score was a float."""

    flat_types = ("int | None",)
    scalar = False

    def parse(self, value: Any) -> Any:
        n = num(value)
        return n / PRIORITY_SCALE if n is not None else None

    def dump(self, value: Any) -> Any:
        return sglang_priority(value)

    def flatten(self, value: Any) -> tuple:
        return (sglang_priority(value) if value is not None else None,)

    def unflatten(self, values: tuple) -> Any:
        return self.parse(values[0])


class _Band(Codec):
    """``(lo, hi)`` ↔ ``[lo, hi]`` ↔ flat ``pred_out_lo``, ``pred_out_hi``."""

    flat_types = ("int | None", "int | None")
    scalar = False

    def parse(self, value: Any) -> Any:
        if isinstance(value, (list, tuple)) and len(value) == 2:
            lo, hi = num(value[0]), num(value[1])
            if lo is not None and hi is not None:
                return (int(lo), int(hi))
        return None

    def dump(self, value: Any) -> Any:
        return [value[0], value[1]]

    def flatten(self, value: Any) -> tuple:
        return (value[0], value[1]) if value else (None, None)

    def unflatten(self, values: tuple) -> Any:
        return self.parse(values)


class _Upper(Codec):
    def parse(self, value: Any) -> Any:
        return _upper_table(value)

    def dump(self, value: Any) -> Any:
        return [[a, u] for a, u in value]


class _Tools(Codec):
    """``{tool: ToolLatency}``; the flat form keeps the first (most frequent) tool's p95."""

    flat_types = ("float | None",)
    scalar = False

    def parse(self, value: Any) -> Any:
        out = {}
        if isinstance(value, Mapping):
            for name, entry in value.items():
                parsed = ToolLatency.from_dict(entry)
                if parsed is not None:
                    out[str(name)] = parsed
        return out

    def dump(self, value: Any) -> Any:
        return {k: v.to_dict() for k, v in value.items()}

    def flatten(self, value: Any) -> tuple:
        return (next((e.p95_s for e in value.values()), None),)

    def unflatten(self, values: tuple) -> Any:
        p95 = num(values[0])
        return {FLAT_TOOL: ToolLatency(p95_s=p95)} if p95 is not None else {}


class _NextAgents(Codec):
    """Next agents, most likely first; the flat form keeps the first one and its probability."""

    flat_types = ("str | None", "float | None")
    scalar = False

    def parse(self, value: Any) -> Any:
        nexts = [NextAgent(item["agent_id"], float(item["p"])) for item in value or ()
                 if isinstance(item, Mapping) and text(item.get("agent_id"))
                 and num(item.get("p")) is not None]
        return tuple(sorted(nexts, key=lambda n: -n.p))

    def dump(self, value: Any) -> Any:
        return [{"agent_id": n.agent_id, "p": n.p} for n in value]

    def flatten(self, value: Any) -> tuple:
        return (value[0].agent_id, value[0].p) if value else (None, None)

    def unflatten(self, values: tuple) -> Any:
        nxt, p = text(values[0]), num(values[1])
        return (NextAgent(nxt, p),) if nxt and p is not None else ()


class _Floats(Codec):
    def parse(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return {}
        return {str(k): float(v) for k, v in value.items() if num(v) is not None}

    def dump(self, value: Any) -> Any:
        return dict(value)


class _Strings(Codec):
    def parse(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return {}
        return {str(k): v for k, v in value.items() if isinstance(v, str)}

    def dump(self, value: Any) -> Any:
        return dict(value)


NUM, TEXT, IDENT, KNOWN, OPT_BOOL, PRIORITY = Codec(), _Text(), _Ident(), _Known(), _OptBool(), _Priority()
BAND, UPPER, TOOLS, NEXTS, FLOATS, STRINGS = (_Band(), _Upper(), _Tools(), _NextAgents(),
                                               _Floats(), _Strings())


def contract_field(default: Any = None, codec: Codec = NUM, *, flat: str | tuple[str, ...] = (),
                   header: str | tuple[str | None, ...] | None = None, factory: Any = None) -> Any:
    """One :class:`Annotation` field, declared once with every name it has in a derived shape.

    ``codec`` reads and writes it (:class:`Codec`); ``flat`` names its key(s) in the flat form
    (SGLang ``custom_params``, vLLM ``vllm_xargs``; none: the field is not flat); ``header`` the
    ``X-Agentprof-<name>`` header of each flat key (None: no header)."""
    keys = (flat,) if isinstance(flat, str) else tuple(flat)
    headers = ((None,) * len(keys) if header is None else
               (header,) if isinstance(header, str) else tuple(header))
    if len(headers) != len(keys):
        raise ValueError(f"contract field: {len(headers)} header(s) for flat keys {keys}")
    meta = {"codec": codec, "flat": keys, "headers": headers}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class Annotation:
    """What the profile predicts for one LLM call (``sys_annotations``).

    ``known: false`` (unknown workflow type or agent, too little data, shadow mode, off path, no
    profile) carries only the ids, a ``reason`` and its ``detail``: serve the call reactively.

    Every field is declared once, here, with its codec and its names in the derived shapes
    (:func:`contract_field`); the JSON, flat, header and OpenAPI shapes are generated from these
    declarations. Policies read the fields and the derived properties below directly.
    """

    #: OpenAPI descriptions from the attribute docstrings (pydantic reads this dict, no import)
    __pydantic_config__ = {"use_attribute_docstrings": True}

    profile_version: str | None = contract_field(None, TEXT, flat="profile_version",
                                                 header="Profile-Version")
    """version of the profile that made the prediction"""
    known: bool = contract_field(False, KNOWN, flat="known", header="Known")
    """true: the fields below are a prediction; false: serve the call reactively"""
    workflow_type_id: str | None = contract_field(None, IDENT, flat="wf_type", header="Workflow-Type")
    """echoed from app_metadata"""
    workflow_id: str | None = contract_field(None, IDENT, flat="wf_id", header="Workflow-Id")
    """echoed from app_metadata (the session)"""
    agent_id: str | None = contract_field(None, IDENT, flat="agent", header="Agent")
    """echoed from app_metadata"""
    reason: str | None = contract_field(None, TEXT)
    """why ``known`` is false: missing_app_metadata, no_profile, unknown_workflow_type, shadow, unknown_agent, too_little_data, off_path"""
    detail: str | None = contract_field(None, TEXT)
    """human-readable detail of ``reason``"""
    predicted_output_len: tuple[int, int] | None = contract_field(
        None, BAND, flat=("pred_out_lo", "pred_out_hi"), header=("Output-Lo", "Output-Hi"))
    """``(lo, hi)`` output-length band (tokens) at ``output_len_coverage``"""
    output_len_coverage: float | None = contract_field()
    """probability the output length falls in the band"""
    output_len_level: str | None = contract_field(None, TEXT)
    """level the band was fit at: agent, workflow_type, global, conditional…"""
    output_len_mean: float | None = contract_field(flat="pred_out_mean")
    """the agent's mean output length (tokens)"""
    output_len_upper: tuple[tuple[float, int], ...] = contract_field((), UPPER)
    """``((α, U(α)), …)``, largest α first: one-sided (1 − α) upper bounds of the output length"""
    session_age_s: float | None = contract_field(flat="session_age_s")
    """seconds since the session's first call (workflow-level aging)"""
    tool_latency: Mapping[str, ToolLatency] = contract_field(codec=TOOLS, flat="tool_p95_s", factory=dict)
    """the agent's most frequent tools (most frequent first)"""
    retain_s: float | None = contract_field(flat="retain_s")
    """keep-alive TTL (SAGA) of the most frequent tool, when it has one"""
    keep_alive_ttl_s: float | None = contract_field(flat="keep_alive_ttl_s")
    """keep-alive TTL from the idle gap (finish → the session's next call), session-scaled"""
    keep_alive_ttl_by_tool: Mapping[str, float] = contract_field(codec=FLOATS, factory=dict)
    """``{tool: TTL}`` when the idle-gap tool level validated"""
    next_agents: tuple[NextAgent, ...] = contract_field(
        (), NEXTS, flat=("next_agent", "next_agent_p"), header=("Next-Agent", "Next-Agent-P"))
    """possible next agents, most likely first"""
    predicted_path_regex: str | None = contract_field(None, TEXT)
    """the workflow type's dominant paths as a regex over agents"""
    expected_remaining_calls: float | None = contract_field(flat="exp_remaining_calls",
                                                            header="Remaining-Calls")
    """expected calls after this one"""
    expected_remaining_s: float | None = contract_field(flat="exp_remaining_s", header="Remaining-S")
    """expected seconds of LLM and tool time left in the workflow"""
    remaining_calls_p50: float | None = contract_field()
    """median of the calls left (sequence model)"""
    remaining_calls_p90: float | None = contract_field()
    """0.9 quantile of the calls left (sequence model)"""
    expected_remaining_output_tokens: float | None = contract_field(flat="exp_remaining_out_tokens")
    """expected output tokens the session still has to generate, this call's included (the work
    an SRPT scheduler ranks by; ``predictors.remaining_tokens``)"""
    remaining_output_tokens_p50: float | None = contract_field()
    """median of the session's remaining output tokens"""
    remaining_output_tokens_p90: float | None = contract_field()
    """0.9 quantile of the session's remaining output tokens"""
    expected_remaining_decode_s: float | None = contract_field()
    """the remaining output tokens at the workflow type's measured decode speed (seconds)"""
    expected_distance: Mapping[str, float] = contract_field(codec=FLOATS, factory=dict)
    """expected distance in calls to each agent"""
    p_end: float | None = contract_field(flat="p_end", header="P-End")
    """probability that no call follows this one"""
    on_path: bool | None = contract_field(None, OPT_BOOL)
    """whether the session is on the automaton's dominant paths (sequence-model profiles)"""
    prompt_composition: Mapping[str, str] = contract_field(codec=STRINGS, factory=dict)
    """prompt templates of the likely next agents"""
    priority: float | None = contract_field(None, PRIORITY, flat="priority")
    """the call's priority score (bigger runs first), set by the serving layer's priority policy
    (``policies.PriorityPolicy.call_priority``); the JSON and flat forms carry
    SGLang's integer ``priority``, ``round(score · 1000)``"""
    latency_class: str | None = contract_field(None, TEXT, flat="latency_class", header="Latency-Class")
    """``"interactive"`` (a person waits on this session's answers: rank for time to first token)
    or ``"batch"`` (rank for job completion); None = not classified"""
    session_end: bool | None = contract_field(None, OPT_BOOL, flat="session_end",
                                              header="Session-End")
    """true: the serving side may release this session's KV once the call finishes — set by the
    gateway (not the predictor) when ``app_metadata.last_call`` is true or ``p_end`` reaches its
    ``--session-end-p`` (docs/dialects.md, "End of session")"""

    # ------------------------------------------------------------------ derived
    @property
    def output_lo(self) -> int | None:
        return self.predicted_output_len[0] if self.predicted_output_len else None

    @property
    def output_hi(self) -> int | None:
        return self.predicted_output_len[1] if self.predicted_output_len else None

    @property
    def next_agent(self) -> NextAgent | None:
        """The most likely next agent."""
        return self.next_agents[0] if self.next_agents else None

    @property
    def next_agent_id(self) -> str | None:
        """Id of the most likely next agent (the flat form's ``next_agent``)."""
        return self.next_agents[0].agent_id if self.next_agents else None

    @property
    def next_agent_p(self) -> float | None:
        """Probability of the most likely next agent (the flat form's ``next_agent_p``)."""
        return self.next_agents[0].p if self.next_agents else None

    @property
    def tool_p95_s(self) -> float | None:
        """p95 of the agent's most frequent tool (the first ``tool_latency`` entry; module doc)."""
        for entry in self.tool_latency.values():
            return entry.p95_s
        return None

    def tool_p95_of(self, tool: str | None) -> float | None:
        """p95 of ``tool`` (None: :attr:`tool_p95_s`)."""
        if tool is None:
            return self.tool_p95_s
        entry = self.tool_latency.get(tool)
        return entry.p95_s if entry is not None else None

    @property
    def upper_tail_alpha(self) -> float | None:
        """Risk of the band's ``hi`` alone: the upper tail ``(1 − coverage)/2`` of a 2-sided band."""
        return (1.0 - self.output_len_coverage) / 2 if self.output_len_coverage is not None else None

    def sglang_priority(self) -> int | None:
        """SGLang's integer ``priority`` of :attr:`priority` (None: let the engine decide)."""
        return sglang_priority(self.priority) if self.priority is not None else None

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, ann: "Mapping[str, Any] | Annotation | None",
                  app_metadata: Mapping[str, Any] | None = None) -> "Annotation":
        """Read the ``sys_annotations`` JSON (malformed values become their empty value).

        Ids missing from ``ann`` are taken from ``app_metadata``; an :class:`Annotation` is
        returned as it is."""
        if isinstance(ann, Annotation):
            return ann
        a = ann if isinstance(ann, Mapping) else {}
        meta = app_metadata if isinstance(app_metadata, Mapping) else {}
        values = {}
        for name, codec, _, is_id in _plan(cls):
            raw = a.get(name)
            if raw is None and is_id:
                raw = meta.get(name)
            values[name] = codec.parse(raw)
        return cls(**values)

    @classmethod
    def from_flat(cls, params: Mapping[str, Any] | None) -> "Annotation":
        """Inverse of :meth:`flat` (what survives the flat form: one tool, one next agent, no
        bound table or distances). The single tool is named ``"_first"``."""
        p = params if isinstance(params, Mapping) else {}
        return cls(**{name: codec.unflatten(tuple(p.get(k) for k in keys))
                      for name, codec, keys, _ in _plan(cls) if keys})

    # ---------------------------------------------------------------- rendering
    def to_dict(self) -> dict[str, Any]:
        """The ``sys_annotations`` JSON: every field with a value (None, empty tables and empty
        maps omitted; ``profile_version``, ``known`` and the ids always present)."""
        out: dict[str, Any] = {}
        for name, codec, _, _ in _plan(type(self)):
            value = getattr(self, name)
            if name in _ALWAYS:
                out[name] = value
            elif value is None or (isinstance(value, (tuple, Mapping)) and not value
                                   and not self._keep_empty(name)):
                continue
            else:
                out[name] = codec.dump(value)
        if not self.known:
            return {k: v for k, v in out.items() if k in _UNKNOWN_KEYS}
        return out

    def _keep_empty(self, name: str) -> bool:
        """Known annotations carry ``tool_latency`` even empty, and the path fields
        (``next_agents``, ``expected_distance``) even empty when the profile has an automaton."""
        return name == "tool_latency" or (name in _PATH_KEYS and self.predicted_path_regex is not None)

    def flat(self, app_metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The flat dict of scalars (``None`` = unknown) every engine dialect renders from; its
        keys are SGLang's ``custom_params`` keys (:func:`flat_keys`, in field order). Ids missing
        from the annotation come from ``app_metadata``."""
        meta = app_metadata if isinstance(app_metadata, Mapping) else {}
        out: dict[str, Any] = {}
        for name, codec, keys, is_id in _flat_plan(type(self)):
            value = getattr(self, name)
            if value is None and is_id:
                value = _ident(meta.get(name))
            if codec.scalar:
                out[keys[0]] = value
            else:
                out.update(zip(keys, codec.flatten(value)))
        return out


# ---------------------------------------------------------------------------------------------
# Shapes derived from the field declarations
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _plan(cls: type) -> tuple[tuple[str, Codec, tuple[str, ...], bool], ...]:
    """``(name, codec, flat keys, is an id)`` of every field of ``cls``, read once per class (the
    shapes run per call: no ``fields()`` or metadata lookups on the hot path)."""
    return tuple((f.name, f.metadata["codec"], f.metadata["flat"], f.name in ID_KEYS)
                 for f in fields(cls))


@lru_cache(maxsize=None)
def _flat_plan(cls: type) -> tuple[tuple[str, Codec, tuple[str, ...], bool], ...]:
    """The fields of :func:`_plan` that have flat keys."""
    return tuple(p for p in _plan(cls) if p[2])


@lru_cache(maxsize=None)
def flat_keys(cls: type = Annotation) -> tuple[str, ...]:
    """Keys of :meth:`Annotation.flat` (SGLang's ``custom_params``), in field order."""
    return tuple(k for f in fields(cls) for k in f.metadata["flat"])


@lru_cache(maxsize=None)
def header_fields(cls: type = Annotation) -> tuple[tuple[str, str], ...]:
    """``(header suffix, flat key)`` of every flat key that has a header (the ``headers``
    dialect sends ``X-Agentprof-<suffix>``)."""
    return tuple((h, k) for f in fields(cls) for k, h in zip(f.metadata["flat"], f.metadata["headers"])
                 if h is not None)


#: Name of the one tool entry the flat form carries back (:meth:`Annotation.from_flat`).
FLAT_TOOL = "_first"
_ALWAYS = frozenset(("profile_version", "known", *ID_KEYS))
_UNKNOWN_KEYS = frozenset((*_ALWAYS, "reason", "detail", "session_end", "latency_class"))
_PATH_KEYS = frozenset(("next_agents", "expected_distance"))
#: Keys of :meth:`Annotation.flat` (SGLang's ``custom_params``), in order.
FLAT_KEYS = flat_keys(Annotation)


def to_sglang_custom_params(annotation: Annotation | Mapping[str, Any],
                            app_metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """SGLang's flat ``custom_params`` (the scheduler sees it as ``req.sampling_params.custom_params``)
    for an annotation (or its JSON); every key of :data:`FLAT_KEYS` is present."""
    return Annotation.from_dict(annotation, app_metadata).flat(app_metadata)


def from_custom_params(params: Mapping[str, Any] | None) -> Annotation:
    """Read SGLang's ``custom_params`` back into the contract (the plugin's side)."""
    return Annotation.from_flat(params)
