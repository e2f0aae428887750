"""Query results as pandas DataFrames, through Arrow.

``con.execute(sql).df()`` builds every text value as a Python ``str`` and pandas then packs them
into its string array again: for a million rows with four text columns that is 1–1.5 s of a fit's
single-threaded time. The Arrow route hands DuckDB's columns over in bulk (about a third of the
time on the 1M-call store: ``ok_calls`` 1.6 s -> 0.6 s).

The frame is the one ``.df()`` gives, dtype for dtype and value for value, for results made of
the column types a fit reads (text, integers, floats, booleans); ``.df()``'s rules are kept:

* an integer or boolean column *with NULLs* becomes a pandas nullable column (``Int64``,
  ``boolean``…), where Arrow alone would give ``float64`` / ``object``;
* a text column whose values are all NULL (or that has no rows) stays ``object`` holding
  ``None`` — pandas infers its string dtype only from a column holding a string.

A result with any other column type (lists, structs, dates…) is fetched with ``.df()`` itself.
tests/test_frames.py compares both routes column type by column type.
"""
from __future__ import annotations

import duckdb
import pandas as pd
import pyarrow as pa

#: Arrow type -> the pandas nullable dtype ``.df()`` gives such a column when it holds NULLs.
_NULLABLE = {
    pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
    pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype(), pa.bool_(): pd.BooleanDtype(),
}
#: DuckDB column types the Arrow route converts exactly like ``.df()``.
ARROW_TYPES = frozenset({"VARCHAR", "DOUBLE", "FLOAT", "BOOLEAN", "TINYINT", "SMALLINT", "INTEGER",
                         "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"})


def query_frame(con: duckdb.DuckDBPyConnection, sql: str) -> pd.DataFrame:
    """The result of the query ``sql`` as the DataFrame ``con.execute(sql).df()`` returns (same
    columns, dtypes and values), built through Arrow when every column's type allows."""
    if hasattr(con, "complete"):  # DuckDB 2: a relation waits until execute()'s last result is done
        con.complete()
    rel = con.sql(sql)
    if not all(str(t) in ARROW_TYPES for t in rel.types):
        return rel.df()
    # DuckDB 1.x names it fetch_arrow_table; 2.x to_arrow_table (the old name warns)
    table = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.fetch_arrow_table()
    frame = table.to_pandas()
    for i, f in enumerate(table.schema):
        column = table.column(i)
        if f.type in _NULLABLE and column.null_count:
            frame[f.name] = column.to_pandas(types_mapper=_NULLABLE.get)
        elif pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            if column.null_count == len(column):
                frame[f.name] = pd.Series([None] * len(column), index=frame.index, dtype=object)
    return frame
