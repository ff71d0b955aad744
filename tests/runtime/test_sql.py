"""The statement loader, as plain functions: named placeholders, one namespace across files."""

from __future__ import annotations

import re

import pytest

from venturi._db import sql


def test_named_placeholders_compile_to_positions_in_order_of_first_use() -> None:
    stmt = sql.compile_statement(
        "s", "SELECT * FROM t WHERE a = :queue AND b = ANY(:kinds::text[]) AND c = :queue"
    )
    assert stmt.text == "SELECT * FROM t WHERE a = $1 AND b = ANY($2::text[]) AND c = $1"
    assert stmt.params == ("queue", "kinds")
    assert stmt.args({"kinds": ["k"], "queue": "q"}) == ("q", ["k"])


def test_strings_identifiers_comments_and_casts_are_left_alone() -> None:
    body = """SELECT ':not' AS "a:b", x::int, 'it''s :x' -- a comment: :nope
FROM t WHERE y = :y"""
    stmt = sql.compile_statement("s", body)
    assert stmt.params == ("y",)
    assert stmt.text == body.replace(":y", "$1")


def test_positional_placeholders_are_refused() -> None:
    with pytest.raises(ValueError, match=r"statement 's': positional placeholder \$1"):
        sql.compile_statement("s", "SELECT $1, :a")


def test_arguments_must_match_the_parameters() -> None:
    stmt = sql.compile_statement("s", "SELECT :a, :b")
    with pytest.raises(TypeError, match=re.escape("statement 's': missing parameters ['b']")):
        stmt.args({"a": 1})
    with pytest.raises(TypeError, match=re.escape("unknown parameters ['c']")):
        stmt.args({"a": 1, "c": 2})
    with pytest.raises(TypeError, match=re.escape("missing parameters ['b']; unknown parameters")):
        stmt.args({"a": 1, "c": 2, "d": 3})
    one = sql.compile_statement("one", "SELECT :a")
    assert one.args({"a": 5}) == (5,)
    none = sql.compile_statement("none", "SELECT 1")
    assert none.args({}) == ()


def test_files_share_one_namespace_and_a_name_defined_twice_is_an_error() -> None:
    a = "-- about a\n\n-- first --\n-- doc\nSELECT :x;\n\n-- second --\nSELECT 2;\n"
    b = "-- third --\nSELECT 3;\n"
    found = sql.parse({"a.sql": a, "b.sql": b})
    assert sorted(found) == ["first", "second", "third"]
    assert found["first"].text == "SELECT $1;"  # the doc comment is not part of it
    with pytest.raises(ValueError, match=re.escape("'first' is defined in a.sql and c.sql")):
        sql.parse({"a.sql": a, "c.sql": "-- first --\nSELECT 1;\n"})
    with pytest.raises(ValueError, match=re.escape("'first' is defined twice in a.sql")):
        sql.parse({"a.sql": a + "-- first --\nSELECT 1;\n"})


def test_sql_outside_a_block_is_an_error() -> None:
    with pytest.raises(ValueError, match=re.escape("x.sql: SQL before the first")):
        sql.parse({"x.sql": "SELECT 1;\n-- named --\nSELECT 2;\n"})


def test_the_shipped_statements_load_and_render_for_a_prefix() -> None:
    queries = sql.queries("acme")
    assert {"job_insert", "job_claim", "job_settle_many", "stats", "savepoint"} <= set(queries)
    for stmt in queries.values():
        assert "{prefix}" not in stmt.text
        code = re.sub(r"'(?:[^']|'')*'", "''", stmt.text)  # string literals may hold colons
        assert not re.search(r"(?<!:):[a-z_]", code), f"{stmt.name}: uncompiled parameter"
    assert "acme_jobs" in queries["job_insert"].text
    # Numbered in order of first appearance: the scalars of the select list, then the columns.
    assert queries["job_insert"].params[:4] == ("kind", "queue", "priority", "batch_id")
