"""Scoring: held-out evaluation, cross-validation, online (served) evaluation and the HTML report.

Consumers of predictions scored the way they are served: they may drive the simulator and the
serving code, and the CLI (``profiler``) calls them. docs/evaluation.md says what each figure is.
"""
