"""``Params``: ``get_params`` / ``set_params`` as scikit-learn's ``BaseEstimator`` defines them.

The sequence models of :mod:`synth` (``VariableOrderMarkov``, ``RemainingWork``) are estimators
under the project's contract (fit returns self, fitted attributes end in ``_``), but the serving
path imports them, and the serving path may not import scikit-learn (the ``serving-path-light``
contract). This mixin gives them the two methods ``sklearn.base.clone`` and the conformance test
(tests/test_estimator_conformance.py) need: the parameters are ``__init__``'s keyword arguments,
each stored under its own name.
"""
from __future__ import annotations

import inspect
from typing import Any


class Params:
    """``get_params`` / ``set_params`` over the keyword arguments of ``__init__``."""

    @classmethod
    def _param_names(cls) -> list[str]:
        return sorted(name for name, p in inspect.signature(cls.__init__).parameters.items()
                      if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The estimator's parameters by name (``deep`` is accepted for scikit-learn's callers:
        no parameter here is itself an estimator)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> "Params":
        """Set parameters by name; an unknown name is refused. Returns self."""
        names = self._param_names()
        for name, value in params.items():
            if name not in names:
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}; valid: {', '.join(names)}")
            setattr(self, name, value)
        return self
