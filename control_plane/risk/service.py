"""Risk rules: the project's policy, the scoring of each primary sign-in, the decisions read back,
and what a step-up needs (SPEC.md 1, 5.5, 6; DESIGN.md "risk").

Scoring (:meth:`RiskEngine.assess`), before the sign-in writes anything:

1. The attempt as the signals see it (``signals.base.Attempt``): the client address (the peer,
   or ``X-Forwarded-For`` behind ``SERVICE_TRUSTED_PROXIES``: nobody picks their own score),
   its device fingerprint (``inputs.device``), its place in the GeoIP database, and the attempts
   from that address and on that account in the velocity window, counted in Redis (sorted sets,
   one pipelined round trip; out of reach within :data:`VELOCITY_TIMEOUT_SECONDS`, the
   velocity signals say so and do not fire: Redis never stops a sign-in).
2. In one query, the policy and the user's history (``repository.HISTORY``).
3. Every enabled signal; the score is the fired ones' weights summed, capped at 100; ``block``
   at or above ``threshold_block``, ``challenge`` at or above ``threshold_challenge``, else
   ``allow``.

The sign-in then records it in its own statement (``sessions.service.start_session`` with
:func:`allowed_values` or :func:`refused_values` and the CTEs of ``repository``), so the
decision, the user's facts and the events commit with the sign-in. ``SERVICE_RISK_ENGINE=off``
scores nothing (:meth:`RiskEngine.observe`): sign-ins are allowed and still teach the history.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg
from cachetools import TTLCache
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

from common.errors import NotFound, UnknownOrExpiredChallenge
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.risk import repository, signals
from control_plane.risk.inputs import Device, GeoIp, address_of, device, warm_up
from control_plane.risk.repository import allowed_ctes, history_join, refused_ctes, step_up_cte
from control_plane.risk.schemas import (
    Decision,
    DecisionKind,
    DecisionsQuery,
    Policy,
    PolicyBody,
    SignalPolicy,
    SignalResult,
    default_policy,
)
from control_plane.risk.signals.base import Attempt, History, LastSignIn, Limits, Place
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, page_of, position
from control_plane.web.ratelimit import client_bucket

__all__ = [
    "REFUSED_SELECT",
    "Assessment",
    "AttemptCounters",
    "Challenge",
    "RiskEngine",
    "SignInAttempt",
    "allowed_ctes",
    "allowed_values",
    "current_policy",
    "fail_challenge",
    "find_challenge",
    "find_decision",
    "history_join",
    "list_decisions",
    "refused_ctes",
    "refused_values",
    "set_policy",
    "step_up_cte",
]

log = logging.getLogger("authio.risk")

POLICY_CACHE_SECONDS: Final = 1.0
"""How long a process keeps a project's policy for first sign-ins."""
VELOCITY_TIMEOUT_SECONDS: Final = 0.5
"""The longest a sign-in waits for the attempt counters."""
REFUSED_SELECT: Final = repository.REFUSED_SELECT
COUNT_ATTEMPTS: Final = """
local now, window, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local counts = {}
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
  redis.call('ZADD', key, now, member)
  redis.call('ZREMRANGEBYRANK', key, 0, -(tonumber(ARGV[3 + i]) + 1))
  counts[i] = redis.call('ZCARD', key)
  redis.call('PEXPIRE', key, window)
end
return counts
"""
"""Count an attempt in each sliding window of ``KEYS`` (sorted sets of the attempts' times):
drop what left the window (``ARGV[2]`` ms before ``ARGV[1]``), add the attempt ``ARGV[3]``,
keep at most ``ARGV[3 + i]`` entries in the i-th set, answer each set's size."""
LISTING: Final = "risk_decisions"


# --- the attempt counters ----------------------------------------------------------------------


class AttemptCounters:
    """The Lua script :data:`COUNT_ATTEMPTS` run on a Redis connection of the risk engine's own,
    the calls of concurrent sign-ins sent together.

    A sign-in makes one call, and on this path redis-py's client layers (the shared pool,
    retries, events) and the event loop's wake-ups cost more CPU than Redis's work: measured on
    a 2-core box, ~285 us a call through the client against ~160 us on a bare connection of the
    same library, plus the loop's share per round trip. So the calls a moment's sign-ins make
    (those queued while a batch is out) go as one write of several EVALSHA and are answered by
    reading the replies in order: one round trip, and one wake-up, for all of them. A batch that
    fails, or takes longer than :data:`VELOCITY_TIMEOUT_SECONDS`, fails each of its calls and
    drops the connection (a reply may be left in flight); the next batch opens another. A
    connection that served before and is found closed (Redis restarted) is replaced at once and
    the batch sent again on the new one, so the first sign-ins after a restart are counted.
    Replies of a Redis that lost the script (a restart) are ``NOSCRIPT``: the script is loaded
    and those calls sent again."""

    def __init__(self, redis: Redis) -> None:
        self._pool = redis.connection_pool
        self._conn: Connection | None = None
        self._sha = hashlib.sha1(COUNT_ATTEMPTS.encode()).hexdigest()
        self._queue: list[tuple[list[str], list[int | str], asyncio.Future[list[int]]]] = []
        self._sender: asyncio.Task[None] | None = None
        self._served = False  # the connection has answered a round trip

    async def count(self, keys: list[str], args: list[int | str]) -> list[int]:
        """Each window's count once the attempt is added. Raises RedisError, OSError or
        TimeoutError."""
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._queue.append((keys, args, future))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send(), name="risk attempt counters")
        return await future

    async def _send(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    async with asyncio.timeout(VELOCITY_TIMEOUT_SECONDS):
                        counts = await self._run([(keys, args) for keys, args, _ in batch])
                except Exception as exc:
                    await self._drop()
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, _, future), found in zip(batch, counts, strict=True):
                        if not future.done():
                            future.set_result(found)
        finally:
            self._sender = None

    async def _run(self, calls: list[tuple[list[str], list[int | str]]]) -> list[list[int]]:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._pool.make_connection()  # type: ignore[no-untyped-call]
            self._served = False
        try:
            replies = await self._round_trip(conn, "EVALSHA", self._sha, calls)
        except (RedisConnectionError, OSError):
            if not self._served:  # a new connection that fails: Redis is away
                raise
            # One that served before: Redis may have restarted since (its socket is dead): once
            # more on a new connection. Only a Redis that died mid-batch counts a call twice.
            await self._drop()
            return await self._run(calls)
        self._served = True
        lost = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if lost:
            again = await self._round_trip(conn, "EVAL", COUNT_ATTEMPTS, [calls[i] for i in lost])
            for i, reply in zip(lost, again, strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [[int(c) for c in reply] for reply in replies]

    @staticmethod
    async def _round_trip(conn: Connection, command: str, script: str,
                          calls: list[tuple[list[str], list[int | str]]]) -> list[Any]:
        """Send ``command`` (EVALSHA or EVAL of ``script``) once per call, in one write, and
        read the replies in order; an error reply is kept in its place."""
        await conn.send_packed_command(conn.pack_commands(
            [(command, script, len(keys), *keys, *args) for keys, args in calls]))
        replies: list[Any] = []
        for _ in calls:
            try:
                replies.append(await conn.read_response())
            except ResponseError as exc:  # the reply of one call; the connection is fine
                replies.append(exc)
        return replies

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect(nowait=True)

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
        await self._drop()


# --- the attempt and its assessment ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SignInAttempt:
    """A primary sign-in about to start a session: of ``user_id`` (``new_user``: created by this
    very sign-in) in ``project_id``, from ``ip`` with ``user_agent`` and the client ``hints`` it
    sent (``platform``, ``mobile``)."""

    project_id: str
    user_id: str
    new_user: bool
    ip: str | None
    user_agent: str | None
    hints: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Assessment:
    """What the risk engine made of a sign-in: the decision (``decision_id``, ``score``,
    ``decision``, every enabled signal's result, the fired ``reasons``, the ``inputs`` seen, the
    thresholds applied) and what a successful sign-in teaches (``device``, ``place``).
    ``scored`` is false for a sign-in that was not scored (a step-up's, or the engine off)."""

    decision_id: str
    scored: bool
    score: int
    decision: DecisionKind
    signals: tuple[SignalResult, ...]
    reasons: tuple[str, ...]
    inputs: dict[str, Any]
    threshold_challenge: int
    threshold_block: int
    device: Device | None
    place: Place | None

    @property
    def fired(self) -> list[str]:
        return [s.name for s in self.signals if s.fired]

    def attempt_metadata(self) -> dict[str, Any]:
        """What ``auth.signin_attempt`` records of the decision (SPEC.md 6: score, decision,
        reasons, with the device, IP and user agent the attempt has already); with the engine
        off, that nothing was scored."""
        if not self.scored:
            return {"score": None, "decision": "allow", "reasons": [], "decision_id": None,
                    "risk_engine": "off"}
        return {"score": self.score, "decision": self.decision, "reasons": list(self.reasons),
                "decision_id": self.decision_id}


def _limits(settings: Settings) -> Limits:
    return Limits(
        ip_attempts=settings.risk_ip_attempts,
        destination_attempts=settings.risk_destination_attempts,
        failed_attempts=settings.risk_failed_attempts,
        window_seconds=settings.risk_velocity_window_seconds,
        failed_window_seconds=settings.risk_failed_window_seconds,
        travel_max_kmh=settings.risk_travel_max_kmh, travel_min_km=settings.risk_travel_min_km)


class RiskEngine:
    """The app's risk engine (``control_plane.appkeys.RISK``): the settings' limits and known-bad
    networks, the GeoIP database (when ``SERVICE_GEOIP_DATABASE`` names one) and the Redis
    counters."""

    def __init__(self, settings: Settings, redis: Redis) -> None:
        self.on = settings.risk_engine == "on"
        self.limits = _limits(settings)
        self.blocked = settings.risk_blocked_network_list
        self.geo = GeoIp(settings.geoip_database) if settings.geoip_database else None
        self.counters = AttemptCounters(redis)
        self.key_prefix = settings.redis_prefix + "risk:"
        self.failed_window = timedelta(seconds=settings.risk_failed_window_seconds)
        # A first sign-in reads only the policy: the project's, kept for POLICY_CACHE_SECONDS
        # (and forgotten at once when this process sets it; another process's PUT is seen
        # within that time, as API keys are).
        self._policies: TTLCache[str, Policy] = TTLCache(maxsize=10_000, ttl=POLICY_CACHE_SECONDS)

    def forget_policy(self, project_id: str) -> None:
        """The project's policy changed: read it again at its next sign-in."""
        self._policies.pop(project_id, None)

    async def start(self) -> None:
        """Load the User-Agent parser's regexes now rather than in the first sign-in."""
        await asyncio.to_thread(warm_up)

    async def close(self) -> None:
        await self.counters.close()
        if self.geo is not None:
            self.geo.close()

    def _blocked_network(self, ip: str | None) -> str | None:
        address = address_of(ip) if self.blocked else None
        if address is None:
            return None
        return next((str(n) for n in self.blocked if address in n), None)

    async def _counts(self, attempt: SignInAttempt) -> tuple[int | None, int | None]:
        """Attempts from the address and on the account in the velocity window, this one
        counted in: one Lua script (:data:`COUNT_ATTEMPTS`, :class:`AttemptCounters`). Members
        are the attempts' millisecond times made unique; each set holds at most twice its limit,
        so a flood costs bounded memory and still counts over the limit. (None, None) when Redis
        does not answer within :data:`VELOCITY_TIMEOUT_SECONDS`."""
        now_ms = int(time.time() * 1000)
        base = f"{self.key_prefix}{attempt.project_id}:"
        keys = [f"{base}user:{attempt.user_id}"]
        caps = [2 * self.limits.destination_attempts]
        if attempt.ip:
            keys.insert(0, f"{base}ip:{client_bucket(attempt.ip)}")
            caps.insert(0, 2 * self.limits.ip_attempts)
        args: list[int | str] = [now_ms, self.limits.window_seconds * 1000,
                                 f"{now_ms}:{secrets.token_hex(4)}", *caps]
        try:
            async with asyncio.timeout(VELOCITY_TIMEOUT_SECONDS):
                counts = await self.counters.count(keys, args)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("risk: attempt counters out of reach (%s: %s); velocity not evaluated",
                        type(exc).__name__, exc)
            return None, None
        return (int(counts[0]), int(counts[1])) if attempt.ip else (None, int(counts[0]))

    def seen(self, ip: str | None, user_agent: str | None,
             hints: dict[str, Any] | None) -> tuple[Device | None, Place | None]:
        """The device of a request (its User-Agent and client hints) and the place of its
        address (None without a GeoIP database)."""
        return device(user_agent, hints), self.geo.place(ip) if self.geo is not None else None

    def history_values(self, ip: str | None, user_agent: str | None,
                       hints: dict[str, Any] | None) -> dict[str, object]:
        """The parameters of ``history_join`` for a request: its device, network and country,
        and the failure window."""
        device_, network, country = _facts(*self.seen(ip, user_agent, hints))
        return {"risk_device": device_, "risk_network": network, "risk_country": country,
                "risk_window": self.failed_window}

    def observe(self, attempt: SignInAttempt) -> Assessment:
        """The facts of a sign-in that is not scored (a step-up's: it was scored when
        challenged; or the engine off): its device and place, to remember once it succeeds."""
        found, place = self.seen(attempt.ip, attempt.user_agent, attempt.hints)
        return Assessment(new_id("rd"), False, 0, "allow", (), (), {}, 0, 0, found, place)

    async def assess(self, conn: asyncpg.Connection, attempt: SignInAttempt, *,
                     known: asyncpg.Record | None = None) -> Assessment:
        """Score ``attempt`` (see the module docstring); nothing is written but the attempt
        counters. ``known``: a row the sign-in's own lookup read through ``history_join`` (no
        read of its own then). With the engine off, :meth:`observe`."""
        if not self.on:
            return self.observe(attempt)
        found, place = self.seen(attempt.ip, attempt.user_agent, attempt.hints)
        counting = asyncio.ensure_future(self._counts(attempt))
        try:
            if known is not None:
                history = History() if attempt.new_user else _history_of(known)
                policy = _policy_of(known)
            elif attempt.new_user:  # nothing to compare with: the policy alone
                history = History()
                cached = self._policies.get(attempt.project_id)
                if cached is None:
                    cached = _policy_of(await conn.fetchrow(repository.POLICY, attempt.project_id))
                    self._policies[attempt.project_id] = cached
                policy = cached
            else:
                row = await conn.fetchrow(
                    repository.HISTORY, attempt.project_id, attempt.user_id,
                    *_facts(found, place), self.failed_window)
                assert row is not None
                history, policy = _history_of(row), _policy_of(row)
                self._policies[attempt.project_id] = policy
        finally:
            ip_attempts, destination_attempts = await counting
        seen = Attempt(ip=attempt.ip, device=found.fingerprint if found else None,
                       device_label=found.label if found else "no device",
                       geo=self.geo is not None, place=place, at=time.time(),
                       ip_attempts=ip_attempts, destination_attempts=destination_attempts,
                       blocked_network=self._blocked_network(attempt.ip))
        results = []
        for name, evaluate in signals.EVALUATORS.items():
            setting = policy.signals[name]
            if setting.enabled:
                outcome = evaluate(seen, history, self.limits)
                results.append(SignalResult(name, outcome.fired,
                                            setting.weight if outcome.fired else 0, outcome.reason))
        score = min(100, sum(r.contribution for r in results))
        decision: DecisionKind = ("block" if score >= policy.threshold_block else
                                  "challenge" if score >= policy.threshold_challenge else "allow")
        inputs = {
            "ip": attempt.ip, "user_agent": attempt.user_agent,
            "device": {"fingerprint": found.fingerprint, "label": found.label} if found else None,
            "geoip": self.geo is not None,
            "place": _place(place),
            "ip_attempts": ip_attempts, "destination_attempts": destination_attempts,
            "failed_attempts": history.failed_attempts,
            "last_sign_in": _last(history.last),
            "new_user": attempt.new_user,
            "thresholds": {"challenge": policy.threshold_challenge, "block": policy.threshold_block},
        }
        return Assessment(new_id("rd"), True, score, decision, tuple(results),
                          tuple(r.reason for r in results if r.fired), inputs,
                          policy.threshold_challenge, policy.threshold_block, found, place)


def _facts(found: Device | None, place: Place | None) -> tuple[str | None, str | None, str | None]:
    """What a sign-in's history is read against: (device fingerprint, network, country)."""
    return (found.fingerprint if found else None, place.network if place else None,
            place.country if place else None)


def _place(place: Place | None) -> dict[str, Any] | None:
    if place is None:
        return None
    return {"country": place.country, "city": place.city, "latitude": place.latitude,
            "longitude": place.longitude, "network": place.network}


def _last(last: LastSignIn | None) -> dict[str, Any] | None:
    """The last located sign-in as a decision's inputs show it (its time in RFC 3339)."""
    if last is None:
        return None
    at = datetime.fromtimestamp(last.at, UTC).isoformat().replace("+00:00", "Z")
    return {"latitude": last.latitude, "longitude": last.longitude, "at": at,
            "country": last.country, "city": last.city}


def _history_of(row: asyncpg.Record) -> History:
    last = None
    if row["latitude"] is not None:
        last = LastSignIn(row["latitude"], row["longitude"], row["last_at"], row["last_country"],
                          row["last_city"])
    return History(devices_known=row["devices_known"], device_seen=row["device_seen"],
                   networks_known=row["networks_known"], network_seen=row["network_seen"],
                   countries_known=row["countries_known"], country_seen=row["country_seen"],
                   last=last, failed_attempts=row["failed_attempts"])


# --- what the sign-in statement records --------------------------------------------------------


def _decision_values(a: Assessment, method: str) -> dict[str, object]:
    return {"rd_id": a.decision_id, "rd_method": method, "rd_score": a.score,
            "rd_signals": [{"name": s.name, "fired": s.fired, "contribution": s.contribution,
                            "reason": s.reason} for s in a.signals],
            "rd_reasons": list(a.reasons), "rd_inputs": a.inputs}


def _risk_event(a: Assessment, actor: Actor, project_id: str, method: str) -> dict[str, object]:
    """``auth.risk_evaluated``: the compact mirror of the decision (SPEC.md 6)."""
    return audit.event_params(
        actor, name="risk_event", action="auth.risk_evaluated", project_id=project_id,
        target_type="risk_decision", target_id=a.decision_id, user_id=actor.id,
        description=f"Risk score {a.score}: {a.decision}",
        metadata={"decision_id": a.decision_id, "score": a.score, "decision": a.decision,
                  "signals": a.fired, "reasons": list(a.reasons), "method": method,
                  "threshold_challenge": a.threshold_challenge,
                  "threshold_block": a.threshold_block})


def allowed_values(a: Assessment, actor: Actor, *, project_id: str, method: str) -> dict[str, object]:
    """The parameters of ``allowed_ctes`` for a sign-in ``a`` allowed (or did not score): the
    decision when scored, the facts to remember (device, network, country) and the location."""
    kinds, values = [], []
    if a.device is not None:
        kinds.append("device")
        values.append(a.device.fingerprint)
    if a.place is not None:
        for kind, value in (("network", a.place.network), ("country", a.place.country)):
            if value:
                kinds.append(kind)
                values.append(value)
    located = a.place is not None and a.place.latitude is not None and a.place.longitude is not None
    place = a.place
    return {**_decision_values(a, method), "rd_record": a.scored,
            "rk_kinds": kinds, "rk_values": values,
            "rl_ip": actor.ip, "rl_country": place.country if place else None,
            "rl_city": place.city if place else None,
            "rl_latitude": place.latitude if located and place else None,
            "rl_longitude": place.longitude if located and place else None,
            **_risk_event(a, actor, project_id, method)}


def refused_values(a: Assessment, actor: Actor, *, project_id: str, method: str,
                   challenge_id: str, ttl: timedelta) -> dict[str, object]:
    """The parameters of ``refused_ctes`` for a sign-in ``a`` challenged or blocked: the
    decision, the challenge ``challenge_id`` lasting ``ttl``, ``auth.risk_evaluated`` and the
    outcome's event (``auth.step_up_required`` or ``auth.blocked_by_risk_policy``)."""
    if a.decision == "challenge":
        outcome = audit.event_params(
            actor, name="outcome_event", action="auth.step_up_required", project_id=project_id,
            target_type="step_up_challenge", target_id=challenge_id, user_id=actor.id,
            description=f"Step-up required: risk score {a.score} reached {a.threshold_challenge}",
            metadata={"challenge_id": challenge_id, "decision_id": a.decision_id,
                      "score": a.score, "threshold_challenge": a.threshold_challenge,
                      "reasons": list(a.reasons), "method": method,
                      "expires_in": int(ttl.total_seconds())})
    else:
        outcome = audit.event_params(
            actor, name="outcome_event", action="auth.blocked_by_risk_policy",
            project_id=project_id, target_type="risk_decision", target_id=a.decision_id,
            user_id=actor.id,
            description=f"Sign-in blocked: risk score {a.score} reached {a.threshold_block}",
            metadata={"decision_id": a.decision_id, "score": a.score,
                      "threshold_block": a.threshold_block, "reasons": list(a.reasons),
                      "method": method})
    return {**_decision_values(a, method), "rd_decision": a.decision, "ch_id": challenge_id,
            "ch_ttl": ttl, **_risk_event(a, actor, project_id, method), **outcome}


# --- the policy --------------------------------------------------------------------------------


_DEFAULT_POLICY: Final = default_policy()


def _policy_of(row: Mapping[str, Any] | None) -> Policy:
    """The policy of a row of ``risk_policies`` (None, or nulls: the default), every signal
    present: one the row does not set keeps its default."""
    base = _DEFAULT_POLICY
    if row is None or row["threshold_block"] is None:
        return base
    stored = row["signals"] or {}
    merged = {name: SignalPolicy(bool(stored[name].get("enabled", True)),
                                 int(stored[name]["weight"]), default.description)
              if isinstance(stored.get(name), dict) and "weight" in stored[name] else default
              for name, default in base.signals.items()}
    return Policy(row["threshold_challenge"], row["threshold_block"], merged, False,
                  row.get("updated_at"))


async def current_policy(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> Policy:
    """The project's policy, or the default while it never set one."""
    return _policy_of(await repository.find_policy(conn, project_id))


async def set_policy(conn: asyncpg.Connection, actor: Actor, *, body: PolicyBody) -> Policy:
    """Replace the actor's project's policy with ``body`` (signals it leaves out take their
    defaults) and record ``risk.policy.updated`` with the new thresholds and the number of
    enabled signals (SPEC.md 6), in one transaction."""
    project_id = actor.project_id
    assert project_id is not None
    chosen: dict[str, dict[str, Any]] = {
        name: {"enabled": body.signals[name].enabled, "weight": body.signals[name].weight}
              if name in body.signals else {"enabled": d.enabled, "weight": d.weight}
              for name, d in _DEFAULT_POLICY.signals.items()}
    async with conn.transaction():
        updated = await repository.put_policy(conn, project_id, body.threshold_challenge,
                                              body.threshold_block, chosen)
        policy = _policy_of({"threshold_challenge": body.threshold_challenge,
                             "threshold_block": body.threshold_block, "signals": chosen,
                             "updated_at": updated})
        await audit.record(
            conn, actor, action="risk.policy.updated", target_type="risk_policy",
            target_id=project_id,
            description=(f"Risk policy: challenge at {policy.threshold_challenge}, block at "
                         f"{policy.threshold_block}, {policy.enabled_count} signals enabled"),
            metadata={"threshold_challenge": policy.threshold_challenge,
                      "threshold_block": policy.threshold_block,
                      "enabled_signals": policy.enabled_count, "signals": chosen})
    return policy


# --- decisions ---------------------------------------------------------------------------------


def _decision_of(row: asyncpg.Record) -> Decision:
    return Decision(
        id=row["id"], user_id=row["user_id"], session_id=row["session_id"], method=row["method"],
        score=row["score"], decision=row["decision"],
        signals=[SignalResult(**s) for s in row["signals"]], reasons=list(row["reasons"]),
        inputs=row["inputs"], step_up_challenge_id=row["step_up_challenge_id"],
        created_at=row["created_at"])


async def forget_user(conn: asyncpg.Connection, *, project_id: str, user_id: str) -> None:
    """In ``conn``'s transaction: the user's decisions lose its id (a user deleted through
    ``DELETE /v1/users/{id}``); its known devices, places and challenges go with its row."""
    await conn.execute(repository.FORGET_USER, project_id, user_id)


async def find_decision(pool: asyncpg.Pool, project_id: str, decision_id: str) -> Decision:
    """The project's decision ``decision_id``. Raises NotFound (another project's too)."""
    row = None
    if is_id(decision_id, "rd"):
        row = await repository.find_decision(pool, project_id, decision_id)
    if row is None:
        raise NotFound("No risk decision with that id in this project.")
    return _decision_of(row)


async def list_decisions(pool: asyncpg.Pool, listing: Listing, query: DecisionsQuery) -> Page[Decision]:
    """A page of the project's decisions, newest first, filtered by ``query``. Raises
    InvalidRequest (cursor)."""
    at = position(query, listing, key_len=1)
    rows = await repository.list_decisions(
        pool, listing.project_id, user=query.user, decision=query.decision, since=query.since,
        until=query.to, after=at.after[0] if at.after else None, limit=at.limit + 1)
    return page_of([_decision_of(r) for r in rows], at, listing, key=lambda d: [d.id])


# --- step-up challenges ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Challenge:
    """A pending, unexpired step-up challenge (``expires_in``: whole seconds left, at least 1),
    its user's verified contacts and whether the user has a passkey."""

    id: str
    project_id: str
    user_id: str
    decision_id: str
    method: str
    organization_id: str | None
    expires_in: int
    email: str | None
    phone_number: str | None
    has_passkey: bool


async def find_challenge(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                         challenge_id: str) -> Challenge:
    """The project's challenge ``challenge_id`` while it can still be satisfied, with the
    user's verified e-mail and phone number (None when not verified). Raises
    UnknownOrExpiredChallenge for an unknown, used, failed or expired one, or another
    project's."""
    row = await conn.fetchrow(repository.CHALLENGE, challenge_id, project_id)
    if row is None or row["status"] != "pending" or row["expired"]:
        state = "expired" if row is not None and row["expired"] else (
            row["status"] if row is not None else "unknown")
        raise UnknownOrExpiredChallenge(
            "The step-up challenge is unknown, already used or expired; sign in again.",
            details={"challenge_id": challenge_id, "state": "used" if state == "satisfied" else state})
    return Challenge(row["id"], row["project_id"], row["user_id"], row["decision_id"],
                     row["method"], row["organization_id"], max(1, int(row["seconds_left"])),
                     row["email"] if row["email_verified"] else None,
                     row["phone_number"] if row["phone_verified"] else None, row["has_passkey"])


async def fail_challenge(conn: asyncpg.Connection, challenge_id: str) -> None:
    """Use up a pending challenge whose proof was refused: it satisfies nothing from then on."""
    await repository.fail_challenge(conn, challenge_id)
