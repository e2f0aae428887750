"""Estimators of the profile and the serving-time facade :class:`Predictor`."""
from predictors.predictor import Predictor

__all__ = ["Predictor"]
