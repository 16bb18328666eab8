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

Against a hostile client: :func:`plan` never raises (a translator failure is
a refused plan, one line); before any parser runs, a linear scan refuses a
text past :data:`MAX_TRANSLATION_TOKENS` or nested past
:data:`MAX_EXPRESSION_DEPTH` / :data:`MAX_CONSTRUCTOR_DEPTH`
(``QUERY_TEXT_TOO_LARGE``); every pattern applied to the text is linear;
header values and ``USING`` parameters enter the statement as syntax-tree
nodes, never as text; and the ``memory`` catalog's tables belong to the user
who created them (:func:`scratch_table`).
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sloctl.serving.gateway.sql import SESSION_PROPERTIES, check_statement, strip_terminator
from sloctl.serving.gateway.trino import SIMPLE_TYPES

__all__ = ["MAX_CONSTRUCTOR_DEPTH", "MAX_EXPRESSION_DEPTH", "MAX_TRANSLATION_TOKENS", "Catalog", "Plan", "Session",
           "parse_prepared", "plan", "scratch_table"]

# Every pattern below is linear in its input: quantifiers are possessive (nothing to backtrack into) and each
# is applied with fullmatch to strip_terminator(text), so no lazy group has to search for where a value ends.
_IDENT = r'(?:"(?:[^"]|"")++"|[A-Za-z_][\w$]*+)'
_NAME = rf"{_IDENT}(?:\s*+\.\s*+{_IDENT}){{0,2}}+"
_STRING = r"'(?:[^']|'')*+'"
_LIKE = rf"(?:\s++LIKE\s++({_STRING})(?:\s++ESCAPE\s++({_STRING}))?+)?+"
_FLAGS = re.IGNORECASE | re.DOTALL
_IDENT_RE = re.compile(_IDENT)
_USE = re.compile(rf"\s*+USE\s++({_IDENT})(?:\s*+\.\s*+({_IDENT}))?+", _FLAGS)
_PREPARE = re.compile(rf"\s*+PREPARE\s++({_IDENT})\s++FROM\s++(.*)", _FLAGS)
_DEALLOCATE = re.compile(rf"\s*+DEALLOCATE\s++PREPARE\s++({_IDENT})", _FLAGS)
_EXECUTE_IMMEDIATE = re.compile(r"\s*+EXECUTE\s++IMMEDIATE\s++'((?:[^']|'')*+)'(?:\s++USING\s++(.*))?+", _FLAGS)
_EXECUTE = re.compile(rf"\s*+EXECUTE\s++({_IDENT})(?:\s++USING\s++(.*))?+", _FLAGS)
_SHOW_CATALOGS = re.compile(rf"\s*+SHOW\s++CATALOGS{_LIKE}", _FLAGS)
_SHOW_SCHEMAS = re.compile(rf"\s*+SHOW\s++SCHEMAS(?:\s++(?:FROM|IN)\s++({_IDENT}))?+{_LIKE}", _FLAGS)
_SHOW_TABLES = re.compile(rf"\s*+SHOW\s++TABLES(?:\s++(?:FROM|IN)\s++({_NAME}))?+{_LIKE}", _FLAGS)
_SHOW_COLUMNS = re.compile(rf"\s*+(?:SHOW\s++COLUMNS\s++(?:FROM|IN)|DESCRIBE|DESC)\s++({_NAME})", _FLAGS)
_SHOW_CREATE = re.compile(rf"\s*+SHOW\s++CREATE\s++(?:TABLE|VIEW)\s++({_NAME})", _FLAGS)
_SHOW_FUNCTIONS = re.compile(rf"\s*+SHOW\s++FUNCTIONS{_LIKE}", _FLAGS)
_SHOW_SESSION = re.compile(rf"\s*+SHOW\s++SESSION{_LIKE}", _FLAGS)
_EXPLAIN = re.compile(r"\s*+EXPLAIN(\s++ANALYZE\b)?+\s++(.+)", _FLAGS)
_SESSION_STATEMENT = re.compile(r"\s*+(?:SET|RESET)\s++SESSION\b", re.IGNORECASE)
_TOKEN_NAME = re.compile(r"<Token token_type: TokenType\.(\w++)[^<>]*+>")
_OWNED = re.compile(r"u([0-9a-f]*+)\.(.*)", re.DOTALL)

#: The most tokens a statement may have to be translated: sqlglot takes about 1 s per 100,000 (a 1 MB ``IN``
#: list is 300,000), and the gateway gives a text ``plan_timeout_s`` (2 s) to plan.
MAX_TRANSLATION_TOKENS = 50_000
#: The deepest nesting of parentheses and brackets translated: sqlglot recurses about 20 frames a level, and
#: Python's stack allows 1,000 frames (TPC-H and TPC-DS texts nest at most 6 deep).
MAX_EXPRESSION_DEPTH = 30
#: The deepest nesting of ``ARRAY[``, ``ROW(`` and ``MAP(`` constructors translated: sqlglot's parser takes
#: about twice as long for each level (8 levels: a few ms; 16: seconds).
MAX_CONSTRUCTOR_DEPTH = 8
_CONSTRUCTORS = frozenset({"ARRAY", "ROW", "MAP"})
#: One token of a cheap, linear scan (strings, quoted names, comments, words, white space, one character).
_SCAN = re.compile(r"""'(?:[^']|'')*+'?+|"(?:[^"]|"")*+"?+|--[^\n]*+|/\*(?:[^*]|\*(?!/))*+(?:\*/)?+"""
                   r"""|[\w$.]++|(\s++)|.""", re.DOTALL)


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
    """What a request's Trino session says: catalog, schema and prepared statements (name → text).

    ``user`` is the authenticated principal: it owns what it creates in the
    ``memory`` catalog (its ``memory.default`` is its own); ``admin`` may
    also reach another user's tables as ``memory."<user>".<table>``.
    """

    catalog: str | None = None
    schema: str | None = None
    prepared: Mapping[str, str] = field(default_factory=dict)
    user: str = ""
    admin: bool = False


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
    """``text`` as a DuckDB string literal, escaped by sqlglot's generator (never spliced by hand)."""
    from sqlglot import exp

    return exp.Literal.string(text).sql(dialect="duckdb")


def _quoted(name: str) -> str:
    """``name`` as a quoted DuckDB identifier, written by sqlglot's generator."""
    from sqlglot import exp

    return exp.to_identifier(name, quoted=True).sql(dialect="duckdb")


def _unquote(ident: str) -> str:
    ident = ident.strip()
    if ident.startswith('"') and ident.endswith('"'):
        return ident[1:-1].replace('""', '"')
    return ident.lower()


def _parts(name: str) -> list[str]:
    return [_unquote(p) for p in _IDENT_RE.findall(name)]


#: The longest catalog, schema or table name a session may hold (characters).
MAX_NAME_LENGTH = 128


def _check_name(value: str, where: str) -> str:
    """``value`` if it can be a catalog or schema name (printable, 1 to :data:`MAX_NAME_LENGTH` characters).

    Raises:
        _PlanError: it cannot (``where`` names the header or statement it came from).
    """
    if not 0 < len(value) <= MAX_NAME_LENGTH or not value.isprintable():
        raise _PlanError("INVALID_SESSION_PROPERTY" if where.startswith("X-") else "SYNTAX_ERROR",
                         f"The {where} must be a name of 1 to {MAX_NAME_LENGTH} printable characters (no control "
                         f"characters), got {value[:80]!r}.")
    return value


def scratch_table(user: str, table: str) -> str:
    """The scratch worker's name for ``user``'s ``memory.default.<table>``: ``u<hex of the UTF-8 user>.<table>``.

    Every user's tables live in the scratch database's one schema
    (``memory."default"``) under a prefix that only they resolve to, so one
    user's ``memory.default.t`` is another table than another user's.
    Injective: the hex digits end at the first ``.``.
    """
    return f"u{user.encode().hex()}.{table}"


def _limits(text: str) -> None:
    """Refuse, before any parser runs, a text too large or too deeply nested to translate within budget.

    One linear scan (it stops at the first limit crossed): tokens outside
    strings and comments, and the nesting of ``(`` and ``[``.

    Raises:
        _PlanError: ``QUERY_TEXT_TOO_LARGE`` naming the limit.
    """
    tokens = depth = 0
    opened: list[bool] = []  # per open bracket: whether it is a constructor's
    previous = ""
    for m in _SCAN.finditer(text):
        if m.group(1) is not None or m.group().startswith(("--", "/*")):
            continue
        tokens += 1
        if tokens > MAX_TRANSLATION_TOKENS:
            raise _PlanError("QUERY_TEXT_TOO_LARGE", f"Query text has more than {MAX_TRANSLATION_TOKENS} tokens, "
                                                     f"the most the sloctl gateway translates (max_translation_tokens)"
                                                     f"; send large value lists as a table (the memory catalog).")
        token = m.group()
        if token in ("(", "["):
            depth += 1
            opened.append(previous.upper() in _CONSTRUCTORS)
            if depth > MAX_EXPRESSION_DEPTH:
                raise _PlanError("QUERY_TEXT_TOO_LARGE", f"Query text exceeds the maximum expression depth of "
                                                         f"{MAX_EXPRESSION_DEPTH} nested parentheses or brackets "
                                                         f"(near character {m.start() + 1}).")
            if opened[-1] and sum(opened) > MAX_CONSTRUCTOR_DEPTH:
                raise _PlanError("QUERY_TEXT_TOO_LARGE", f"Query text nests ARRAY, ROW and MAP constructors more than "
                                                         f"{MAX_CONSTRUCTOR_DEPTH} deep, the most the sloctl gateway "
                                                         f"translates (near character {m.start() + 1}).")
        elif token in (")", "]"):
            depth -= 1
            if opened:
                opened.pop()
        previous = token


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


@functools.lru_cache(maxsize=256)
def _memory_views(user: str, admin: bool) -> dict[tuple[str, str, str], str]:
    """``memory.information_schema`` on the scratch worker, showing a user only the tables it owns.

    A table's schema is ``default`` for its owner; an admin also sees every
    other user's tables, under a schema named after that user.
    """
    mine = _literal(scratch_table(user, ""))
    owner = "regexp_extract(table_name, '^u([0-9a-f]*)[.]', 1)"
    schema = (f"CASE WHEN starts_with(table_name, {mine}) THEN 'default' ELSE decode(unhex({owner})) END"
              if admin else "'default'")
    name = "regexp_extract(table_name, '^u[0-9a-f]*[.](.*)$', 1)"
    where = ("table_catalog = 'memory' AND table_schema = 'default' AND "
             + ("regexp_matches(table_name, '^u[0-9a-f]*[.]')" if admin else f"starts_with(table_name, {mine})"))
    tables = (f"SELECT 'memory' AS table_catalog, {schema} AS table_schema, {name} AS table_name, table_type "
              f"FROM information_schema.tables WHERE {where}")
    columns = (f"SELECT 'memory' AS table_catalog, {schema} AS table_schema, {name} AS table_name, column_name, "
               f"CAST(ordinal_position AS BIGINT) AS ordinal_position, column_default, is_nullable, "
               f"{_type_case('data_type')} AS data_type, COLUMN_COMMENT AS comment, "
               f"CAST(NULL AS VARCHAR) AS extra_info FROM information_schema.columns WHERE {where}")
    schemata = ("SELECT 'memory' AS catalog_name, schema_name FROM (VALUES ('default'), ('information_schema')) "
                "AS s(schema_name)" + (f" UNION SELECT DISTINCT 'memory', table_schema FROM ({tables})"
                                       if admin else ""))
    return {("memory", "information_schema", "tables"): tables,
            ("memory", "information_schema", "columns"): columns,
            ("memory", "information_schema", "schemata"): schemata}


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


def _name_of(ident: Any) -> str:
    """A name as Trino reads it: quoted as written, unquoted in lower case."""
    return ident.this if ident.quoted else ident.this.lower()


def _scratch_name(table: Any, db: str, user: str, admin: bool) -> Any:
    """The scratch worker's name for ``memory.<db>.<table>`` of ``user`` (see :func:`scratch_table`)."""
    from sqlglot import exp

    written = table.args.get("db")
    db = _name_of(written) if isinstance(written, exp.Identifier) else db
    owner = user if db.lower() == "default" else db if admin else None
    if owner is None:
        raise _PlanError("SCHEMA_NOT_FOUND", f"Schema 'memory.{db}' does not exist: the memory catalog has one "
                                             f"schema per user, 'default', which holds that user's own tables.")
    return exp.to_identifier(scratch_table(owner, _name_of(table.this)), quoted=True)


_SCRATCH_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})


def _resolve_tables(tree: Any, cat: Catalog, catalog: str | None, schema: str | None, scratch: bool,
                    user: str = "", admin: bool = False) -> None:
    """Qualify names for where the query runs: the session's schema, the catalog's name there, Trino's views,
    and in the ``memory`` catalog the user's own tables (:func:`scratch_table`)."""
    import sqlglot
    from sqlglot import exp

    views = {**_views(cat, scratch), **(_memory_views(user, admin) if cat.scratch else {})}
    names = f"'{cat.name}', 'system'" + (" and 'memory'" if cat.scratch else "")
    if scratch:  # a table function could name or list tables by text, past the owner's prefix
        for t in tree.find_all(exp.Table):
            if not isinstance(t.this, exp.Identifier) and (
                    not isinstance(t.this, exp.Func) or t.this.name.lower() not in _SCRATCH_FUNCTIONS) and not (
                    isinstance(t.this, exp.GenerateSeries | exp.Unnest)):
                raise _PlanError("PERMISSION_DENIED", f"Access Denied: table function {t.this.name[:60]!r} "
                                                      f"is not allowed in a statement on the memory catalog (only "
                                                      f"{', '.join(sorted(_SCRATCH_FUNCTIONS))}).")
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
            table.set("this", _scratch_name(table, db, user, admin))
            table.set("catalog", exp.to_identifier("memory"))
            db = "default"
        elif cat_name == cat.name.lower():  # on the scratch worker the warehouse is attached under its name
            table.set("catalog", exp.to_identifier(cat.name) if scratch else None)
        else:
            raise _PlanError("CATALOG_NOT_FOUND", f"Catalog '{cat_name}' not found (this gateway has {names}).")
        table.set("db", exp.to_identifier(db))  # quoted where it is not a plain name (sqlglot's rule)


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


_JAVA_SPEC = re.compile(r"%(?:(\d++)\$)?+([-#+ 0,(]*+)(\d++)?+(?:\.(\d++))?+([a-zA-Z%])")


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


def _write_targets(tree: Any) -> list[Any]:
    """The tables a write statement changes (``CREATE``'s, ``INSERT``'s, ``DROP``'s ...), as written."""
    from sqlglot import exp

    if isinstance(tree, exp.Drop):
        return list(tree.args.get("tables") or [])
    target = tree.this
    if isinstance(target, exp.Schema):
        target = target.this
    return [target]


def _check_writes(tree: Any, cat: Catalog, catalog: str | None) -> bool:
    """Whether a write statement is one the memory catalog takes (so it runs on the scratch worker).

    Raises:
        _PlanError: naming the statement, the catalog and the rule that refuses it.
    """
    from sqlglot import exp

    kind = (tree.args.get("kind") or "TABLE").upper() if isinstance(tree, exp.Create | exp.Drop) else ""
    verb = f"{type(tree).__name__.upper()} {kind}".strip()
    if kind == "SCHEMA":
        where = next(iter(_write_targets(tree)), None)
        named = (where.args.get("catalog") or where.args.get("db")) if isinstance(where, exp.Table) else None
        in_catalog = (_name_of(named) if named is not None else (catalog or cat.name)).lower()
        if in_catalog == "memory" and cat.scratch:
            raise _PlanError("NOT_SUPPORTED", f"{verb} is not supported in catalog 'memory': it has one schema per "
                                              f"user, 'default', which needs no creating.")
        raise _PlanError("PERMISSION_DENIED", f"Access Denied: Cannot {verb} in catalog '{in_catalog}': the "
                                              f"sloctl gateway's catalog '{cat.name}' is read-only.")
    targets = [t.args.get("table") if isinstance(t, exp.Index) else t for t in _write_targets(tree)]
    catalogs = sorted({_catalog_of(t, cat, catalog) if isinstance(t, exp.Table) else (catalog or cat.name).lower()
                       for t in targets} or {(catalog or cat.name).lower()})
    memory = cat.scratch and catalogs == ["memory"]
    if kind not in ("", "TABLE", "VIEW"):
        raise _PlanError("NOT_SUPPORTED", f"{verb} is not supported in catalog '{catalogs[0]}': "
                                          + ("the memory catalog holds tables and views." if memory else
                                             "the sloctl gateway runs queries there."))
    if not targets or any(not isinstance(t, exp.Table) for t in targets) or not memory:
        hint = " Tables may be written in the memory catalog (memory.default.<table>)." if cat.scratch else ""
        where = ", ".join(f"'{c}'" for c in catalogs if c != "memory") or f"'{cat.name}'"
        raise _PlanError("PERMISSION_DENIED", f"Access Denied: Cannot {verb} in catalog {where}: it is "
                                              f"read-only.{hint}")
    return True


def _translate(text: str, cat: Catalog, catalog: str | None, schema: str | None, user: str = "",
               admin: bool = False, params: tuple[str, ...] | None = None
               ) -> tuple[str, tuple[str | None, ...] | None, str]:
    """``text`` (Trino, one statement) as DuckDB text, its output names and where it runs (``cluster`` or
    ``scratch``); :class:`_PlanError` if refused.

    ``params``: the ``EXECUTE ... USING`` literals (Trino text) that replace
    the placeholders ``:sloctl_p0``, ``:sloctl_p1``, ... that :func:`_bind`
    put where ``text`` had its ``?`` (bound into the syntax tree, never
    spliced into the text).
    """
    import sqlglot
    from sqlglot import exp

    try:
        trees = [t for t in sqlglot.parse(text, read="trino") if t is not None]
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        what = _TOKEN_NAME.sub(r"\1", str(first.get("description", exc)))
        message = f"line {first.get('line', 1)}:{first.get('col', 1)}: {what} (near {first.get('highlight', '')!r})"
        if params is not None:  # a prepared statement must be Trino: its parameters bind into Trino's tree
            raise _PlanError("SYNTAX_ERROR", message[:500]) from None
        return _as_duckdb(text, message[:500])
    except (sqlglot.errors.SqlglotError, ValueError) as exc:
        if params is not None:
            raise _PlanError("SYNTAX_ERROR", " ".join(str(exc).split())[:500]) from None
        return _as_duckdb(text, " ".join(str(exc).split())[:500])
    if not trees:
        raise _PlanError("SYNTAX_ERROR", "line 1:1: the query text holds no statement (it is empty or only "
                                         "comments).")
    if len(trees) > 1:
        raise _PlanError("NOT_SUPPORTED", f"The sloctl gateway runs one statement per request; the text holds "
                                          f"{len(trees)}.")
    tree = trees[0]
    if params is not None:
        _bind_tree(tree, params)
    writes = isinstance(tree, exp.Create | exp.Insert | exp.Delete | exp.Update | exp.Drop)
    scratch = cat.scratch and any(_catalog_of(t, cat, catalog) == "memory" for t in _tables(tree))
    if writes:
        scratch = _check_writes(tree, cat, catalog)
    elif not isinstance(tree, exp.Query | exp.Values):
        verdict = check_statement(text)  # DuckDB's name for the statement's kind, as the clusters would refuse it
        if verdict.refused:
            raise _PlanError(verdict.error_name, verdict.message)
        kind = str(tree.this).split()[0].upper() if isinstance(tree, exp.Command) else type(tree).__name__.upper()
        raise _PlanError("PERMISSION_DENIED", f"Access Denied: {kind} statements are not allowed by the sloctl "
                                              f"gateway in any catalog (it runs queries"
                                              f"{', and table writes in the memory catalog' if cat.scratch else ''}).")
    if tree.find(exp.Placeholder) is not None:
        raise _PlanError("INVALID_PARAMETER_USAGE", "Query has parameters (?): send them with EXECUTE ... USING "
                                                    "(the client's execute(sql, params)).")
    names = ("rows",) if isinstance(tree, exp.Insert | exp.Delete | exp.Update) or (
        isinstance(tree, exp.Create) and tree.expression is not None) else _output_names(tree)
    _resolve_tables(tree, cat, catalog, schema, scratch, user, admin)
    _guard_divisions(tree)
    for node in list(tree.find_all(exp.Format)):  # Trino's format is Java's printf, DuckDB's is fmt's {}
        spec = node.this
        if isinstance(spec, exp.Literal) and spec.is_string:
            node.replace(exp.Anonymous(this="format", expressions=[exp.Literal.string(_fmt_spec(spec.this)),
                                                                   *node.expressions]))
        else:
            node.replace(exp.Anonymous(this="printf", expressions=[spec, *node.expressions]))
    return tree.sql(dialect="duckdb"), names, "scratch" if scratch else "cluster"


#: The syntax-tree nodes a parameter of ``EXECUTE ... USING`` may consist of: literals, typed literals
#: (``DATE '...'``, ``DECIMAL '...'``, ``UUID '...'``), signs, ``X'...'``, ``ARRAY[...]``, ``MAP(...)``, ``ROW(...)``.
_PARAM_NODES = ("Literal", "Neg", "Boolean", "Null", "Cast", "DataType", "DataTypeParam", "HexString", "ByteString",
                "Array", "Map", "Struct", "Interval", "Var", "Paren", "Tuple")


def _parameter(text: str, position: int) -> str:
    """One ``USING`` parameter, checked to be a literal, as Trino text written by sqlglot from its tree.

    Raises:
        _PlanError: ``INVALID_PARAMETER_USAGE`` naming the parameter and what it holds.
    """
    import sqlglot
    from sqlglot import exp

    def refuse(why: str) -> _PlanError:
        return _PlanError("INVALID_PARAMETER_USAGE", f"Parameter {position} of EXECUTE ... USING must be a literal "
                                                     f"(number, string, boolean, NULL, typed literal such as DATE "
                                                     f"'2020-01-01', ARRAY[...], MAP(...)); {why}: {text[:80]!r}.")

    if not text:
        raise refuse("it is empty")
    try:
        node = sqlglot.parse_one(text, read="trino")
    except (sqlglot.errors.SqlglotError, ValueError):
        raise refuse("it does not parse") from None
    for sub in node.walk():
        if type(sub).__name__ not in _PARAM_NODES or sub.comments:
            raise refuse(f"it holds {'a comment' if sub.comments else type(sub).__name__}")
        if isinstance(sub, exp.Cast) and not isinstance(sub.this, exp.Literal):
            raise refuse("a typed literal takes a quoted value")
        if isinstance(sub, exp.Neg) and not isinstance(sub.this, exp.Literal):
            raise refuse("a sign goes before a number")
    return node.sql(dialect="trino")


def _bind(text: str, using: str | None, fill_null: bool = False) -> tuple[str, tuple[str, ...]]:
    """``text`` with its ``?`` marked ``:sloctl_p0``, ``:sloctl_p1``, ... in order, and the ``USING`` literals.

    The parameters are split at top-level commas by sqlglot's tokenizer, each
    checked to be a literal (:func:`_parameter`); :func:`_translate` binds
    them into the parsed statement.

    Raises:
        _PlanError: ``INVALID_PARAMETER_USAGE`` (a parameter that is not a
            literal, a count that does not match), ``SYNTAX_ERROR`` (text the
            tokenizer cannot read).
    """
    from sqlglot.dialects.trino import Trino
    from sqlglot.tokens import TokenType

    tokenizer = Trino()
    params: list[str] = []
    try:
        marks = [t for t in tokenizer.tokenize(text) if t.token_type == TokenType.PLACEHOLDER and t.text == "?"]
        if using is not None and using.strip():
            depth, start = 0, 0
            for token in tokenizer.tokenize(using):
                if token.token_type == TokenType.SEMICOLON or token.comments:
                    raise _PlanError("INVALID_PARAMETER_USAGE", "EXECUTE ... USING takes literals only: a "
                                                                "parameter holds a comment or a ';'.")
                depth += token.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET)
                depth -= token.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET)
                if token.token_type == TokenType.COMMA and depth == 0:
                    params.append(using[start:token.start].strip())
                    start = token.end + 1
            params.append(using[start:].strip())
    except _PlanError:
        raise
    except Exception as exc:  # sqlglot's TokenError
        raise _PlanError("SYNTAX_ERROR", " ".join(str(exc).split())[:500]) from None
    if fill_null:  # PREPARE checks the statement as it would run with every parameter NULL
        params = ["NULL"] * len(marks)
    if len(marks) != len(params):
        raise _PlanError("INVALID_PARAMETER_USAGE",
                         f"Incorrect number of parameters: expected {len(marks)} but found {len(params)}")
    literals = tuple(_parameter(p, i + 1) for i, p in enumerate(params))
    out, last = [], 0
    for i, mark in enumerate(marks):
        out += [text[last:mark.start], f" :sloctl_p{i} "]
        last = mark.end + 1
    return "".join(out) + text[last:], literals


def _bind_tree(tree: Any, params: tuple[str, ...]) -> None:
    """Replace the placeholders :func:`_bind` marked with the parameters' parsed literals."""
    import sqlglot
    from sqlglot import exp

    for node in list(tree.find_all(exp.Placeholder)):
        name = node.this if isinstance(node.this, str) else ""
        if name.startswith("sloctl_p") and name[8:].isdigit() and int(name[8:]) < len(params):
            value = sqlglot.parse_one(params[int(name[8:])], read="trino")
            node.replace(exp.Paren(this=value) if isinstance(value, exp.Neg) else value)


def _local(columns: list[tuple[str, str]], rows: list[tuple[Any, ...]], headers: tuple = ()) -> Plan:
    return Plan("local", columns=tuple(columns), rows=tuple(rows), headers=headers)


def _like(column: str, pattern: str | None, escape: str | None) -> str:
    """``column LIKE pattern [ESCAPE escape]`` with the client's quoted strings re-escaped by sqlglot."""
    if pattern is None:
        return "true"
    unquoted = [None if p is None else p[1:-1].replace("''", "'") for p in (pattern, escape)]
    return f"{column} LIKE {_literal(unquoted[0] or '')}" + (
        f" ESCAPE {_literal(unquoted[1])}" if unquoted[1] is not None else "")


def _show(text: str, cat: Catalog, session: Session) -> str | Plan | None:
    """A ``SHOW`` / ``DESCRIBE`` statement as DuckDB text over Trino's views, a local answer, or ``None``.

    ``text`` is already without its terminator; the ``memory`` catalog's
    answers run on the scratch worker and show the user's own tables only.
    """
    views = _views(cat)
    memory = _memory_views(session.user, session.admin) if cat.scratch else {}
    schema_now = (session.schema or cat.schema).lower()

    def scratch(sql: str) -> Plan:
        return Plan("query", target="scratch", template_sql=text, sql=sql)

    if m := _SHOW_CATALOGS.fullmatch(text):
        import fnmatch

        pattern = None if m.group(1) is None else m.group(1)[1:-1].replace("''", "'")
        offered = (cat.name, "system", *(["memory"] if cat.scratch else []))
        names = [n for n in offered if pattern is None or fnmatch.fnmatchcase(
            n, pattern.replace("%", "*").replace("_", "?"))]
        return _local([("Catalog", "VARCHAR")], [(n,) for n in names])
    if m := _SHOW_SCHEMAS.fullmatch(text):
        in_catalog = _unquote(m.group(1)) if m.group(1) else (session.catalog or cat.name).lower()
        if cat.scratch and in_catalog == "memory":
            schemata = memory[("memory", "information_schema", "schemata")]
            return scratch(f'SELECT schema_name AS "Schema" FROM ({schemata}) '
                           f'WHERE {_like("schema_name", m.group(2), m.group(3))} ORDER BY 1')
        if in_catalog != cat.name.lower():
            return _refused("CATALOG_NOT_FOUND", f"Catalog '{in_catalog}' not found")
        return (f'SELECT schema_name AS "Schema" FROM ({views[(cat.name, "information_schema", "schemata")]}) '
                f'WHERE {_like("schema_name", m.group(2), m.group(3))} ORDER BY 1')
    if m := _SHOW_TABLES.fullmatch(text):
        parts = _parts(m.group(1) or "") or [schema_now]
        schema = parts[-1]
        in_catalog = parts[0] if len(parts) > 1 else session.catalog
        where = f"WHERE table_schema = {_literal(schema)} AND {_like('table_name', m.group(2), m.group(3))}"
        if cat.scratch and in_catalog == "memory":
            return scratch(f'SELECT table_name AS "Table" FROM ({memory[("memory", "information_schema", "tables")]}) '
                           f"{where} ORDER BY 1")
        return (f'SELECT table_name AS "Table" FROM ({views[(cat.name, "information_schema", "tables")]}) '
                f"{where} ORDER BY 1")
    for pattern, create in ((_SHOW_COLUMNS, False), (_SHOW_CREATE, True)):
        if m := pattern.fullmatch(text):
            parts = _parts(m.group(1))
            table, schema = parts[-1], parts[-2] if len(parts) > 1 else schema_now
            in_catalog = parts[0] if len(parts) > 2 else (session.catalog or cat.name).lower()
            in_memory = cat.scratch and in_catalog == "memory"
            where = f"WHERE table_schema = {_literal(schema)} AND table_name = {_literal(table)}"
            source = (memory[("memory", "information_schema", "columns")] if in_memory
                      else views[(cat.name, "information_schema", "columns")])
            if create:
                head = _literal(f"CREATE TABLE {in_catalog if in_memory else cat.name}.{schema}.{table} (\n")
                sql = (f"SELECT {head} || string_agg('   ' || column_name || ' ' || data_type, ',\n' ORDER BY "
                       f"ordinal_position) || '\n)' AS \"Create Table\" FROM ({source}) {where} HAVING count(*) > 0")
            else:
                sql = (f'SELECT column_name AS "Column", data_type AS "Type", \'\' AS "Extra", '
                       f'coalesce(comment, \'\') AS "Comment" FROM ({source}) {where} ORDER BY ordinal_position')
            return scratch(sql) if in_memory else sql
    if m := _SHOW_FUNCTIONS.fullmatch(text):
        return ('SELECT DISTINCT function_name AS "Function", coalesce(return_type, \'\') AS "Return Type", '
                'array_to_string(parameter_types, \', \') AS "Argument Types", function_type AS "Function Type", '
                'true AS "Deterministic", coalesce(description, \'\') AS "Description" FROM duckdb_functions() '
                f'WHERE function_type IN (\'scalar\', \'aggregate\', \'table\') AND '
                f'{_like("function_name", m.group(1), m.group(2))} ORDER BY 1, 3')
    if m := _SHOW_SESSION.fullmatch(text):
        return _local([("Name", "VARCHAR"), ("Value", "VARCHAR"), ("Default", "VARCHAR"), ("Type", "VARCHAR"),
                       ("Description", "VARCHAR")],
                      [(n, "", "", "varchar", d) for n, d in SESSION_PROPERTIES.items()])
    return None


@functools.lru_cache(maxsize=4096)
def _checked(text: str, cat: Catalog, catalog: str | None, schema: str | None, user: str = "", admin: bool = False,
             params: tuple[str, ...] | None = None) -> tuple[str, tuple[str | None, ...] | None, str]:
    """:func:`_translate`, then the workers' own rule on what they will run (one read statement; the scratch
    worker's writes)."""
    sql, names, target = _translate(text, cat, catalog, schema, user, admin, params)
    from sloctl.serving.gateway.denylist import denied_in_text  # functions that act outside the query, any engine

    if (denial := denied_in_text(sql)) is not None:
        raise _PlanError("PERMISSION_DENIED", denial.message)
    verdict = check_statement(sql, writes=target == "scratch")
    if verdict.refused:
        raise _PlanError(verdict.error_name, verdict.message)
    return sql, names, target


def _query(text: str, cat: Catalog, session: Session, template: str | None = None,
           params: tuple[str, ...] | None = None) -> Plan:
    sql, names, target = _checked(text, cat, session.catalog, session.schema, session.user, session.admin, params)
    return Plan("query", sql=sql, template_sql=template or text, names=names, target=target)


def plan(text: str, cat: Catalog, session: Session | None = None) -> Plan:
    """What to do with one request's text in ``session`` (see the module docstring).

    Never raises: a refused text, a translator that gives up (``RecursionError``
    included) or fails is a ``refused`` plan with a Trino error name and one
    line of message, so the caller (a planner process) has nothing to log
    but a count. Arguments and result are plain frozen dataclasses (picklable).
    """
    try:
        return _plan(text, cat, session or Session())
    except _PlanError as exc:
        return _refused(exc.name, exc.message)
    except RecursionError:
        return _refused("SYNTAX_ERROR", "Query text is too large to translate: its expressions nest or chain too "
                                        "deeply for the translator (split long operator chains, nest less).")
    except Exception as exc:  # a translator's own failure: one line, never a traceback
        return _refused("GENERIC_INTERNAL_ERROR", (f"The sloctl gateway failed to translate the text: "
                                                   f"{type(exc).__name__}: {' '.join(str(exc).split())}")[:500])


def _plan(text: str, cat: Catalog, session: Session) -> Plan:
    for value, header in ((session.catalog, "X-Trino-Catalog header"), (session.schema, "X-Trino-Schema header")):
        if value is not None:
            _check_name(value, header)
    _limits(text)
    bare = strip_terminator(text)
    if _SESSION_STATEMENT.match(bare):
        verdict = check_statement(bare)
        if verdict.refused:
            return _refused(verdict.error_name, verdict.message)
        header = (("X-Trino-Set-Session", f"{verdict.name}={verdict.value}") if verdict.kind == "set_session"
                  else ("X-Trino-Clear-Session", verdict.name))
        return _local([("result", "BOOLEAN")], [(True,)], (header,))
    if m := _USE.fullmatch(bare):
        first = _check_name(_unquote(m.group(1)), "name in USE")
        second = m.group(2) and _check_name(_unquote(m.group(2)), "name in USE")
        if second is not None and first not in (cat.name.lower(), *(["memory"] if cat.scratch else [])):
            return _refused("CATALOG_NOT_FOUND", f"Catalog '{first}' not found")
        headers = ((("X-Trino-Set-Catalog", first),) if second is not None else ()) + (
            ("X-Trino-Set-Schema", second or first),)
        return _local([("result", "BOOLEAN")], [(True,)], headers)
    if m := _PREPARE.fullmatch(bare):
        name, body = _check_name(_unquote(m.group(1)), "prepared statement name"), m.group(2)
        try:  # checked as it would run, every parameter NULL
            marked, params = _bind(body, None, fill_null=True)
            _query(marked, cat, session, params=params)
        except _PlanError as exc:
            if exc.name != "INVALID_PARAMETER_USAGE":
                raise
        return _local([("result", "BOOLEAN")], [(True,)],
                      (("X-Trino-Added-Prepare", f"{urllib.parse.quote(name)}={urllib.parse.quote_plus(body)}"),))
    if m := _DEALLOCATE.fullmatch(bare):
        name = _unquote(m.group(1))
        if name not in session.prepared:
            return _refused("NOT_FOUND", f"Prepared statement not found: {name[:80]}")
        return _local([("result", "BOOLEAN")], [(True,)], (("X-Trino-Deallocated-Prepare", name),))
    if m := _EXECUTE_IMMEDIATE.fullmatch(bare):
        body = m.group(1).replace("''", "'")
        marked, params = _bind(body, m.group(2))
        return _query(marked, cat, session, template=body, params=params)
    if m := _EXECUTE.fullmatch(bare):
        name = _unquote(m.group(1))
        if name not in session.prepared:
            return _refused("NOT_FOUND", f"Prepared statement not found: {name[:80]}")
        body = session.prepared[name]
        _limits(body)
        marked, params = _bind(body, m.group(2))
        return _query(marked, cat, session, template=body, params=params)
    shown = _show(bare, cat, session)
    if isinstance(shown, Plan):
        return shown
    if shown is not None:
        return Plan("query", sql=shown, template_sql=text)
    if m := _EXPLAIN.fullmatch(bare):
        inner = _query(m.group(2), cat, session)
        return Plan("query", sql=("EXPLAIN ANALYZE " if m.group(1) else "EXPLAIN ") + inner.sql, template_sql=text)
    return _query(text, cat, session)
