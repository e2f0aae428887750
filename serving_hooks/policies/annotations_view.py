"""A typed, read-only view of what the policies know about one call.

:class:`CallView` is built from the annotation contract
(:class:`predictors.contract.Annotation`) — whichever shape the caller holds: the
nested ``sys_annotations`` the predictor returns, the flat ``custom_params`` the SGLang
scheduler sees, or the contract object itself. Its attributes are **generated** from the
contract's field declarations (:func:`predictors.contract.view_fields`): one attribute per flat
key (``pred_out_lo``, ``exp_remaining_calls``, ``p_end``, ``session_end``…) plus the fields
only the nested form carries (``expected_distance``, ``next_agents``, ``upper_bounds``), so a
field added to the contract appears here without an edit. Missing or malformed fields become
``None``: a prediction never fails a request, so a policy facing ``None`` falls back to its
documented neutral behaviour.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, make_dataclass
from functools import lru_cache
from typing import Any

from predictors.contract import Annotation, view_fields, view_values


class _CallViewMethods:
    """Methods of every generated view class (:func:`call_view_type`)."""

    __slots__ = ()
    #: the contract class the view is generated from
    contract: type = Annotation

    @property
    def session_id(self) -> str | None:
        """The workflow id: the unit whose KV the keep/drop policy retains."""
        return self.wf_id

    @classmethod
    def from_annotation(cls, ann: Annotation, app_metadata: Mapping[str, Any] | None = None,
                        tool: str | None = None) -> Any:
        """The view of a contract object. ``tool`` names the tool whose p95 is ``tool_p95_s``
        (default: the agent's most frequent tool, the contract's definition); ids missing from
        the annotation come from ``app_metadata``."""
        return cls(**view_values(ann, app_metadata, tool))

    @classmethod
    def from_custom_params(cls, params: Mapping[str, Any] | None) -> Any:
        """Read the flat dict the gateway forwards as ``custom_params`` (the contract's flat form)."""
        return cls.from_annotation(cls.contract.from_flat(params))

    @classmethod
    def from_sys_annotations(cls, ann: Mapping[str, Any] | Annotation | None,
                             app_metadata: Mapping[str, Any] | None = None,
                             tool: str | None = None) -> Any:
        """Read the nested sys_annotations (or a contract object) plus the client's app_metadata."""
        return cls.from_annotation(cls.contract.from_dict(ann, app_metadata), app_metadata, tool)


@lru_cache(maxsize=None)
def call_view_type(contract: type = Annotation) -> type:
    """The frozen view dataclass of a contract class (its attributes: :func:`view_fields`)."""
    spec = [(name, kind, field(default_factory=factory) if factory else field(default=default))
            for name, kind, default, factory in view_fields(contract)]
    view = make_dataclass("CallView", spec, bases=(_CallViewMethods,), frozen=True,
                          namespace={"__doc__": _DOC, "contract": contract})
    view.__module__ = __name__
    return view


_DOC = """What the profile predicted for one LLM call of one workflow session.

Attributes are the contract's flat keys (``known``, ``wf_type``, ``wf_id``, ``agent``,
``pred_out_lo``/``pred_out_hi`` (floats), ``priority`` (float), ``exp_remaining_calls``, ``next_agent``,
``tool_p95_s``, ``p_end``, ``session_end``…) and the nested-only ``expected_distance``,
``next_agents`` (``((agent, p), …)``) and ``upper_bounds`` (``((α, U(α)), …)``, largest α first);
the last three are only filled from the nested sys_annotations (the flat form carries the top
next agent alone, and no bound table)."""

#: The view of :class:`~predictors.contract.Annotation` (generated; see module doc).
CallView = call_view_type(Annotation)
