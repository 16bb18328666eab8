"""The gateway's backends: which engine runs each cluster, and what it is sent.

A gateway cluster is one of three kinds (``kind`` in a backend entry):

* ``duckdb``: a DuckDB worker process of the gateway's own
  (:class:`~sloctl.datasets.duckdb_pool.DuckDBClusterPool`, a CPU budget
  of ``size`` units) running the gateway's DuckDB translation of the
  client's Trino SQL;
* ``trino``: a Trino coordinator at ``url``
  (:class:`~sloctl.datasets.trino_pool.TrinoClusterPool`): the client's text
  is forwarded as sent, with its ``X-Trino-*`` headers (user, catalog,
  schema, session, prepared statements), so nothing is translated;
* ``postgresql``: a PostgreSQL server or read replica at ``url``
  (:class:`~sloctl.datasets.postgres_pool.PostgresClusterPool`, one
  connection pool per server): the client's Trino text translated to
  PostgreSQL by sqlglot, its tables looked up on the server's
  ``search_path`` (catalog and schema qualifiers dropped, except
  ``information_schema`` and ``pg_catalog``, which stay qualified).

Engine roles. A PostgreSQL backend's role is checked when its pool is made
(gateway start, every ``backends add``) and at every attach: a superuser, a
member of ``pg_signal_backend``, ``pg_read_server_files`` and the like, or
an owner of what it serves is refused with the statements that revoke it
(:mod:`sloctl.datasets.pg_roles`), unless the entry's ``options`` say
``allow_privileged_role: true``, which lets it through with a warning on
stderr and in the backends view. A Trino coordinator does not tell what a
user may do: the gateway forwards each client's user, and says once per
backend that the coordinator's own access control must be least-privilege.
Statements calling a function of the deny list
(:mod:`sloctl.serving.gateway.denylist`) never reach any engine.

``size`` is what the router and the bill count the cluster as; for an
engine the gateway does not start it comes from the config alone. Every
backend belongs to a routing ``group`` (``default`` unless named): a query
runs only on backends of its group (:mod:`sloctl.serving.gateway.policy`).

A backend list comes from the gateway's YAML (``backends:``, see
docs/gateway.md) or from the admin API at run time
(``POST /v1/gateway/backends``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BACKEND_KINDS", "BackendSpec", "backend_from_doc", "backends_from_doc", "build_pool", "engine_pool",
           "postgres_text"]

#: The engines a gateway cluster may run on.
BACKEND_KINDS = ("duckdb", "trino", "postgresql")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")
_KNOWN = {"name", "kind", "size", "url", "group", "options"}
#: Schemas a PostgreSQL backend keeps in a table's name: the server's own catalogs, not the gateway's schemas.
_KEPT_SCHEMAS = ("information_schema", "pg_catalog")


@dataclass(frozen=True)
class BackendSpec:
    """One backend of the gateway (see the module docstring).

    Attributes:
        name: its cluster id (letters, digits, ``_.-``; starts with a letter).
        kind: ``duckdb``, ``trino`` or ``postgresql``.
        size: the cluster size the router and the bill count (integer >= 1).
        url: the engine's address: ``http(s)://host:port`` for ``trino``, a
            ``postgresql://`` URL for ``postgresql``; none for ``duckdb``.
        group: its routing group.
        options: the engine pool's own settings for it (``max_running`` of a
            Trino backend, ``pool_connections`` of a PostgreSQL one, ...).
    """

    name: str
    kind: str
    size: int = 1
    url: str | None = None
    group: str = "default"
    options: Mapping[str, Any] = field(default_factory=dict)

    def validate(self, where: str = "backend") -> None:
        """Raise ``ValueError`` naming the field (``where.field``) and the form expected."""
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"The '{where}.name' field must be a cluster id (a letter, then letters, digits or "
                             f"'_.-', at most 63), got {self.name!r}.")
        if self.name == "scratch" or re.match(r"^auto\d+-s\d+$", self.name):
            raise ValueError(f"The '{where}.name' field must not be a name the gateway uses itself "
                             f"('scratch', 'autoN-sM'), got {self.name!r}.")
        if self.kind not in BACKEND_KINDS:
            raise ValueError(f"The '{where}.kind' field must be one of {', '.join(BACKEND_KINDS)}, "
                             f"got {self.kind!r}.")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"The '{where}.size' field must be an integer >= 1, got {self.size!r}.")
        if self.kind == "duckdb" and self.url is not None:
            raise ValueError(f"The '{where}.url' field must be empty for a duckdb backend (the gateway starts its "
                             f"worker), got {self.url!r}.")
        if self.kind == "trino" and not (isinstance(self.url, str) and re.match(r"^https?://[^/\s]+/?$", self.url)):
            raise ValueError(f"The '{where}.url' field of a trino backend must be http(s)://host:port, "
                             f"got {self.url!r}.")
        if self.kind == "postgresql" and not (isinstance(self.url, str)
                                              and re.match(r"^postgres(ql)?://\S+$", self.url)):
            raise ValueError(f"The '{where}.url' field of a postgresql backend must be a postgresql:// URL, "
                             f"got {self.url!r}.")
        if not isinstance(self.group, str) or not _NAME.match(self.group):
            raise ValueError(f"The '{where}.group' field must be a group name (a letter, then letters, digits or "
                             f"'_.-'), got {self.group!r}.")
        if not isinstance(self.options, Mapping):
            raise ValueError(f"The '{where}.options' field must be a mapping, got {self.options!r}.")

    def public(self) -> dict[str, Any]:
        """What the admin API shows: everything but a password in the URL; ``warnings`` when there are some."""
        url = self.url
        if url is not None:
            url = re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)
        out = {"name": self.name, "kind": self.kind, "size": self.size, "url": url, "group": self.group}
        if self.warnings():
            out["warnings"] = self.warnings()
        return out

    def warnings(self) -> list[str]:
        """What an operator must know about this backend's privileges (said on stderr when its pool is made)."""
        if self.kind == "trino":
            return [f"backend {self.name!r}: the gateway forwards each client's user (X-Trino-User) to the Trino "
                    f"coordinator at {self.url}; its own access control decides what that user may do there, "
                    f"so make it least-privilege (docs/gateway.md, Engine roles)"]
        if self.kind == "postgresql" and self.options.get("allow_privileged_role") is True:
            return [f"backend {self.name!r}: allow_privileged_role is on: its PostgreSQL role is not held to "
                    f"least privilege, and any client of the gateway may use what it holds"]
        return []


def backend_from_doc(doc: Any, where: str = "backend") -> BackendSpec:
    """One backend entry (``{name, kind, size, url, group, options}``), validated."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"The '{where}' entry must be a mapping with name, kind, size and url, got {doc!r}.")
    unknown = sorted(set(doc) - _KNOWN)
    if unknown:
        raise ValueError(f"The '{where}' entry has unknown fields {unknown}; the fields are {sorted(_KNOWN)}.")
    if "name" not in doc or "kind" not in doc:
        raise ValueError(f"The '{where}' entry must name its 'name' and 'kind', got {dict(doc)!r}.")
    spec = BackendSpec(doc["name"], doc["kind"], doc.get("size", 1), doc.get("url"), doc.get("group", "default"),
                       dict(doc.get("options") or {}))
    spec.validate(where)
    return spec


def backends_from_doc(doc: Any) -> tuple[BackendSpec, ...]:
    """The ``backends:`` list of a gateway config, validated (names unique)."""
    if not isinstance(doc, Sequence) or isinstance(doc, str) or not doc:
        raise ValueError(f"The 'backends' field must be a non-empty list of backend entries, got {doc!r}.")
    specs = tuple(backend_from_doc(d, f"backends[{i}]") for i, d in enumerate(doc))
    seen: set[str] = set()
    for i, s in enumerate(specs):
        if s.name in seen:
            raise ValueError(f"The 'backends[{i}].name' field must be unique, got {s.name!r} twice.")
        seen.add(s.name)
    return specs


def _say(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


#: How long the role check at ``backends add`` may wait for a connection (the gateway's lock is held meanwhile).
ROLE_CHECK_TIMEOUT_S = 5.0


def engine_pool(spec: BackendSpec, warn: Callable[[str], None] = _say) -> Any:
    """The pool that serves one ``trino`` or ``postgresql`` backend (one pool per backend).

    A PostgreSQL backend's role is checked here (see the module docstring):
    the pool is not made for a role that holds too much. A server that does
    not answer yet is checked when it attaches. Each warning (an override, a
    role that does not default to read-only, a Trino backend's access
    control) goes to ``warn`` (default: a ``warning:`` line on stderr).

    Raises:
        ClusterPoolError: the backend's role holds a privilege it must not (the message names the role and
            what to revoke), or its options are not the pool's.
    """
    if spec.kind == "trino":
        from sloctl.datasets.trino_pool import TrinoClusterPool

        pool = TrinoClusterPool({spec.name: {"url": spec.url.rstrip("/"), "size": spec.size, **spec.options}})
        for line in spec.warnings():
            warn(line)
        return pool
    if spec.kind == "postgresql":
        from sloctl.datasets.postgres_pool import PostgresClusterPool

        pool = PostgresClusterPool({spec.name: {"url": spec.url, "size": spec.size, **spec.options}})
        check = pool.check_role(spec.name, timeout_s=ROLE_CHECK_TIMEOUT_S)
        for line in [] if check is None else check.notes():
            warn(line)
        return pool
    raise ValueError(f"The 'kind' of backend {spec.name!r} must be trino or postgresql for an engine pool, "
                     f"got {spec.kind!r}.")


def build_pool(db_path: str | Path, specs: Sequence[BackendSpec], duckdb_options: Mapping[str, Any]) -> Any:
    """A :class:`~sloctl.datasets.multi_pool.MultiPool`: the DuckDB pool, and one pool per engine backend.

    The DuckDB pool is always there (named ``duckdb``, the default): the
    ``memory`` catalog's scratch worker and the autoscaler's spin-ups run on
    it. An engine backend's pool is named after the backend.
    """
    from sloctl.datasets.duckdb_pool import DuckDBClusterPool
    from sloctl.datasets.multi_pool import MultiPool

    multi = MultiPool({"duckdb": DuckDBClusterPool(db_path, integer_division=True, **duckdb_options)},
                      default="duckdb")
    try:
        for spec in specs:
            if spec.kind == "duckdb":
                multi.own(spec.name, "duckdb")
            else:
                multi.add(spec.name, engine_pool(spec), (spec.name,))
    except BaseException:
        multi.close()
        raise
    return multi


def postgres_text(trino_sql: str) -> str:
    """A client's Trino statement for a PostgreSQL backend: tables unqualified, then translated by sqlglot.

    Catalog and schema qualifiers are the gateway's (the server's
    ``search_path`` finds the tables), except PostgreSQL's own
    ``information_schema`` and ``pg_catalog``, kept so that their views answer.

    Raises:
        ValueError: the statement cannot be parsed as Trino or written as PostgreSQL, or it calls a function
            of the deny list (:mod:`sloctl.serving.gateway.denylist`; the message names it and why).
    """
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    from sloctl.datasets.pg_dialect import CURSOR_KINDS, statement_kind, trino_to_postgres
    from sloctl.serving.gateway.denylist import denied_call, denied_in_text, denied_relation

    kind = statement_kind(trino_sql)
    if kind not in (*CURSOR_KINDS, "EXPLAIN"):
        raise ValueError(f"A {kind or 'statement of this kind'} statement does not run on a PostgreSQL backend "
                         f"(queries only: {', '.join(CURSOR_KINDS)}, EXPLAIN; prepared statements are not passed on).")
    denial = denied_in_text(trino_sql)
    if denial is not None:
        raise ValueError(denial.message)
    try:
        tree = sqlglot.parse_one(trino_sql, read="trino")
    except SqlglotError as exc:
        raise ValueError(f"The statement cannot be read as Trino SQL: {' '.join(str(exc).split())[:300]}") from exc
    denial = denied_call(tree)
    if denial is not None:
        raise ValueError(denial.message)
    for table in tree.find_all(exp.Table):  # the server's search_path finds them (catalog and schema are the gateway's)
        refusal = denied_relation(table.name)
        if refusal is not None:
            raise ValueError(refusal)
        table.set("catalog", None)
        if table.db.lower() not in _KEPT_SCHEMAS:  # PostgreSQL's own schemas answer as they are
            table.set("db", None)
    text = trino_to_postgres(tree.sql(dialect="trino"))
    denial = denied_in_text(text)
    if denial is not None:
        raise ValueError(denial.message)
    return text
