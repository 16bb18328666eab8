"""The translator against hostile text: linear patterns, size and depth limits, no exception escapes (issue 51)."""

from __future__ import annotations

import pickle
import re
import time

import pytest

from sloctl.serving.gateway import dialect, sql, trino
from sloctl.serving.gateway.dialect import MAX_CONSTRUCTOR_DEPTH, MAX_EXPRESSION_DEPTH, Catalog, Session, plan

CAT = Catalog("tpch", scratch=True)
SIZE = 100_000

#: Statement heads that lead the anchored patterns into their quantified parts.
HEADS = ("", "PREPARE q FROM ", "EXECUTE q USING ", "EXECUTE IMMEDIATE '", "SET SESSION slo_s = ",
         "SHOW TABLES FROM ", "SHOW SCHEMAS LIKE '", "USE ", "EXPLAIN ", "%", '"', "decimal(")
#: Bodies that make backtracking patterns explode: long runs of what two adjacent quantifiers both accept.
BODIES = (" " * SIZE, "'" * SIZE, "''" * (SIZE // 2), "a" * SIZE, "USING " * (SIZE // 6), ";" * SIZE,
          ('"' * SIZE), "a ." * (SIZE // 3), "0" * SIZE, " ;" * (SIZE // 2), "<Token token_type: TokenType.A" * 3000,
          "\t\n" * (SIZE // 2), "(" * SIZE)


def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    """Every compiled pattern at module level of the modules that read client text (new ones included)."""
    return [(f"{module.__name__.rsplit('.', 1)[-1]}.{name}", value)
            for module in (dialect, sql, trino) for name, value in vars(module).items()
            if isinstance(value, re.Pattern)]


#: The patterns the modules scan text with (finditer, findall, sub); the rest are only ever matched at the start.
SCANNERS = ("dialect._SCAN", "dialect._JAVA_SPEC", "dialect._IDENT_RE", "dialect._TOKEN_NAME")


@pytest.mark.parametrize("name, pattern", _patterns(), ids=[n for n, _ in _patterns()])
def test_every_pattern_answers_hostile_text_in_linear_time(name, pattern):
    slowest = 0.0
    for head in HEADS:
        for body in BODIES:
            text = head + body + "x"
            calls = [pattern.match, pattern.fullmatch]
            if name in SCANNERS:
                calls.append(lambda t: sum(1 for _ in pattern.finditer(t)))
            for call in calls:
                start = time.perf_counter()
                call(text)
                slowest = max(slowest, time.perf_counter() - start)
    # a backtracking pattern takes seconds to hours on 100 KB; a linear one a few ms, tens on a loaded machine
    assert slowest < 0.5, f"{name} took {slowest * 1000:.0f} ms on one 100 KB text"


def test_the_scanners_are_module_patterns():
    assert set(SCANNERS) <= {name for name, _ in _patterns()}


@pytest.mark.parametrize("depth", [50, 1000])
def test_nesting_past_the_depth_limit_is_a_trino_error(depth):
    got = plan("SELECT " + "(" * depth + "1" + ")" * depth, CAT)
    assert (got.kind, got.error_name) == ("refused", "QUERY_TEXT_TOO_LARGE")
    assert f"maximum expression depth of {MAX_EXPRESSION_DEPTH}" in got.message


def test_nesting_at_the_limit_still_translates():
    assert plan("SELECT " + "(" * MAX_EXPRESSION_DEPTH + "1" + ")" * MAX_EXPRESSION_DEPTH, CAT).kind == "query"
    nested = "SELECT " + "ARRAY[" * MAX_CONSTRUCTOR_DEPTH + "1" + "]" * MAX_CONSTRUCTOR_DEPTH
    assert plan(nested, CAT).kind == "query"
    deeper = "SELECT " + "ARRAY[" * (MAX_CONSTRUCTOR_DEPTH + 1) + "1" + "]" * (MAX_CONSTRUCTOR_DEPTH + 1)
    assert plan(deeper, CAT).error_name == "QUERY_TEXT_TOO_LARGE"


@pytest.mark.parametrize("text", ["SELECT " + "1 + " * 20_000 + "1", "SELECT " + "NOT " * 10_000 + "true",
                                  "SELECT " + "- " * 10_000 + "1"])
def test_long_operator_chains_are_refused_not_raised(text):
    got = plan(text, CAT)
    assert got.kind == "refused" and got.error_name == "SYNTAX_ERROR" and "\n" not in got.message


def test_a_megabyte_in_list_is_refused_within_the_planning_budget():
    text = f"SELECT * FROM nation WHERE n_nationkey IN ({', '.join(str(i) for i in range(150_000))})"
    assert len(text) > 1_000_000
    start = time.perf_counter()
    got = plan(text, CAT)
    assert time.perf_counter() - start < 2.0  # the planner's default budget (plan_timeout_s)
    assert (got.kind, got.error_name) == ("refused", "QUERY_TEXT_TOO_LARGE") and "tokens" in got.message


def test_strings_and_comments_do_not_count_toward_the_limits():
    text = "SELECT '" + "((((" * 1000 + "' /* " + "[[" * 1000 + " */"
    assert plan(text, CAT).kind == "query"


@pytest.mark.parametrize("failure, name", [(RecursionError("deep"), "SYNTAX_ERROR"),
                                           (KeyError("surprise"), "GENERIC_INTERNAL_ERROR"),
                                           (MemoryError(), "GENERIC_INTERNAL_ERROR")])
def test_a_translator_failure_becomes_a_refused_plan_without_output(monkeypatch, capsys, failure, name):
    def broken(*args, **kwargs):
        raise failure

    monkeypatch.setattr(dialect, "_translate", broken)
    dialect._checked.cache_clear()
    got = plan("SELECT 42 AS translator_failure_probe", CAT)
    assert (got.kind, got.error_name) == ("refused", name) and "\n" not in got.message
    assert capsys.readouterr() == ("", "")
    dialect._checked.cache_clear()


def test_plans_and_their_arguments_cross_a_process_boundary():
    session = Session(catalog="memory", schema="default", prepared={"q": "SELECT ?"}, user="ann", admin=False)
    args = pickle.loads(pickle.dumps(("EXECUTE q USING 1", CAT, session)))
    got = plan(*args)
    assert pickle.loads(pickle.dumps(got)) == got and got.kind == "query"


@pytest.mark.parametrize("benchmark", ["tpch", "tpcds"])
def test_benchmark_texts_still_translate_under_the_limits(benchmark):
    from sloctl.datasets.tpc import load_templates

    refused = [(t.name, got.error_name, got.message[:120]) for t in load_templates(benchmark)
               if (got := plan(t.sql, Catalog(benchmark))).kind == "refused"]
    assert refused == []
