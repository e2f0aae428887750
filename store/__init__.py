"""The ground floor: logs in, validated, kept in DuckDB; the profile artifact on disk.

Nothing here imports another package of the project (the ``store-stays-down`` import-linter
contract). Modules:

``duckdb_store``      the DuckDB schema and connection (``calls``, ``tool_calls``, ``quarantine``,
                      ``ingested_files``); one-line store errors
``ingest``            discover log files, stage, validate (``record_sql``), quarantine, insert
``record_sql``        the one set-based query that types a record or names its first problem
``derive``            per-workflow derived columns (position, neighbours, gaps) and ``tool_calls``
``frames``            query results as pandas frames through Arrow
``data_limits``       what the stored calls can teach (order-only times...): ``limitations``
``split``             split logs by workflow: train and test (``profiler split``), K folds
                      (``profiler eval --cv``)
``folds``             K folds by workflow of rows in memory (every estimator's cross-validation)
``profile_artifact``  the versioned profile folder: write, load, check, ``CURRENT``
``log_sources``       which logs a profile root was fitted from (``profiler fit`` refuses a different
                      log without ``--append``)
``faults``            fault-injection points for the crash-safety tests
``workloads``         seeded synthetic workloads from the specs in ``workload_specs/``
``importers``         other tools' traces (OpenTelemetry, SWE-agent, OpenHands, Claude Code...)
                      turned into our flat records
"""
