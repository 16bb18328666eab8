"""Runtime state shared by replicas, on Redis (``state.url: redis://...``; issue 20).

Several ``sloctl serve`` processes behind one load balancer keep one picture
of the fleet here. Everything two replicas could race on is one Lua script
(Redis runs a script alone, so it is atomic), never a read-modify-write from
Python:

* **route** (:meth:`RedisStateStore.commit_route`): the first answer for a
  ``query_id`` wins and is kept; the query joins the running set, the
  cluster's billing timer counts it, and a ``route`` event goes to the route
  log. A repeated call (a client retrying on another replica) gets the first
  answer back.
* **complete** (:meth:`RedisStateStore.commit_complete`): the query leaves the
  running set exactly once, the timer counts its end, the violation counters
  move and a ``complete`` event goes to the log; a repeated call gets the
  first answer back.
* **billing timers**: the rules of :class:`~sloctl.control.billing.BillingTimer`
  (AutoSLO §2) in Lua, on the wall clock, per cluster; every closed window is
  appended to ``billed:<cluster>`` (start, end, size), so the bill can be
  checked against the intervals it charged.
* **leases** (:class:`RedisLeaseStore`): the admission lease book; a lease
  is removed by exactly one caller, expired leases by exactly one reclaimer,
  and the credit goes back to the pool of the replica that granted it.

The route log (a Redis stream) is how a replica learns what the others did:
before each decision it reads the events since the last one it saw and
applies them to its own view of the pool (:meth:`RedisStateStore.events`).

Keys live under ``state.key_prefix`` (default ``sloctl``), in one Redis
database (the scripts name keys they build, so not Redis Cluster).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from sloctl.control.credits import Lease

__all__ = ["RedisLeaseStore", "RedisStateStore", "connect_redis", "parse_events"]

_F = "%.17g"  # numbers go through Lua as strings of this form (tostring would keep 14 digits)

_LIB = r"""
local function num(x, default)
  if x == false or x == nil or x == '' then return default end
  return tonumber(x)
end
local function fmt(x) return string.format('%.17g', x) end
-- approximate trimming (whole stream nodes, cheap) for a long log; exact for a short one
local function trim(maxlen) if tonumber(maxlen) >= 1000 then return '~' end return '=' end
-- the route-log events after the caller's last one: a replica learns the others' changes in the same round trip.
-- {gap, events}: gap = 1 when the caller's last event was trimmed away (it missed some: it must resync)
local function since(prefix, last_id)
  if last_id == '' then return {0, {}} end
  if last_id == '0-0' then return {0, redis.call('XRANGE', prefix .. ':log', '-', '+', 'COUNT', 1000)} end
  local events = redis.call('XRANGE', prefix .. ':log', last_id, '+', 'COUNT', 1001)
  if #events == 0 or events[1][1] ~= last_id then return {1, events} end
  table.remove(events, 1)
  return {0, events}
end
-- BillingTimer._advance on the wall clock: close a window whose pause time has passed
local function advance(prefix, cid, t)
  local key = prefix .. ':timer:' .. cid
  local last = num(redis.call('HGET', key, 'now'), -1e300)
  if t < last then t = last end
  redis.call('HSET', key, 'now', fmt(t))
  local start = num(redis.call('HGET', key, 'start'), nil)
  local running = num(redis.call('HGET', key, 'running'), 0)
  if start ~= nil and running == 0 then
    local pause_at = math.max(num(redis.call('HGET', key, 'idle_since'), 0),
                              start + num(redis.call('HGET', key, 'minimum'), 0))
    if pause_at < t then
      local size = num(redis.call('HGET', key, 'size'), 1)
      redis.call('HSET', key, 'accrued', fmt(num(redis.call('HGET', key, 'accrued'), 0) + pause_at - start))
      redis.call('HSET', key, 'start', '')
      redis.call('RPUSH', prefix .. ':billed:' .. cid, fmt(start) .. ',' .. fmt(pause_at) .. ',' .. size)
    end
  end
  return t
end
"""

_ROUTE = _LIB + r"""
-- ARGV: prefix, query_id, answer, row, t, cluster_id, size, minimum_s, replica, maxlen, last event id
local prefix, qid = ARGV[1], ARGV[2]
local prior = redis.call('GET', prefix .. ':route:' .. qid)
if prior then return {0, prior, since(prefix, ARGV[11])} end
local cid = ARGV[6]
local key = prefix .. ':timer:' .. cid
if redis.call('EXISTS', key) == 0 then
  redis.call('HSET', key, 'size', ARGV[7], 'minimum', ARGV[8], 'accrued', '0', 'running', '0', 'start', '')
end
local t = advance(prefix, cid, tonumber(ARGV[5]))
if num(redis.call('HGET', key, 'start'), nil) == nil then redis.call('HSET', key, 'start', fmt(t)) end
redis.call('HINCRBY', key, 'running', 1)
redis.call('SET', prefix .. ':route:' .. qid, ARGV[3])
redis.call('HSET', prefix .. ':running', qid, ARGV[4])
redis.call('XADD', prefix .. ':log', 'MAXLEN', trim(ARGV[10]), ARGV[10], '*', 'r', ARGV[9],
           'd', 'route|' .. qid .. '|' .. cid .. '|' .. fmt(t) .. '|' .. ARGV[4])
return {1, ARGV[3], since(prefix, ARGV[11])}
"""

_COMPLETE = _LIB + r"""
-- ARGV: prefix, query_id, latency_s, status, t, replica, answer_ttl_s, maxlen, last event id
local prefix, qid = ARGV[1], ARGV[2]
local done = redis.call('GET', prefix .. ':done:' .. qid)
if done then return {0, done, since(prefix, ARGV[9])} end
local row = redis.call('HGET', prefix .. ':running', qid)
if not row then return {-1, '', since(prefix, ARGV[9])} end
local r = cjson.decode(row)
local cid = r['cluster_id']
local key = prefix .. ':timer:' .. cid
local t = advance(prefix, cid, tonumber(ARGV[5]))
local running = num(redis.call('HGET', key, 'running'), 0) - 1
if running < 0 then running = 0 end
redis.call('HSET', key, 'running', running)
if running == 0 then redis.call('HSET', key, 'idle_since', fmt(t)) end
redis.call('HDEL', prefix .. ':running', qid)
local violated = (ARGV[4] ~= 'ok') or (tonumber(ARGV[3]) > tonumber(r['slo_s']))
local counters = prefix .. ':counters'
local completed = redis.call('HINCRBY', counters, 'completed', 1)
local violations = redis.call('HINCRBY', counters, 'violations', violated and 1 or 0)
local answer = cjson.encode({query_id = tonumber(qid), cluster_id = cid, violated = violated,
                             predicted_latency_s = r['predicted_s'],
                             request = {latency_s = ARGV[3], status = ARGV[4]}})  -- %.17g: exact
local ttl = tonumber(ARGV[7])
redis.call('SET', prefix .. ':done:' .. qid, answer, 'EX', ttl)
redis.call('EXPIRE', prefix .. ':route:' .. qid, ttl)
redis.call('XADD', prefix .. ':log', 'MAXLEN', trim(ARGV[8]), ARGV[8], '*', 'r', ARGV[6],
           'd', 'complete|' .. qid .. '|' .. cid .. '|' .. fmt(t))
return {1, answer, since(prefix, ARGV[9]), completed, violations}
"""

_SETTLE = _LIB + r"""
-- ARGV: prefix, t, cluster ids...; advance each timer to t; returns per cluster {accrued, start, running, size, ...}
local prefix = ARGV[1]
local out = {}
for i = 3, #ARGV do
  local cid = ARGV[i]
  local key = prefix .. ':timer:' .. cid
  if redis.call('EXISTS', key) == 1 then
    local t = advance(prefix, cid, tonumber(ARGV[2]))
    local start = num(redis.call('HGET', key, 'start'), nil)
    local active = num(redis.call('HGET', key, 'accrued'), 0)
    if start ~= nil then active = active + t - start end
    table.insert(out, cid)
    table.insert(out, fmt(active * num(redis.call('HGET', key, 'size'), 1)))
  end
end
return out
"""

_RETIRE = _LIB + r"""
-- ARGV: prefix, t, cluster id; the cluster's unit-seconds move to the retired total, its timer goes
local prefix, cid = ARGV[1], ARGV[3]
local key = prefix .. ':timer:' .. cid
if redis.call('EXISTS', key) == 0 then return '0' end
local t = advance(prefix, cid, tonumber(ARGV[2]))
local start = num(redis.call('HGET', key, 'start'), nil)
local size = num(redis.call('HGET', key, 'size'), 1)
if start ~= nil then  -- an open window is billed up to now, as the runtime's own timers would report it
  local pause_at = math.max(t, start + num(redis.call('HGET', key, 'minimum'), 0))
  redis.call('HSET', key, 'accrued', fmt(num(redis.call('HGET', key, 'accrued'), 0) + pause_at - start))
  redis.call('RPUSH', prefix .. ':billed:' .. cid, fmt(start) .. ',' .. fmt(pause_at) .. ',' .. size)
end
local unit_s = num(redis.call('HGET', key, 'accrued'), 0) * size
redis.call('HINCRBYFLOAT', prefix .. ':costs', '_retired_unit_s', fmt(unit_s))
redis.call('DEL', key)
return fmt(unit_s)
"""

_LEASE_POP = r"""
-- KEYS: lease key, expiry zset; ARGV: lease id
local doc = redis.call('GET', KEYS[1])
if not doc then return false end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return doc
"""

_LEASE_POP_EXPIRED = r"""
-- KEYS: expiry zset; ARGV: prefix, now (wall), limit
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local key = ARGV[1] .. ':lease:' .. id
  local doc = redis.call('GET', key)
  redis.call('ZREM', KEYS[1], id)
  if doc then
    redis.call('DEL', key)
    table.insert(out, doc)
  end
end
return out
"""

_LEADER = r"""
-- KEYS: leader key; ARGV: replica, ttl ms. Take or renew the lead; returns the leader's name
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
return holder
"""


_RESIGN = r"""
-- KEYS: leader key; ARGV: replica. Give up the lead if this replica holds it
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def connect_redis(url: str) -> Any:
    """A ``redis.Redis`` client for ``url``, checked with a PING (a clear error when Redis cannot be reached)."""
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - the extra is part of make test's install
        raise ValueError("state.url names Redis but the 'redis' package is missing: pip install 'sloctl[redis]'") \
            from exc
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5,
                                  health_check_interval=30)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ValueError(f"The 'state.url' Redis at {url!r} does not answer ({type(exc).__name__}: {exc}).") \
            from None
    return client


class RedisStateStore:
    """The runtime's state on Redis, shared by replicas (see the module docstring).

    Times are wall-clock seconds (the replicas' clocks; a timer never goes
    back: a time earlier than the last it saw counts as that one).

    Args:
        url: ``redis://host:port/db``.
        prefix: key prefix (``state.key_prefix``).
        replica: this replica's name (in log events and lease ownership).
        answer_ttl_s: how long a completed query's answers are kept for
            repeated calls.
        log_maxlen: the route log's approximate length bound.
    """

    shared = True

    def __init__(self, url: str, *, prefix: str = "sloctl", replica: str = "", answer_ttl_s: float = 3600.0,
                 log_maxlen: int = 100_000) -> None:
        self.url, self.prefix, self.replica = url, prefix, replica
        self.answer_ttl_s, self.log_maxlen = answer_ttl_s, log_maxlen
        self.r = connect_redis(url)
        self._route = self.r.register_script(_ROUTE)
        self._complete = self.r.register_script(_COMPLETE)
        self._settle = self.r.register_script(_SETTLE)
        self._retire = self.r.register_script(_RETIRE)
        self._leader = self.r.register_script(_LEADER)
        self._resign = self.r.register_script(_RESIGN)

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    # -- the StateStore operations the runtime shares with SQLite ------------------------
    def costs(self) -> dict[str, float]:
        return {}  # the bill lives in the shared timers (bill()), not in per-process offsets

    def save_costs(self, rows: list[tuple[str, float]], *, delete: tuple[str, ...] = ()) -> None:
        """Nothing to save: every timer change is already in Redis."""

    def running(self) -> list[tuple[int, str, str, float, float, float | None]]:
        rows = []
        for qid, doc in self.r.hgetall(self.key("running")).items():
            d = json.loads(doc)
            rows.append((int(qid), d["template"], d["cluster_id"], d["arrival_wall"], d["slo_s"], d["predicted_s"]))
        return rows

    def add_running(self, row: tuple[int, str, str, float, float, float | None]) -> None:
        raise NotImplementedError("RedisStateStore records running queries through commit_route")

    def remove_running(self, query_id: int) -> None:
        """A running query dropped at a restart's reconciliation (older than ``stale_after_s``)."""
        self.r.hdel(self.key("running"), str(query_id))

    def clusters(self) -> list[tuple[str, int, str]] | None:
        doc = self.r.get(self.key("clusters"))
        return None if doc is None else [tuple(row) for row in json.loads(doc)]

    def save_clusters(self, rows: list[tuple[str, int, str]]) -> None:
        """The cluster set in force; other replicas adopt it from the ``clusters`` log event."""
        doc = json.dumps([list(r) for r in rows])
        with self.r.pipeline(transaction=True) as p:
            p.set(self.key("clusters"), doc)
            p.xadd(self.key("log"), {"r": self.replica, "d": f"clusters|{doc}"}, maxlen=self.log_maxlen,
                   approximate=self.log_maxlen >= 1000)
            p.execute()

    def meta(self, key: str) -> str | None:
        return self.r.hget(self.key("meta"), key)

    def set_meta(self, key: str, value: str) -> None:
        self.r.hset(self.key("meta"), key, value)

    def close(self) -> None:
        self.r.close()

    # -- shared operations ---------------------------------------------------------------
    def answer(self, query_id: int) -> dict[str, Any] | None:
        """The first answer given to a route of ``query_id`` (None: never routed, or forgotten)."""
        doc = self.r.get(self.key(f"route:{query_id}"))
        return None if doc is None else json.loads(doc)

    def commit_route(self, query_id: int, answer: dict[str, Any], row: dict[str, Any], t_wall: float,
                     size: int, minimum_s: float, after_id: str = "") -> tuple[bool, dict[str, Any], list]:
        """Record a route decision unless one exists: ``(True, answer, events)`` if this one won, else
        ``(False, first answer, events)``; ``events`` are the route log's after ``after_id`` (as :meth:`events`;
        none when ``after_id`` is empty)."""
        first, doc, events = self._route(args=[self.prefix, query_id, json.dumps(answer), json.dumps(row),
                                               _F % t_wall, row["cluster_id"], size, _F % minimum_s, self.replica,
                                               self.log_maxlen, after_id])
        return bool(first), json.loads(doc), _parse_since(events)

    def commit_complete(self, query_id: int, latency_s: float, status: str, t_wall: float, after_id: str = ""
                        ) -> tuple[str, dict[str, Any] | None, tuple[int, int] | None, list]:
        """End a running query: ``("new", answer, (completed, violations), events)``, ``("repeat", first answer,
        None, events)`` or ``("unknown", None, None, events)`` (never routed, or forgotten); ``events`` as in
        :meth:`commit_route`."""
        out = self._complete(args=[self.prefix, query_id, _F % latency_s, status, _F % t_wall, self.replica,
                                   int(self.answer_ttl_s), self.log_maxlen, after_id])
        events = _parse_since(out[2])
        if out[0] == -1:
            return "unknown", None, None, events
        answer = json.loads(out[1])
        request = answer["request"]
        request["latency_s"] = float(request["latency_s"])  # kept as a %.17g string: cjson keeps 14 digits
        if out[0] == 0:
            return "repeat", answer, None, events
        return "new", answer, (int(out[3]), int(out[4])), events

    def counters(self) -> tuple[int, int]:
        """Completed queries and violations across every replica."""
        c = self.r.hgetall(self.key("counters"))
        return int(c.get("completed", 0)), int(c.get("violations", 0))

    def bill(self, t_wall: float, cluster_ids: list[str]) -> tuple[dict[str, float], float]:
        """Unit-seconds billed per cluster up to ``t_wall`` (timers advanced to it), and the retired total."""
        out = self._settle(args=[self.prefix, _F % t_wall, *cluster_ids])
        per = {out[i]: float(out[i + 1]) for i in range(0, len(out), 2)}
        return per, float(self.r.hget(self.key("costs"), "_retired_unit_s") or 0.0)

    def retire(self, cluster_id: str, t_wall: float) -> float:
        """Close ``cluster_id``'s timer for good; its unit-seconds join the retired total (returned)."""
        return float(self._retire(args=[self.prefix, _F % t_wall, cluster_id]))

    def billed_windows(self, cluster_id: str) -> list[tuple[float, float, int]]:
        """The closed billing windows of ``cluster_id``: ``(start, end, size)``, in order."""
        return [(float(a), float(b), int(float(c))) for a, b, c in
                (w.split(",") for w in self.r.lrange(self.key(f"billed:{cluster_id}"), 0, -1))]

    def last_event_id(self) -> str:
        """The id of the newest route-log event ('0-0' when the log is empty)."""
        last = self.r.xrevrange(self.key("log"), count=1)
        return last[0][0] if last else "0-0"

    def events(self, after_id: str, count: int = 1000) -> tuple[bool, list[tuple[str, str, list[str]]]]:
        """Route-log events after ``after_id``, oldest first (at most ``count``): ``(gap, [(id, replica, fields)])``.

        Fields: ``["route", query_id, cluster_id, t_wall, row JSON]``, ``["complete", query_id, cluster_id,
        t_wall]`` or ``["clusters", rows JSON]`` (one string per event on the wire, split here: cheap to read).
        ``gap`` is True when the event ``after_id`` was trimmed from the log (``log_maxlen``): the caller
        missed events and must rebuild its view from the state itself.
        """
        if after_id == "0-0":
            return False, parse_events(self.r.xrange(self.key("log"), count=count))
        raw = self.r.xrange(self.key("log"), min=after_id, count=count + 1)
        if not raw or raw[0][0] != after_id:
            return True, parse_events(raw)
        return False, parse_events(raw[1:])

    def lead(self, ttl_s: float) -> bool:
        """Take or renew the scaling lead for ``ttl_s`` seconds; True while this replica holds it."""
        return self._leader(keys=[self.key("leader")], args=[self.replica, max(1, int(ttl_s * 1000))]) == \
            self.replica

    def resign(self) -> None:
        """Give up the scaling lead if this replica holds it (a clean shutdown: another takes it at once)."""
        self._resign(keys=[self.key("leader")], args=[self.replica])

    def lease_store(self, wall0_s: float) -> RedisLeaseStore:
        """The shared lease book, seen from a replica whose clock starts at ``wall0_s``."""
        return RedisLeaseStore(self.r, self.prefix, wall0_s)


def _parse_since(raw: list) -> tuple[bool, list[tuple[str, str, list[str]]]]:
    return bool(raw[0]), parse_events(raw[1])


def parse_events(raw: list) -> list[tuple[str, str, list[str]]]:
    """Route-log entries (``XRANGE`` replies, as dicts or a script's flat lists) as ``(id, replica, fields)``."""
    out = []
    for event_id, e in raw:
        if not isinstance(e, dict):  # a script's reply: the fields as a flat list
            e = dict(zip(e[::2], e[1::2], strict=True))
        kind, _, rest = e["d"].partition("|")
        out.append((event_id, e["r"], [kind, *rest.split("|", 3)] if kind != "clusters" else [kind, rest]))
    return out


class RedisLeaseStore:
    """:class:`~sloctl.control.credits.LeaseStore` on Redis: one key per lease plus an expiry index.

    The runtime's lease times count from its own start (``now_s``); the store
    keeps wall-clock times so that every replica reads them alike.
    """

    def __init__(self, client: Any, prefix: str, wall0_s: float, *, inbox_ttl_s: int = 86_400) -> None:
        self.r, self.prefix, self.wall0_s, self.inbox_ttl_s = client, prefix, wall0_s, inbox_ttl_s
        self._pop = client.register_script(_LEASE_POP)
        self._pop_expired = client.register_script(_LEASE_POP_EXPIRED)

    def _key(self, lease_id: str) -> str:
        return f"{self.prefix}:lease:{lease_id}"

    def _doc(self, lease: Lease) -> str:
        return json.dumps({"lease_id": lease.lease_id, "holder": lease.holder, "klass": lease.klass,
                           "granted": lease.granted_s + self.wall0_s, "expires": lease.expires_s + self.wall0_s,
                           "generation": lease.generation, "owner": lease.owner})

    def _lease(self, doc: str | None) -> Lease | None:
        if doc is None:
            return None
        d = json.loads(doc)
        return Lease(d["lease_id"], d["holder"], d["klass"], d["granted"] - self.wall0_s,
                     d["expires"] - self.wall0_s, d["generation"], d["owner"])

    def put(self, lease: Lease) -> None:
        expires = lease.expires_s + self.wall0_s
        with self.r.pipeline(transaction=True) as p:
            # the key outlives its expiry a while, so that a reclaimer still finds it; the index decides
            p.set(self._key(lease.lease_id), self._doc(lease),
                  px=int((lease.expires_s - lease.granted_s) * 1000) + 3_600_000)
            p.zadd(f"{self.prefix}:lease_exp", {lease.lease_id: expires})
            p.execute()

    def get(self, lease_id: str) -> Lease | None:
        return self._lease(self.r.get(self._key(lease_id)))

    def pop(self, lease_id: str) -> Lease | None:
        return self._lease(self._pop(keys=[self._key(lease_id), f"{self.prefix}:lease_exp"], args=[lease_id]) or None)

    def pop_expired(self, now_s: float) -> list[Lease]:
        docs = self._pop_expired(keys=[f"{self.prefix}:lease_exp"],
                                 args=[self.prefix, _F % (now_s + self.wall0_s), 1000])
        return [self._lease(d) for d in docs]

    def __len__(self) -> int:
        return int(self.r.zcard(f"{self.prefix}:lease_exp"))

    def __iter__(self) -> Iterator[Lease]:
        ids = self.r.zrange(f"{self.prefix}:lease_exp", 0, -1)
        leases = [self.get(i) for i in ids]
        return iter([lease for lease in leases if lease is not None])

    def forward(self, lease: Lease, outcome: str, good: bool) -> None:
        inbox = f"{self.prefix}:inbox:{lease.owner}"
        with self.r.pipeline(transaction=True) as p:
            p.rpush(inbox, json.dumps([lease.klass, lease.generation, outcome, bool(good)]))
            p.expire(inbox, self.inbox_ttl_s)
            p.execute()

    def take_forwarded(self, owner: str) -> list[tuple[str, int, str, bool]]:
        inbox = f"{self.prefix}:inbox:{owner}"
        with self.r.pipeline(transaction=True) as p:
            p.lrange(inbox, 0, -1)
            p.delete(inbox)
            items, _ = p.execute()
        return [tuple(json.loads(item)) for item in items]
