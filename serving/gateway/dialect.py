"""Trino SQL as the gateway's DuckDB clusters run it: dialect, catalog, prepared statements, SHOW.

A Trino client sends Trino SQL in a Trino session (``X-Trino-Catalog``,
``X-Trino-Schema``, ``X-Trino-Prepared-Statement``). :func:`plan` turns one
request into what the gateway does with it, without running anything:

* **translated**: the text is parsed as Trino (sqlglot, ``read="trino"``) and
  written as DuckDB (``write="duckdb"``): ``date_add('day', 1, d)``,
  ``approx_distinct``, ``element_at``, ``regexp_like``, ``from_unixtime``,
  ``json_extract_scalar``, ``date_format``, ``format`` ... Where sqlglot's
  DuckDB text would still answer differently, the translation adds what
  Trino does: a division whose divisor is an exact zero fails with
  ``DIVISION_BY_ZERO`` (the clusters run with DuckDB's ``integer_division``,
  so ``7 / 2`` is ``3`` as in Trino). Results are cached per text.
* **catalog**: the warehouse is one Trino catalog (:class:`Catalog`, named
  after the database file unless configured); unqualified tables resolve in
  the session's schema, ``catalog.schema.table`` names work, and
  ``information_schema`` (``schemata``, ``tables``, ``columns``, ``views``)
  and ``system.jdbc``, ``system.metadata`` and ``system.runtime.nodes`` answer in Trino's layouts and
  type names, from DuckDB's own catalog on the cluster.
* **emulated**: ``SHOW CATALOGS | SCHEMAS | TABLES | COLUMNS | CREATE TABLE |
  FUNCTIONS | SESSION``, ``DESCRIBE``, ``USE``, ``SET SESSION`` / ``RESET
  SESSION``, ``PREPARE … FROM``, ``EXECUTE … USING``, ``EXECUTE IMMEDIATE``,
  ``DEALLOCATE PREPARE``. Session changes travel back as Trino's response
  headers (``X-Trino-Set-Catalog``, ``X-Trino-Added-Prepare``, ...); the
  client keeps them and sends them with its next request, as with Trino.
* **passed through**: text sqlglot cannot read as Trino but DuckDB's parser
  takes (``x::HUGEINT``, ``FROM range(10)``, ``GROUP BY ALL``) runs as
  DuckDB SQL, as written.
* **refused**: anything but a query (``INSERT``, ``CREATE``, ...) is
  ``PERMISSION_DENIED``; text neither parser reads is a ``SYNTAX_ERROR``
  with sqlglot's account of where Trino's grammar stopped.
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sloctl.serving.gateway.sql import SESSION_PROPERTIES, check_statement
from sloctl.serving.gateway.trino import SIMPLE_TYPES

__all__ = ["Catalog", "Plan", "Session", "parse_prepared", "plan"]

_IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][\w$]*)'
_NAME = rf"{_IDENT}(?:\s*\.\s*{_IDENT}){{0,2}}"
_LIKE = r"(?:\s+LIKE\s+('(?:[^']|'')*')(?:\s+ESCAPE\s+('(?:[^']|'')*'))?)?"
_END = r"\s*;?\s*$"
_FLAGS = re.IGNORECASE | re.DOTALL
_USE = re.compile(rf"^\s*USE\s+({_IDENT})(?:\s*\.\s*({_IDENT}))?{_END}", _FLAGS)
_PREPARE = re.compile(rf"^\s*PREPARE\s+({_IDENT})\s+FROM\s+(.+?){_END}", _FLAGS)
_DEALLOCATE = re.compile(rf"^\s*DEALLOCATE\s+PREPARE\s+({_IDENT}){_END}", _FLAGS)
_EXECUTE_IMMEDIATE = re.compile(rf"^\s*EXECUTE\s+IMMEDIATE\s+'((?:[^']|'')*)'(?:\s+USING\s+(.+?))?{_END}", _FLAGS)
_EXECUTE = re.compile(rf"^\s*EXECUTE\s+({_IDENT})(?:\s+USING\s+(.+?))?{_END}", _FLAGS)
_SHOW_CATALOGS = re.compile(rf"^\s*SHOW\s+CATALOGS{_LIKE}{_END}", _FLAGS)
_SHOW_SCHEMAS = re.compile(rf"^\s*SHOW\s+SCHEMAS(?:\s+(?:FROM|IN)\s+({_IDENT}))?{_LIKE}{_END}", _FLAGS)
_SHOW_TABLES = re.compile(rf"^\s*SHOW\s+TABLES(?:\s+(?:FROM|IN)\s+({_NAME}))?{_LIKE}{_END}", _FLAGS)
_SHOW_COLUMNS = re.compile(rf"^\s*(?:SHOW\s+COLUMNS\s+(?:FROM|IN)|DESCRIBE|DESC)\s+({_NAME}){_END}", _FLAGS)
_SHOW_CREATE = re.compile(rf"^\s*SHOW\s+CREATE\s+(?:TABLE|VIEW)\s+({_NAME}){_END}", _FLAGS)
_SHOW_FUNCTIONS = re.compile(rf"^\s*SHOW\s+FUNCTIONS{_LIKE}{_END}", _FLAGS)
_SHOW_SESSION = re.compile(rf"^\s*SHOW\s+SESSION{_LIKE}{_END}", _FLAGS)
_EXPLAIN = re.compile(r"^\s*EXPLAIN(\s+ANALYZE)?\s+(.+)$", _FLAGS)


@dataclass(frozen=True)
class Catalog:
    """The warehouse as one Trino catalog.

    Attributes:
        name: what clients call it (``X-Trino-Catalog``, ``SHOW CATALOGS``,
            ``catalog.schema.table``); on the clusters it is DuckDB's default
            database, so names go there with their schema alone.
        schema: the schema unqualified names resolve in when the session names none.
    """

    name: str
    schema: str = "main"
    scratch: bool = False  # a writable `memory` catalog is offered (the gateway's scratch worker)


@dataclass(frozen=True)
class Session:
    """What a request's Trino session says: catalog, schema and prepared statements (name → text)."""

    catalog: str | None = None
    schema: str | None = None
    prepared: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What to do with one request.

    Attributes:
        kind: ``query`` (run :attr:`sql` on a cluster), ``local`` (answer
            :attr:`columns` / :attr:`rows` and :attr:`headers` at once) or
            ``refused`` (a Trino error: :attr:`error_name`, :attr:`message`).
        sql: the DuckDB text to run.
        template_sql: the text whose hash names the query's template: the
            statement as written, or a prepared statement's text with its ``?``.
        names: each output column's Trino name (``_colN`` for an unnamed
            expression; ``None`` where DuckDB's name is right); ``None``: not known.
        headers: Trino response headers that change the client's session.
    """

    kind: str
    sql: str = ""
    template_sql: str = ""
    names: tuple[str | None, ...] | None = None
    headers: tuple[tuple[str, str], ...] = ()
    target: str = "cluster"  # where a query runs: a cluster, or "scratch" (the memory catalog's worker)
    columns: tuple[tuple[str, str], ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    error_name: str = ""
    message: str = ""


def _refused(name: str, message: str) -> Plan:
    return Plan("refused", error_name=name, message=message)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _unquote(ident: str) -> str:
    ident = ident.strip()
    if ident.startswith('"') and ident.endswith('"'):
        return ident[1:-1].replace('""', '"')
    return ident.lower()


def _parts(name: str) -> list[str]:
    return [_unquote(p) for p in re.findall(_IDENT, name)]


def parse_prepared(header: str | None) -> dict[str, str]:
    """``X-Trino-Prepared-Statement: a=SELECT%20%3F,b=...`` → ``{"a": "SELECT ?", ...}``.

    Raises:
        ValueError: an entry is not ``name=url-encoded text``.
    """
    out: dict[str, str] = {}
    for part in (header or "").split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ValueError(f"The X-Trino-Prepared-Statement header must hold name=statement pairs, got {part!r}.")
        name, text = part.split("=", 1)
        out[urllib.parse.unquote(name.strip()).lower()] = urllib.parse.unquote_plus(text.strip())
    return out


# -- Trino's catalog views, computed on the cluster from DuckDB's own ---------------------------------
def _type_case(column: str) -> str:
    """SQL turning a DuckDB type name in ``column`` into Trino's (as :func:`.trino.trino_type` does)."""
    whens = " ".join(f"WHEN {_literal(k)} THEN {_literal(v)}" for k, v in SIMPLE_TYPES.items())
    return (f"CASE upper({column}) {whens} ELSE CASE WHEN {column} LIKE 'DECIMAL(%' "
            f"THEN lower(replace({column}, ' ', '')) ELSE lower({column}) END END")


@functools.lru_cache(maxsize=16)
def _views(cat: Catalog, scratch: bool = False) -> dict[tuple[str, str, str], str]:
    """``(catalog, schema, table)`` → the DuckDB query that answers it in Trino's layout.

    On a cluster the warehouse is DuckDB's default database; on the scratch
    worker it is attached under the catalog's name.
    """
    c, db = _literal(cat.name), _literal(cat.name) if scratch else "current_database()"
    schemata = (f"SELECT {c} AS catalog_name, schema_name FROM information_schema.schemata "
                f"WHERE catalog_name = {db} UNION SELECT {c}, 'information_schema'")
    tables = (f"SELECT {c} AS table_catalog, table_schema, table_name, table_type FROM information_schema.tables "
              f"WHERE table_catalog = {db}")
    columns = (f"SELECT {c} AS table_catalog, table_schema, table_name, column_name, "
               f"CAST(ordinal_position AS BIGINT) AS ordinal_position, column_default, is_nullable, "
               f"{_type_case('data_type')} AS data_type, COLUMN_COMMENT AS comment, "
               f"CAST(NULL AS VARCHAR) AS extra_info FROM information_schema.columns WHERE table_catalog = {db}")
    views = (f"SELECT {c} AS table_catalog, table_schema, table_name, view_definition "
             f"FROM information_schema.views WHERE table_catalog = {db}")
    return {
        (cat.name, "information_schema", "schemata"): schemata,
        (cat.name, "information_schema", "tables"): tables,
        (cat.name, "information_schema", "columns"): columns,
        (cat.name, "information_schema", "views"): views,
        ("system", "jdbc", "catalogs"): (f"SELECT * FROM (VALUES ({c}), ('system')"
                                         f"{', (' + _literal('memory') + ')' if cat.scratch else ''}) AS t(table_cat)"),
        ("system", "jdbc", "schemas"): (f"SELECT schema_name AS table_schem, catalog_name AS table_catalog "
                                        f"FROM ({schemata})"),
        ("system", "metadata", "table_comments"): (
            f"SELECT {c} AS catalog_name, schema_name, table_name, comment FROM duckdb_tables() "
            f"WHERE database_name = {db}"),
        ("system", "metadata", "catalogs"): (f"SELECT * FROM (VALUES ({c}, {c}, 'duckdb'), ('system', 'system', "
                                             f"'system')) AS t(catalog_name, connector_id, connector_name)"),
        ("system", "runtime", "nodes"): ("SELECT 'sloctl-gateway' AS node_id, '' AS http_uri, "
                                         "'sloctl' AS node_version, true AS coordinator, 'active' AS state"),
    }


# -- translation ---------------------------------------------------------------------------------------
class _PlanError(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name, self.message = name, message


def _output_names(tree: Any) -> tuple[str | None, ...] | None:
    """Each output column's name as Trino gives it: alias or column name; ``None`` (→ ``_colN``) otherwise."""
    from sqlglot import exp

    while isinstance(tree, exp.SetOperation):
        tree = tree.this
    if not isinstance(tree, exp.Select):
        return None
    names: list[str | None] = []
    for e in tree.expressions:
        if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
            return None
        names.append(e.alias if isinstance(e, exp.Alias) else e.name if isinstance(e, exp.Column) else None)
    return tuple(names)


def _tables(tree: Any) -> list[Any]:
    """The named tables ``tree`` reads or writes (not table functions, not its CTEs)."""
    from sqlglot import exp

    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    return [t for t in tree.find_all(exp.Table) if isinstance(t.this, exp.Identifier)
            and not (not t.db and t.name.lower() in ctes)]


def _catalog_of(table: Any, cat: Catalog, catalog: str | None) -> str:
    """The catalog a table name resolves in (its own, else the session's, else the warehouse)."""
    return (table.catalog or catalog or cat.name).lower()


def _resolve_tables(tree: Any, cat: Catalog, catalog: str | None, schema: str | None, scratch: bool) -> None:
    """Qualify names for where the query runs: the session's schema, the catalog's name there, Trino's views."""
    import sqlglot
    from sqlglot import exp

    views = _views(cat, scratch)
    names = f"'{cat.name}', 'system'" + (" and 'memory'" if cat.scratch else "")
    for table in _tables(tree):
        name, cat_name = table.name, _catalog_of(table, cat, catalog)
        session_schema = schema if cat_name == (catalog or cat.name).lower() else None
        db = table.db or session_schema or ("default" if cat_name == "memory" else cat.schema)
        key = (cat_name, db.lower(), name.lower())
        if key in views:
            alias = table.alias or name
            table.replace(exp.Subquery(this=sqlglot.parse_one(views[key], read="duckdb"),
                                       alias=exp.TableAlias(this=exp.to_identifier(alias))))
            continue
        if cat_name == "memory" and cat.scratch:
            table.set("catalog", exp.to_identifier("memory"))
        elif cat_name == cat.name.lower():  # on the scratch worker the warehouse is attached under its name
            table.set("catalog", exp.to_identifier(cat.name) if scratch else None)
        else:
            raise _PlanError("CATALOG_NOT_FOUND", f"Catalog '{cat_name}' not found (this gateway has {names}).")
        table.set("db", exp.to_identifier(db, quoted=db.lower() == "default"))


def _guard_divisions(tree: Any) -> None:
    """``a / b`` fails with Trino's division-by-zero error when ``b`` is an exact zero (not for doubles)."""
    from sqlglot import exp

    floats = exp.Tuple(expressions=[exp.Literal.string("FLOAT"), exp.Literal.string("DOUBLE")])

    def exact(e: Any) -> Any:
        return exp.Not(this=exp.In(this=exp.Anonymous(this="typeof", expressions=[e.copy()]),
                                   expressions=[e.copy() for e in floats.expressions]))

    for div in list(tree.find_all(exp.Div)):
        left, right = div.this, div.expression
        zero = exp.and_(exp.EQ(this=right.copy(), expression=exp.Literal.number(0)), exact(left), exact(right))
        guard = exp.Case(ifs=[exp.If(this=zero, true=exp.Anonymous(
            this="error", expressions=[exp.Literal.string("Division by zero")]))], default=right.copy())
        div.set("expression", exp.Paren(this=guard))


_JAVA_SPEC = re.compile(r"%(?:(\d+)\$)?([-#+ 0,(]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")


def _fmt_spec(java: str) -> str:
    """A Java ``String.format`` pattern (Trino's ``format``) as a {fmt} one (DuckDB's).

    ``%s`` → ``{0}``, ``%.2f`` → ``{1:.2f}``, ``%2$s`` → ``{1}``, ``%%`` → ``%`` (every argument by its
    index: {fmt} cannot mix automatic and explicit ones).
    """
    out, last, auto = [], 0, 0
    for m in _JAVA_SPEC.finditer(java):
        out.append(java[last:m.start()].replace("{", "{{").replace("}", "}}"))
        last = m.end()
        index, flags, width, precision, conv = m.groups()
        if conv == "%":
            out.append("%")
            continue
        if conv == "n":
            out.append("\n")
            continue
        spec = flags.replace(",", "").replace("(", "") + (width or "") + (f".{precision}" if precision else "")
        if conv in "dfeEgxXo":
            spec += conv
        if index is None:  # an ordinary specifier takes the next argument; an explicit one (%2$s) does not count
            index, auto = str(auto + 1), auto + 1
        out.append("{" + str(int(index) - 1) + (":" + spec if spec else "") + "}")
    return "".join(out) + java[last:].replace("{", "{{").replace("}", "}}")


def _as_duckdb(text: str, trino_error: str) -> tuple[str, tuple[str | None, ...] | None, str]:
    """Text that is not Trino SQL runs as DuckDB reads it, when DuckDB's parser takes it (one read statement)."""
    import sqlglot

    verdict = check_statement(text)
    if verdict.refused:
        raise _PlanError("SYNTAX_ERROR" if verdict.error_name == "SYNTAX_ERROR" else verdict.error_name,
                         trino_error if verdict.error_name == "SYNTAX_ERROR" else verdict.message)
    try:
        names = _output_names(sqlglot.parse_one(text, read="duckdb"))
    except (sqlglot.errors.SqlglotError, ValueError):
        names = None
    return text, names, "cluster"


def _translate(text: str, cat: Catalog, catalog: str | None, schema: str | None
               ) -> tuple[str, tuple[str | None, ...] | None, str]:
    """``text`` (Trino, one statement) as DuckDB text, its output names and where it runs (``cluster`` or
    ``scratch``); :class:`_PlanError` if refused."""
    import sqlglot
    from sqlglot import exp

    try:
        trees = [t for t in sqlglot.parse(text, read="trino") if t is not None]
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        what = re.sub(r"<Token token_type: TokenType\.(\w+).*?>", r"\1", str(first.get("description", exc)))
        return _as_duckdb(text, f"line {first.get('line', 1)}:{first.get('col', 1)}: {what} "
                                f"(near {first.get('highlight', '')!r})"[:500])
    except (sqlglot.errors.SqlglotError, ValueError) as exc:
        return _as_duckdb(text, " ".join(str(exc).split())[:500])
    if not trees:
        raise _PlanError("SYNTAX_ERROR", "line 1:1: the query text holds no statement (it is empty or only "
                                         "comments).")
    if len(trees) > 1:
        raise _PlanError("NOT_SUPPORTED", f"The sloctl gateway runs one statement per request; the text holds "
                                          f"{len(trees)}.")
    tree = trees[0]
    writes = isinstance(tree, exp.Create | exp.Insert | exp.Delete | exp.Update | exp.Drop)
    scratch = cat.scratch and any(_catalog_of(t, cat, catalog) == "memory" for t in _tables(tree))
    if writes and scratch:
        targets = tree.args.get("tables") or [] if isinstance(tree, exp.Drop) else [
            tree.this.this if isinstance(tree.this, exp.Schema) else tree.this]
        if not targets or any(not isinstance(t, exp.Table) or _catalog_of(t, cat, catalog) != "memory"
                              for t in targets):
            raise _PlanError("PERMISSION_DENIED", f"Access Denied: the warehouse catalog '{cat.name}' is read-only; "
                                                  "write to the memory catalog (memory.default.<table>).")
        if isinstance(tree, exp.Create | exp.Drop) and (tree.args.get("kind") or "").upper() not in (
                "TABLE", "VIEW", "SCHEMA"):
            raise _PlanError("NOT_SUPPORTED", "The memory catalog holds tables, views and schemas.")
    elif not isinstance(tree, exp.Query | exp.Values):
        verdict = check_statement(text)  # DuckDB's name for the statement's kind, as the clusters would refuse it
        if verdict.refused:
            raise _PlanError(verdict.error_name, verdict.message)
        kind = str(tree.this).split()[0].upper() if isinstance(tree, exp.Command) else type(tree).__name__.upper()
        where = " except in the memory catalog (memory.default.<table>)" if cat.scratch else ""
        raise _PlanError("PERMISSION_DENIED", f"Access Denied: {kind} statements are not allowed by the sloctl "
                                              f"gateway{where} (it runs read-only queries).")
    if tree.find(exp.Placeholder) is not None:
        raise _PlanError("INVALID_PARAMETER_USAGE", "Query has parameters (?): send them with EXECUTE ... USING "
                                                    "(the client's execute(sql, params)).")
    names = ("rows",) if isinstance(tree, exp.Insert | exp.Delete | exp.Update) or (
        isinstance(tree, exp.Create) and tree.expression is not None) else _output_names(tree)
    _resolve_tables(tree, cat, catalog, schema, scratch)
    _guard_divisions(tree)
    for node in list(tree.find_all(exp.Format)):  # Trino's format is Java's printf, DuckDB's is fmt's {}
        spec = node.this
        if isinstance(spec, exp.Literal) and spec.is_string:
            node.replace(exp.Anonymous(this="format", expressions=[exp.Literal.string(_fmt_spec(spec.this)),
                                                                   *node.expressions]))
        else:
            node.replace(exp.Anonymous(this="printf", expressions=[spec, *node.expressions]))
    return tree.sql(dialect="duckdb"), names, "scratch" if scratch else "cluster"


def _bind(text: str, using: str | None) -> str:
    """``text`` with each ``?`` replaced by the next parameter of the ``USING`` list (Trino literals)."""
    from sqlglot.dialects.trino import Trino
    from sqlglot.tokens import TokenType

    tokenizer = Trino()
    try:
        marks = [t for t in tokenizer.tokenize(text) if t.token_type == TokenType.PLACEHOLDER]
        params: list[str] = []
        if using:
            depth, start = 0, 0
            for token in tokenizer.tokenize(using):
                depth += token.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET)
                depth -= token.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET)
                if token.token_type == TokenType.COMMA and depth == 0:
                    params.append(using[start:token.start].strip())
                    start = token.end + 1
            params.append(using[start:].strip())
    except Exception as exc:  # sqlglot's TokenError
        raise _PlanError("SYNTAX_ERROR", " ".join(str(exc).split())[:500]) from None
    if len(marks) != len(params):
        raise _PlanError("INVALID_PARAMETER_USAGE",
                         f"Incorrect number of parameters: expected {len(marks)} but found {len(params)}")
    out, last = [], 0
    for mark, param in zip(marks, params, strict=True):
        out += [text[last:mark.start], f"({param})"]
        last = mark.end + 1
    return "".join(out) + text[last:]


def _local(columns: list[tuple[str, str]], rows: list[tuple[Any, ...]], headers: tuple = ()) -> Plan:
    return Plan("local", columns=tuple(columns), rows=tuple(rows), headers=headers)


def _like(column: str, pattern: str | None, escape: str | None) -> str:
    if pattern is None:
        return "true"
    return f"{column} LIKE {pattern}" + (f" ESCAPE {escape}" if escape else "")


def _show(text: str, cat: Catalog, session: Session) -> str | Plan | None:
    """A ``SHOW`` / ``DESCRIBE`` statement as DuckDB text over Trino's views, a local answer, or ``None``."""
    views = _views(cat)
    schema_now = (session.schema or cat.schema).lower()
    if m := _SHOW_CATALOGS.match(text):
        import fnmatch

        pattern = None if m.group(1) is None else m.group(1)[1:-1].replace("''", "'")
        offered = (cat.name, "system", *(["memory"] if cat.scratch else []))
        names = [n for n in offered if pattern is None or fnmatch.fnmatchcase(
            n, pattern.replace("%", "*").replace("_", "?"))]
        return _local([("Catalog", "VARCHAR")], [(n,) for n in names])
    if m := _SHOW_SCHEMAS.match(text):
        if cat.scratch and (_unquote(m.group(1)) if m.group(1) else session.catalog) == "memory":
            return Plan("query", target="scratch", template_sql=text, sql=(
                'SELECT schema_name AS "Schema" FROM information_schema.schemata WHERE catalog_name = \'memory\' '
                f'AND {_like("schema_name", m.group(2), m.group(3))} ORDER BY 1'))
        if m.group(1) and _unquote(m.group(1)) != cat.name.lower():
            return _refused("CATALOG_NOT_FOUND", f"Catalog '{_unquote(m.group(1))}' not found")
        return (f'SELECT schema_name AS "Schema" FROM ({views[(cat.name, "information_schema", "schemata")]}) '
                f'WHERE {_like("schema_name", m.group(2), m.group(3))} ORDER BY 1')
    if m := _SHOW_TABLES.match(text):
        parts = _parts(m.group(1) or "") or [schema_now]
        schema = parts[-1]
        in_catalog = parts[0] if len(parts) > 1 else session.catalog
        if cat.scratch and in_catalog == "memory":
            return Plan("query", target="scratch", template_sql=text, sql=(
                f'SELECT table_name AS "Table" FROM information_schema.tables WHERE table_catalog = \'memory\' '
                f"AND table_schema = {_literal(schema)} AND {_like('table_name', m.group(2), m.group(3))} ORDER BY 1"))
        return (f'SELECT table_name AS "Table" FROM ({views[(cat.name, "information_schema", "tables")]}) '
                f"WHERE table_schema = {_literal(schema)} AND {_like('table_name', m.group(2), m.group(3))} "
                f"ORDER BY 1")
    for pattern, create in ((_SHOW_COLUMNS, False), (_SHOW_CREATE, True)):
        if m := pattern.match(text):
            parts = _parts(m.group(1))
            table, schema = parts[-1], parts[-2] if len(parts) > 1 else schema_now
            where = f"WHERE table_schema = {_literal(schema)} AND table_name = {_literal(table)}"
            source = views[(cat.name, "information_schema", "columns")]
            if create:
                head = _literal(f"CREATE TABLE {cat.name}.{schema}.{table} (\n")
                return (f"SELECT {head} || string_agg('   ' || column_name || ' ' || data_type, ',\n' ORDER BY "
                        f"ordinal_position) || '\n)' AS \"Create Table\" FROM ({source}) {where} HAVING count(*) > 0")
            return (f'SELECT column_name AS "Column", data_type AS "Type", \'\' AS "Extra", '
                    f'coalesce(comment, \'\') AS "Comment" FROM ({source}) {where} ORDER BY ordinal_position')
    if m := _SHOW_FUNCTIONS.match(text):
        return ('SELECT DISTINCT function_name AS "Function", coalesce(return_type, \'\') AS "Return Type", '
                'array_to_string(parameter_types, \', \') AS "Argument Types", function_type AS "Function Type", '
                'true AS "Deterministic", coalesce(description, \'\') AS "Description" FROM duckdb_functions() '
                f'WHERE function_type IN (\'scalar\', \'aggregate\', \'table\') AND '
                f'{_like("function_name", m.group(1), m.group(2))} ORDER BY 1, 3')
    if m := _SHOW_SESSION.match(text):
        return _local([("Name", "VARCHAR"), ("Value", "VARCHAR"), ("Default", "VARCHAR"), ("Type", "VARCHAR"),
                       ("Description", "VARCHAR")],
                      [(n, "", "", "varchar", d) for n, d in SESSION_PROPERTIES.items()])
    return None


@functools.lru_cache(maxsize=4096)
def _checked(text: str, cat: Catalog, catalog: str | None, schema: str | None
             ) -> tuple[str, tuple[str | None, ...] | None, str]:
    """:func:`_translate`, then the workers' own rule on what they will run (one read statement; the scratch
    worker's writes)."""
    sql, names, target = _translate(text, cat, catalog, schema)
    verdict = check_statement(sql, writes=target == "scratch")
    if verdict.refused:
        raise _PlanError(verdict.error_name, verdict.message)
    return sql, names, target


def _query(text: str, cat: Catalog, session: Session, template: str | None = None) -> Plan:
    try:
        sql, names, target = _checked(text, cat, session.catalog, session.schema)
    except _PlanError as exc:
        return _refused(exc.name, exc.message)
    return Plan("query", sql=sql, template_sql=template or text, names=names, target=target)


def plan(text: str, cat: Catalog, session: Session | None = None) -> Plan:
    """What to do with one request's text in ``session`` (see the module docstring)."""
    session = session or Session()
    verdict = check_statement(text) if re.match(r"^\s*(SET|RESET)\s+SESSION\b", text, re.IGNORECASE) else None
    if verdict is not None:
        if verdict.refused:
            return _refused(verdict.error_name, verdict.message)
        header = (("X-Trino-Set-Session", f"{verdict.name}={verdict.value}") if verdict.kind == "set_session"
                  else ("X-Trino-Clear-Session", verdict.name))
        return _local([("result", "BOOLEAN")], [(True,)], (header,))
    if m := _USE.match(text):
        first, second = _unquote(m.group(1)), m.group(2) and _unquote(m.group(2))
        if second is not None and first not in (cat.name.lower(), *(["memory"] if cat.scratch else [])):
            return _refused("CATALOG_NOT_FOUND", f"Catalog '{first}' not found")
        headers = ((("X-Trino-Set-Catalog", first),) if second is not None else ()) + (
            ("X-Trino-Set-Schema", second or first),)
        return _local([("result", "BOOLEAN")], [(True,)], headers)
    if m := _PREPARE.match(text):
        name, body = _unquote(m.group(1)), m.group(2)
        checked = _query(_bind(body, ", ".join(["NULL"] * body.count("?"))) if "?" in body else body, cat, session)
        if checked.kind == "refused" and checked.error_name != "INVALID_PARAMETER_USAGE":
            return checked
        return _local([("result", "BOOLEAN")], [(True,)],
                      (("X-Trino-Added-Prepare", f"{urllib.parse.quote(name)}={urllib.parse.quote_plus(body)}"),))
    if m := _DEALLOCATE.match(text):
        name = _unquote(m.group(1))
        if name not in session.prepared:
            return _refused("NOT_FOUND", f"Prepared statement not found: {name}")
        return _local([("result", "BOOLEAN")], [(True,)], (("X-Trino-Deallocated-Prepare", name),))
    try:
        if m := _EXECUTE_IMMEDIATE.match(text):
            body = m.group(1).replace("''", "'")
            return _query(_bind(body, m.group(2)), cat, session, template=body)
        if m := _EXECUTE.match(text):
            name = _unquote(m.group(1))
            if name not in session.prepared:
                return _refused("NOT_FOUND", f"Prepared statement not found: {name}")
            body = session.prepared[name]
            return _query(_bind(body, m.group(2)), cat, session, template=body)
    except _PlanError as exc:
        return _refused(exc.name, exc.message)
    shown = _show(text, cat, session)
    if isinstance(shown, Plan):
        return shown
    if shown is not None:
        return Plan("query", sql=shown, template_sql=text)
    if m := _EXPLAIN.match(text):
        inner = _query(m.group(2), cat, session)
        if inner.kind != "query":
            return inner
        return Plan("query", sql=("EXPLAIN ANALYZE " if m.group(1) else "EXPLAIN ") + inner.sql, template_sql=text)
    return _query(text, cat, session)
