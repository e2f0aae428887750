"""From sys_annotations to the bytes the upstream receives.

Three jobs, each a pure function:

* :func:`find_app_metadata` — where the client put ``app_metadata``: at the top level of the
  request body (what the OpenAI Python SDK sends for ``extra_body={"app_metadata": ...}``: it
  merges ``extra_body`` into the JSON body) or nested under a literal ``extra_body`` key (clients
  that send the field as is).
* :func:`flatten_for_sglang` — SGLang drops undeclared request fields, so the scheduler only sees
  ``priority`` (int) and ``custom_params`` (a flat dict of scalars, read by the plugin as
  ``req.sampling_params.custom_params``). Both are derived from the annotation contract
  (:func:`predictors.contract.to_sglang_custom_params`, re-exported here under its
  older name).
* :func:`forward_body` — the request body sent upstream. When the only change is adding new
  top-level keys, they are spliced in right after the opening ``{`` of the client's bytes, so
  every byte the client sent is forwarded unchanged (and a 100 kB prompt is not re-encoded).
  Only when a key must be changed in place (nested ``extra_body``, an existing key, metadata
  stripped) is the body re-serialized.
"""
from __future__ import annotations

import json
from typing import Any

from predictors.contract import Annotation, to_sglang_custom_params

#: The flat ``custom_params`` of an annotation (the contract's one function, older name).
flatten_for_sglang = to_sglang_custom_params

def find_app_metadata(body: Any) -> tuple[dict | None, str | None]:
    """``(app_metadata, where)`` with where ``"top"`` or ``"extra_body"``; ``(None, None)`` if absent."""
    if not isinstance(body, dict):
        return None, None
    meta = body.get("app_metadata")
    if isinstance(meta, dict):
        return meta, "top"
    extra = body.get("extra_body")
    if isinstance(extra, dict) and isinstance(extra.get("app_metadata"), dict):
        return extra["app_metadata"], "extra_body"
    return None, None


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()  # never NaN/Infinity


def forward_body(raw: bytes, body: dict, where: str | None, sys_annotations: dict | None, *,
                 sglang_fields: bool = False, strip_metadata: bool = False,
                 request_stream_usage: bool = False, extra_fields: dict | None = None) -> bytes:
    """The body to send upstream (see module doc).

    ``sys_annotations`` None means "not annotated" (fail-open): the annotation keys are not added.
    ``sglang_fields`` adds ``priority`` (when the annotations carry one) and ``custom_params``;
    ``strip_metadata`` removes ``app_metadata`` and does not add ``sys_annotations`` (for
    upstreams that reject unknown fields); ``request_stream_usage`` sets
    ``stream_options.include_usage`` so a streamed response reports token counts;
    ``extra_fields`` are top-level keys set as given — an engine dialect's body patch
    (:func:`serving_hooks.dialects.render`; the gateway renders SGLang's fields that way too).
    """
    add: dict[str, Any] = {}
    replace: dict[str, Any] = {}
    if sys_annotations is not None and not strip_metadata:
        if where == "extra_body":
            extra = dict(body["extra_body"])
            extra["sys_annotations"] = sys_annotations
            replace["extra_body"] = extra
        else:
            add["sys_annotations"] = sys_annotations
    if sys_annotations is not None and sglang_fields:
        meta = find_app_metadata(body)[0]
        contract = Annotation.from_dict(sys_annotations, meta)
        if contract.sglang_priority() is not None:
            add["priority"] = contract.sglang_priority()
        flat = contract.flat(meta)
        client_params = body.get("custom_params")
        add["custom_params"] = {**client_params, **flat} if isinstance(client_params, dict) else flat
    if extra_fields:  # an engine dialect's body patch
        add.update(extra_fields)
    if request_stream_usage:
        options = body.get("stream_options")
        add["stream_options"] = {**options, "include_usage": True} if isinstance(options, dict) \
            else {"include_usage": True}
    for key in list(add):
        if key in body:
            replace[key] = add.pop(key)
    if strip_metadata and (where is not None):
        if where == "top":
            replace["app_metadata"] = None
        else:
            extra = dict(replace.get("extra_body", body["extra_body"]))
            extra.pop("app_metadata", None)
            replace["extra_body"] = extra
    if not add and not replace:
        return raw
    if not replace and body:
        start = len(raw) - len(raw.lstrip())
        if raw[start:start + 1] == b"{":
            spliced = b"".join(_dumps(k) + b":" + _dumps(v) + b"," for k, v in add.items())
            return raw[: start + 1] + spliced + raw[start + 1:]
    out = dict(body)
    for key, value in replace.items():
        if key == "app_metadata" and value is None:
            out.pop(key, None)
        else:
            out[key] = value
    out.update(add)
    return _dumps(out)
