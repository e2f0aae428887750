"""Fitting: the store's calls -> fitted models -> one profile version.

Above the store and the models (``synth``, ``predictors``' estimators), below everything that
serves or scores a profile. Modules:

``profile_fit``   the single-node fit (``profiler fit``): ingest, every section builder, write
``distributed``   the same fit as Ray tasks (``profiler fit --engine ray``)
"""
