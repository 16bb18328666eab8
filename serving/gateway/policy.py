"""The SLO gateway's per-class policy: priority, share, queue bound, deferral deadline, retry limit k.

A :class:`GatewayPolicy` is a typed document (``kind: gateway-policy``,
version 1) read from YAML or JSON (``sloctl gateway --policy FILE``). Two
registered documents override parts of it when the gateway follows their
aliases:

* an ``admission-policy`` (:class:`~sloctl.control.policies.AdmissionPolicy`)
  gives each class's ``priority`` and ``share``;
* a ``retry-policy`` (:class:`~sloctl.control.policies.RetryPolicy`, what
  ``sloctl retry optimise`` registers) gives each class's retry limit ``k``:
  its budget for calls into ``retry_service`` (``warehouse`` by default), or
  its largest budget when the network has no such service.

The most important class (highest priority) is never deferred by default:
it is placed even when no cluster is predicted to meet its SLO.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["ClassPolicy", "GatewayPolicy", "UserRule", "load_gateway_policy"]


@dataclass(frozen=True)
class ClassPolicy:
    """One class of queries at the gateway.

    Attributes:
        name: the class, as clients tag it (``X-Trino-Client-Tags``).
        priority: larger is more important; deferred queries are released by
            priority, then by share.
        share: weight of the class among deferred queries released together.
        defer: whether a query of this class predicted to miss its SLO
            waits (``True``) or is placed anyway (``False``).
        queue_limit: deferred queries of this class held at once; one more is shed.
        max_defer_s: how long a deferred query may wait before it is shed.
        retries: ``k``, attempts after the first one on a failure or a timeout.
        slo_s: the class's SLO when neither the client nor the SLO table gives one (``None``: none).
        attempt_timeout_s: one attempt's timeout (``None``: the policy's).
        max_run_time_s: the longest a query may take from submission through every
            attempt (Trino's ``query.max-run-time``; ``None``: the policy's); past
            it the query fails with ``EXCEEDED_TIME_LIMIT`` and is not retried.
        group: the routing group whose backends run this class's queries
            (:mod:`sloctl.serving.gateway.backends`; ``None``: every backend).
            A client's ``X-Trino-Routing-Group`` header names another.
    """

    name: str
    priority: int = 1
    share: float = 1.0
    defer: bool = True
    queue_limit: int = 64
    max_defer_s: float = 10.0
    retries: int = 1
    slo_s: float | None = None
    attempt_timeout_s: float | None = None
    max_run_time_s: float | None = None
    group: str | None = None

    def validate(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"The 'classes.{self.name}.{name}' field of gateway-policy must be {rule}, "
                              f"got {getattr(self, name)!r}.")

        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"The 'classes' of gateway-policy must be named by non-empty strings, got {self.name!r}.")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise bad("priority", "an integer")
        if not (isinstance(self.share, int | float) and math.isfinite(self.share) and self.share > 0):
            raise bad("share", "a number > 0")
        if not isinstance(self.defer, bool):
            raise bad("defer", "true or false")
        for name in ("queue_limit", "retries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad(name, "an integer >= 0")
        if not (isinstance(self.max_defer_s, int | float) and math.isfinite(self.max_defer_s)
                and self.max_defer_s >= 0):
            raise bad("max_defer_s", "a number of seconds >= 0")
        if self.group is not None and not (isinstance(self.group, str)
                                           and re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,62}", self.group)):
            raise bad("group", "a routing group name (a letter, then letters, digits or '_.-') or null")
        for name in ("slo_s", "attempt_timeout_s", "max_run_time_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise bad(name, "a number of seconds > 0 or null")


_CLASS_FIELDS = tuple(f.name for f in dataclasses.fields(ClassPolicy) if f.name != "name")


@dataclass(frozen=True)
class UserRule:
    """Which classes the users whose name matches ``user`` (a regular expression, whole name) may use.

    The first class is the one their queries get when they name none of the others.
    """

    user: str
    classes: tuple[str, ...]

    def matches(self, user: str) -> bool:
        return re.fullmatch(self.user, user) is not None


@dataclass(frozen=True)
class GatewayPolicy:
    """The gateway's classes and its defaults (see the module docstring).

    Attributes:
        classes: the classes by name.
        default_class: the class of a query that names none (or an unknown one).
        attempt_timeout_s: one attempt's timeout unless its class sets one.
        retry_service: the service of a retry-policy whose budgets apply here.
        max_run_time_s: a query's longest run, submission to end over every
            attempt, unless its class sets one (Trino's ``query.max-run-time``).
        client_timeout_s: a query whose client has not polled for this long is
            cancelled and its result dropped (Trino's ``query.client.timeout``).
        users: rules mapping users to the classes they may use, first match
            wins; with rules, a user no rule matches gets ``default_class`` only.
            Without rules, any client tag naming a class is taken.
        user_max_running: queries of one user that run (or wait in a class
            queue, or hold unread result pages) at once, over every class
            (Trino resource groups' ``hardConcurrencyLimit``, per user); more
            wait in that user's own queue.
        user_max_queued: queries of one user waiting for one of their running
            ones to end (Trino's ``maxQueued``); one more fails at once with
            ``QUERY_QUEUE_FULL``.
        provenance: where the document and its overrides came from.
    """

    kind: ClassVar[str] = "gateway-policy"
    version: ClassVar[int] = 1

    classes: Mapping[str, ClassPolicy] = field(default_factory=lambda: {
        "high": ClassPolicy("high", priority=2, share=2.0, defer=False, queue_limit=0, retries=2),
        "low": ClassPolicy("low", priority=1, share=1.0, defer=True, queue_limit=64, retries=1)})
    default_class: str = "low"
    attempt_timeout_s: float = 60.0
    retry_service: str = "warehouse"
    max_run_time_s: float = 300.0
    client_timeout_s: float = 300.0
    users: tuple[UserRule, ...] = ()
    user_max_running: int = 16
    user_max_queued: int = 64
    provenance: Mapping[str, str] = field(default_factory=lambda: {"source": "library defaults"})

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("The 'classes' field of gateway-policy must name at least one class, got none.")
        for name, cls in self.classes.items():
            if cls.name != name:
                raise ValueError(f"The 'classes' field of gateway-policy maps {name!r} to a class named {cls.name!r}.")
            cls.validate()
        if self.default_class not in self.classes:
            raise ValueError(f"The 'default_class' field of gateway-policy must be one of {', '.join(self.classes)}, "
                             f"got {self.default_class!r}.")
        if not (isinstance(self.attempt_timeout_s, int | float) and math.isfinite(self.attempt_timeout_s)
                and self.attempt_timeout_s > 0):
            raise ValueError(f"The 'attempt_timeout_s' field of gateway-policy must be a number of seconds > 0, "
                             f"got {self.attempt_timeout_s!r}.")
        for name in ("max_run_time_s", "client_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"The '{name}' field of gateway-policy must be a number of seconds > 0, "
                                 f"got {value!r}.")
        for name, least in (("user_max_running", 1), ("user_max_queued", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"The '{name}' field of gateway-policy must be an integer >= {least}, "
                                 f"got {value!r}.")
        for i, rule in enumerate(self.users):
            try:
                re.compile(rule.user)
            except (re.error, TypeError) as exc:
                raise ValueError(f"The 'users[{i}].user' field of gateway-policy must be a regular expression, "
                                 f"got {rule.user!r} ({exc}).") from None
            unknown = [c for c in rule.classes if c not in self.classes]
            if not rule.classes or unknown:
                raise ValueError(f"The 'users[{i}].classes' field of gateway-policy must list classes of "
                                 f"{', '.join(self.classes)}, got {list(rule.classes)!r}.")

    def klass(self, name: str | None) -> ClassPolicy:
        """The class ``name`` (the default class when ``None`` or unknown)."""
        return self.classes.get(name or "", self.classes[self.default_class])

    def timeout_s(self, name: str) -> float:
        cls = self.klass(name)
        return cls.attempt_timeout_s if cls.attempt_timeout_s is not None else self.attempt_timeout_s

    def run_time_s(self, name: str) -> float:
        """The class's ``max_run_time_s`` (the policy's when it sets none)."""
        cls = self.klass(name)
        return cls.max_run_time_s if cls.max_run_time_s is not None else self.max_run_time_s

    def allowed(self, user: str) -> tuple[str, ...]:
        """The classes ``user`` may use, its default first (every class, the default first, without rules)."""
        for rule in self.users:
            if rule.matches(user):
                return rule.classes
        if self.users:
            return (self.default_class,)
        return (self.default_class, *(c for c in self.classes if c != self.default_class))

    def to_doc(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": self.version, "default_class": self.default_class,
                "attempt_timeout_s": float(self.attempt_timeout_s), "retry_service": self.retry_service,
                "max_run_time_s": float(self.max_run_time_s), "client_timeout_s": float(self.client_timeout_s),
                "users": [{"user": r.user, "classes": list(r.classes)} for r in self.users],
                "user_max_running": self.user_max_running, "user_max_queued": self.user_max_queued,
                "classes": {name: {k: getattr(c, k) for k in _CLASS_FIELDS} for name, c in self.classes.items()},
                "provenance": dict(self.provenance)}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], *, source: str = "document") -> GatewayPolicy:
        """Parse and validate a document; unknown keys are an error naming the field."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"A gateway-policy must be a mapping, got {type(doc).__name__}.")
        known = {"kind", "version", "default_class", "attempt_timeout_s", "retry_service", "classes", "provenance",
                 "max_run_time_s", "client_timeout_s", "users", "user_max_running", "user_max_queued"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ValueError(f"The gateway-policy has unknown field {unknown[0]!r} "
                             f"(known: {', '.join(sorted(known))}).")
        if doc.get("kind", cls.kind) != cls.kind:
            raise ValueError(f"The 'kind' field of gateway-policy must be {cls.kind!r}, got {doc.get('kind')!r}.")
        if doc.get("version", cls.version) != cls.version:
            raise ValueError(f"The 'version' field of gateway-policy must be {cls.version}, "
                             f"got {doc.get('version')!r}.")
        raw = doc.get("classes")
        if not isinstance(raw, Mapping) or not raw:
            raise ValueError(f"The 'classes' field of gateway-policy must map class names to their settings, "
                             f"got {raw!r}.")
        classes = {}
        for name, settings in raw.items():
            settings = settings or {}
            if not isinstance(settings, Mapping):
                raise ValueError(f"The 'classes.{name}' field of gateway-policy must be a mapping, got {settings!r}.")
            bad = sorted(set(settings) - set(_CLASS_FIELDS))
            if bad:
                raise ValueError(f"The 'classes.{name}' field of gateway-policy has unknown field {bad[0]!r} "
                                 f"(known: {', '.join(_CLASS_FIELDS)}).")
            classes[str(name)] = ClassPolicy(str(name), **settings)
        default = doc.get("default_class", min(classes.values(), key=lambda c: c.priority).name)
        rules = doc.get("users") or []
        if not isinstance(rules, list) or not all(isinstance(r, Mapping) for r in rules):
            raise ValueError(f"The 'users' field of gateway-policy must be a list of {{user, classes}} rules, "
                             f"got {rules!r}.")
        users = []
        for i, rule in enumerate(rules):
            bad = sorted(set(rule) - {"user", "classes"})
            if bad or "user" not in rule or "classes" not in rule:
                raise ValueError(f"The 'users[{i}]' field of gateway-policy must hold exactly 'user' (a regular "
                                 f"expression) and 'classes' (a list), got {dict(rule)!r}.")
            names = rule["classes"]
            names = [names] if isinstance(names, str) else list(names or [])
            users.append(UserRule(str(rule["user"]), tuple(str(c) for c in names)))
        return cls(classes=classes, default_class=default,
                   attempt_timeout_s=doc.get("attempt_timeout_s", 60.0),
                   max_run_time_s=doc.get("max_run_time_s", 300.0),
                   client_timeout_s=doc.get("client_timeout_s", 300.0), users=tuple(users),
                   user_max_running=doc.get("user_max_running", 16), user_max_queued=doc.get("user_max_queued", 64),
                   retry_service=str(doc.get("retry_service", "warehouse")),
                   provenance={**dict(doc.get("provenance") or {}), "source": source})

    def with_admission(self, policy: Any, source: str) -> GatewayPolicy:
        """Priorities and shares from a registered admission-policy (classes it does not name keep theirs)."""
        shares = {c.name: c for c in getattr(policy, "classes", ())}
        if not shares:
            return self
        classes = {name: dataclasses.replace(c, priority=int(shares[name].priority), share=float(shares[name].share))
                   if name in shares else c for name, c in self.classes.items()}
        return dataclasses.replace(self, classes=classes, provenance={**self.provenance, "admission": source})

    def with_retries(self, policy: Any, source: str) -> GatewayPolicy:
        """Each class's k from a registered retry-policy (``retry_service``'s budget, else its largest)."""
        retries = getattr(policy, "retries", {})
        classes = {}
        for name, c in self.classes.items():
            row = retries.get(name)
            if not row:
                classes[name] = c
                continue
            k = row.get(self.retry_service, max(row.values()))
            classes[name] = dataclasses.replace(c, retries=int(k))
        return dataclasses.replace(self, classes=classes, provenance={**self.provenance, "retries": source})


def load_gateway_policy(path: str | Path | None) -> GatewayPolicy:
    """The policy in ``path`` (YAML or JSON), or the library defaults for ``None``.

    Raises:
        ValueError: the file is missing, not YAML/JSON, or breaks the schema (naming the field).
    """
    if path is None:
        return GatewayPolicy()
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"The gateway policy file {path} does not exist.")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"The gateway policy file {path} is not YAML or JSON ({' '.join(str(exc).split())}).") from exc
    try:
        return GatewayPolicy.from_doc(doc, source=str(path))
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
