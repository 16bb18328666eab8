"""The role a PostgreSQL backend connects as: what it may do beyond reading, and a role that may only read.

A gateway in front of PostgreSQL runs strangers' queries as one role. A
read-only transaction stops writes, not what a privileged role does outside
the database: a superuser or a member of ``pg_read_server_files`` reads host
files, a member of ``pg_signal_backend`` ends every other session (the
gateway's own included). PostgreSQL's advice for untrusted connections is a
role that holds none of that; :func:`inspect_role` says what a role holds,
and :func:`create_reader_role` makes one that holds nothing but ``SELECT``.

What :func:`inspect_role` refuses (:attr:`RoleCheck.held`), each with the
statement that takes it away:

* the attributes in :data:`PRIVILEGED_ATTRIBUTES` (``SUPERUSER``,
  ``CREATEROLE``, ``REPLICATION``, ``BYPASSRLS``);
* membership, direct or through other roles, in a predefined role of
  :data:`PRIVILEGED_ROLES`;
* ownership, by the role or a role it belongs to, of the database, of a
  schema or of a table or view in it: an owner reads past the grants (and
  past row-level security), and may change the grants themselves.

It recommends (:attr:`RoleCheck.warnings`) ``default_transaction_read_only
= on`` for the role, so that even a session opened without the pool's own
setting cannot write.
"""

from __future__ import annotations

import re
import urllib.parse
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = ["PRIVILEGED_ATTRIBUTES", "PRIVILEGED_ROLES", "RoleCheck", "create_reader_role", "inspect_role"]

#: Role attributes a gateway's role must not have: ``pg_roles`` column -> (attribute, its negation, why).
PRIVILEGED_ATTRIBUTES: dict[str, tuple[str, str, str]] = {
    "rolsuper": ("SUPERUSER", "NOSUPERUSER", "may do anything: read host files, run programs, end sessions"),
    "rolcreaterole": ("CREATEROLE", "NOCREATEROLE", "creates roles and hands out memberships"),
    "rolreplication": ("REPLICATION", "NOREPLICATION", "streams every table's changes, past the grants"),
    "rolbypassrls": ("BYPASSRLS", "NOBYPASSRLS", "reads past row-level security"),
}

#: Predefined roles a gateway's role must not belong to (directly or through another role), and why.
PRIVILEGED_ROLES: dict[str, str] = {
    "pg_read_server_files": "reads any file the server can, with pg_read_file or COPY FROM a file",
    "pg_write_server_files": "writes files on the server's host",
    "pg_execute_server_program": "runs programs on the server's host with COPY ... PROGRAM",
    "pg_signal_backend": "cancels and ends other sessions with pg_cancel_backend and pg_terminate_backend",
    "pg_read_all_data": "reads every table, past the grants that choose what is served",
    "pg_write_all_data": "writes every table",
    "pg_checkpoint": "forces checkpoints",
    "pg_create_subscription": "makes the server connect to other servers",
}

_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_TABLE = re.compile(r"^(?:([a-z_][a-z0-9_]{0,62})\.)?([a-z_][a-z0-9_]{0,62})$")
_SYSTEM_SCHEMAS = "('pg_catalog', 'information_schema')"
_OWNED = f"""
SELECT 'database', quote_ident(datname) FROM pg_database
 WHERE datname = current_database() AND pg_get_userbyid(datdba) = ANY(%(held)s)
UNION ALL
SELECT 'schema', quote_ident(nspname) FROM pg_namespace
 WHERE pg_get_userbyid(nspowner) = ANY(%(held)s) AND nspname NOT IN {_SYSTEM_SCHEMAS} AND nspname !~ '^pg_(toast|temp_)'
UNION ALL
SELECT CASE c.relkind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view' WHEN 'f' THEN 'foreign table'
       ELSE 'table' END, quote_ident(n.nspname) || '.' || quote_ident(c.relname)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND pg_get_userbyid(c.relowner) = ANY(%(held)s)
   AND n.nspname NOT IN {_SYSTEM_SCHEMAS} AND n.nspname !~ '^pg_(toast|temp_)'
"""
_SHOWN_OWNED = 5  # owned objects named in a refusal (the rest are counted)


def _ident(name: str) -> str:
    """``name`` as an SQL identifier: as it is when it needs no quotes, else double-quoted."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class RoleCheck:
    """What a backend's role holds beyond reading the tables it is granted.

    Attributes:
        backend: the backend (cluster id) the role serves.
        role: the role's name (``current_user`` of the backend's URL).
        held: each privilege the role must not hold, with why (empty: a least-privilege role).
        revoke: the statements (run as an administrator) that take ``held`` away, in order.
        warnings: advice that does not refuse the backend (``default_transaction_read_only``).
        allowed: the backend's ``allow_privileged_role`` option was on: ``held`` is let through.
    """

    backend: str
    role: str
    held: tuple[str, ...] = ()
    revoke: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    allowed: bool = False

    @property
    def refused(self) -> bool:
        """The role holds something and no override lets it through."""
        return bool(self.held) and not self.allowed

    def refusal(self) -> str:
        """Why the backend is refused and exactly what to revoke (one paragraph)."""
        return (f"Backend {self.backend!r} connects as PostgreSQL role {self.role!r}, which holds what a gateway's "
                f"role must not: {'; '.join(self.held)}. As an administrator run: {' '.join(self.revoke)} "
                f"-- or connect as a role that may only read (sloctl.datasets.pg_roles.create_reader_role; "
                f"docs/gateway.md, Engine roles). The backend option allow_privileged_role: true lets it through "
                f"with a warning.")

    def notes(self) -> list[str]:
        """The warning lines for the operator (stderr at start, the backends view): overrides and advice."""
        lines = []
        if self.held and self.allowed:
            lines.append(f"backend {self.backend!r}: allow_privileged_role is on: role {self.role!r} holds "
                         f"{'; '.join(self.held)}; any client of the gateway may use it (revoke: "
                         f"{' '.join(self.revoke)})")
        lines += [f"backend {self.backend!r}: {w}" for w in self.warnings]
        return lines

    def to_doc(self) -> dict[str, Any]:
        """The check as the admin API shows it."""
        return {"role": self.role, "held": list(self.held), "revoke": list(self.revoke),
                "warnings": list(self.warnings), "allowed": self.allowed}


def _paths(edges: list[tuple[str, str]], start: str) -> dict[str, list[str]]:
    """Every role ``start`` belongs to (through any chain of grants) -> one shortest chain ``[start, ..., role]``."""
    granted: dict[str, list[str]] = {}
    for member, role in edges:
        granted.setdefault(member, []).append(role)
    paths, todo = {start: [start]}, deque([start])
    while todo:
        member = todo.popleft()
        for role in sorted(granted.get(member, ())):
            if role not in paths:
                paths[role] = [*paths[member], role]
                todo.append(role)
    return paths


def inspect_role(conn: psycopg.Connection, backend: str, *, allowed: bool = False) -> RoleCheck:
    """What the role of ``conn`` holds (see the module docstring); reads the catalogs only.

    Args:
        conn: a session of the backend's own role, in autocommit, before any setting of the pool's.
        backend: the backend's name, for the messages.
        allowed: the backend's ``allow_privileged_role`` option.
    """
    with conn.transaction():
        conn.execute("SET LOCAL statement_timeout = 5000")
        columns = ", ".join(PRIVILEGED_ATTRIBUTES)
        row = conn.execute(f"SELECT current_user::text, current_setting('default_transaction_read_only'), "
                           f"{columns} FROM pg_roles WHERE rolname = current_user").fetchone()
        edges = conn.execute("SELECT m.rolname::text, r.rolname::text FROM pg_auth_members a "
                             "JOIN pg_roles r ON r.oid = a.roleid JOIN pg_roles m ON m.oid = a.member").fetchall()
        role, read_only, flags = str(row[0]), str(row[1]), row[2:]
        paths = _paths([(str(a), str(b)) for a, b in edges], role)
        owned = conn.execute(_OWNED + " ORDER BY 1, 2", {"held": list(paths)}).fetchall()
    held, revoke = [], []
    for (attribute, negation, why), on in zip(PRIVILEGED_ATTRIBUTES.values(), flags, strict=True):
        if on:
            held.append(f"{attribute}: {why}")
            revoke.append(f"ALTER ROLE {_ident(role)} {negation};")
    for name, why in PRIVILEGED_ROLES.items():
        path = paths.get(name)
        if path is None:
            continue
        if len(path) == 2:
            held.append(f"membership in {name}: {why}")
            revoke.append(f"REVOKE {name} FROM {_ident(role)};")
        else:
            held.append(f"membership in {name} through {' -> '.join(path[1:-1])}: {why}")
            revoke.append(f"REVOKE {_ident(path[1])} FROM {_ident(role)};")
    if owned:
        shown = ", ".join(f"{kind} {name}" for kind, name in owned[:_SHOWN_OWNED])
        more = f" and {len(owned) - _SHOWN_OWNED} more" if len(owned) > _SHOWN_OWNED else ""
        held.append(f"ownership of {shown}{more}: an owner reads past the grants and may change them")
        revoke.append(f"REASSIGN OWNED BY {_ident(role)} TO <an owner role>; then GRANT SELECT on the served "
                      f"tables to {_ident(role)};")
    warnings = []
    if read_only != "on":
        warnings.append(f"role {role!r} does not default to read-only transactions; recommended: "
                        f"ALTER ROLE {_ident(role)} SET default_transaction_read_only = on;")
    return RoleCheck(backend, role, tuple(held), tuple(dict.fromkeys(revoke)), tuple(warnings), allowed)


def create_reader_role(admin_url: str, role: str, password: str | None, tables: Sequence[str]) -> str:
    """Create (or reset) a login role that may only read ``tables`` of ``admin_url``'s database; return its URL.

    The role is ``NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    NOBYPASSRLS``, belongs to no other role, may ``CONNECT`` to the
    database, use the tables' schemas and ``SELECT`` from the tables named,
    nothing else, and defaults to read-only transactions. An existing role of
    that name is altered to the same (its other grants are left: revoke them).

    Args:
        admin_url: a ``postgresql://`` URL of the database, as a role that may create roles and grant on the tables.
        role: the new role's name (lower-case letters, digits, ``_``).
        password: its password (``None``: none; then the server's authentication must not need one).
        tables: the tables to grant, ``table`` (schema ``public``) or ``schema.table`` (none: a role that
            reads no table, only what every role may).

    Returns:
        ``admin_url`` with the new role (and password) as its user.

    Raises:
        ValueError: a bad argument (named), or ``admin_url`` is not a URL.
    """
    import psycopg
    from psycopg import sql

    parts = urllib.parse.urlsplit(admin_url)
    if parts.scheme not in ("postgres", "postgresql") or not parts.hostname:
        raise ValueError(f"The 'admin_url' parameter of create_reader_role must be a postgresql://host/db URL, "
                         f"got {admin_url!r}.")
    if not isinstance(role, str) or not _ROLE.match(role) or role.startswith("pg_"):
        raise ValueError(f"The 'role' parameter of create_reader_role must be a role name (lower-case letters, "
                         f"digits and '_', not starting with 'pg_'), got {role!r}.")
    if isinstance(tables, str) or not all(isinstance(t, str) and _TABLE.match(t) for t in tables):
        raise ValueError(f"The 'tables' parameter of create_reader_role must be a list of table names "
                         f"('table' or 'schema.table', lower case), got {tables!r}.")
    names = [(m.group(1) or "public", m.group(2)) for m in (_TABLE.match(t) for t in tables) if m]
    attributes = sql.SQL("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT PASSWORD {}")
    who = sql.Identifier(role)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone() is not None
        verb = sql.SQL("ALTER ROLE {} " if exists else "CREATE ROLE {} ").format(who)
        conn.execute(verb + attributes.format(sql.Literal(password)))
        for granted in conn.execute("SELECT r.rolname FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.roleid "
                                    "JOIN pg_roles m ON m.oid = a.member WHERE m.rolname = %s", [role]).fetchall():
            conn.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(granted[0]), who))
        database = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), who))
        for schema in dict.fromkeys(s for s, _ in names):
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), who))
        for schema, table in names:
            conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(schema, table), who))
        conn.execute(sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(who))
    user = urllib.parse.quote(role, safe="") + ("" if password is None else ":" + urllib.parse.quote(password, safe=""))
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment))

