"""query_frame gives the DataFrame ``.df()`` gives: same dtypes, same values, same NULLs."""
from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from store.frames import query_frame

QUERIES = [
    # text, integers, floats: no NULLs / some NULLs / all NULLs
    "SELECT 'w' || range AS s, range::INTEGER AS i, range::BIGINT AS b, range / 3 AS d, range % 2 = 0 AS t "
    "FROM range(5)",
    "SELECT CASE WHEN range % 2 = 0 THEN 'w' || range END AS s, "
    "CASE WHEN range % 2 = 1 THEN range END::INTEGER AS i, CASE WHEN range % 2 = 1 THEN range END AS b, "
    "CASE WHEN range % 2 = 1 THEN range / 3 END AS d, CASE WHEN range > 2 THEN range = 3 END AS t, "
    "range::TINYINT AS tiny, range::UBIGINT AS ub, NULL::SMALLINT AS small, range::FLOAT AS f FROM range(5)",
    "SELECT NULL::VARCHAR AS s, NULL::INTEGER AS i, NULL::DOUBLE AS d FROM range(3)",
    # no rows
    "SELECT 'x' AS s, 1::INTEGER AS i, 1.5 AS d, true AS t FROM range(0)",
    # types outside the Arrow set (lists, structs, dates) go through .df()
    "SELECT [range, NULL] AS l, {'a': range} AS st, DATE '2020-01-01' + range::INTEGER AS day, 'x' AS s "
    "FROM range(3) UNION ALL SELECT NULL, NULL, NULL, NULL",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_query_frame_equals_df(sql):
    con = duckdb.connect()
    expected, got = con.execute(sql).df(), query_frame(con, sql)
    assert list(got.columns) == list(expected.columns)
    assert list(got.dtypes) == list(expected.dtypes)
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    for column in expected:  # the same NA markers (None vs NaN vs pd.NA), not merely "both missing"
        assert [type(v) for v in got[column]] == [type(v) for v in expected[column]]


def test_query_frame_on_a_table_with_string_keys():
    con = duckdb.connect()
    con.execute("CREATE TABLE calls AS SELECT 'wt' || (range % 3) AS workflow_type_id, "
                "'wf-' || range AS workflow_id, CASE WHEN range % 7 > 0 THEN range END AS prev, "
                "range * 0.5 AS t FROM range(2000)")
    sql = "SELECT * FROM calls ORDER BY workflow_type_id, workflow_id"
    pd.testing.assert_frame_equal(query_frame(con, sql), con.execute(sql).df(), check_exact=True)


def test_query_frame_after_an_unfinished_execute():
    """A result of ``execute()`` read only in part (``fetchone``) does not block the query."""
    con = duckdb.connect()
    assert con.execute("SELECT * FROM range(10)").fetchone() == (0,)
    assert query_frame(con, "SELECT 41 + 1 AS x")["x"].tolist() == [42]
