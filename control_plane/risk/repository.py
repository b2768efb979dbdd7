"""Risk SQL: policies, the history a sign-in is scored against, the CTEs that record a decision in
the sign-in's own statement, decisions read back, and step-up challenges.

The sign-in statement (``sessions.repository``) is one statement for the session, its refresh
token and its events; the risk engine adds its writes to it as CTEs, so a decision, what it
taught about the user (known devices, networks and countries, the last location) and its events
commit with the sign-in or not at all (DESIGN.md "audit writes"):

* :func:`allowed_ctes` after the session ``s``: the decision (when this sign-in was scored),
  the user's facts, the last location, ``auth.risk_evaluated``;
* :func:`refused_ctes` in place of the session: the decision, the step-up challenge of a
  ``challenge``, ``auth.risk_evaluated`` and the outcome's own event;
* :func:`step_up_cte`, part of a step-up's head: the challenge used up, its decision pointed at
  the session about to start.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import asyncpg

from common.db import Params
from control_plane.audit import service as audit

DECISION_COLUMNS: Final = ("d.id, d.user_id, d.session_id, d.method, d.score, d.decision, "
                           "d.signals, d.reasons, d.inputs, c.id AS step_up_challenge_id, "
                           "d.created_at")


# --- policies ---------------------------------------------------------------------------------


async def find_policy(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        """SELECT threshold_challenge, threshold_block, signals, updated_at FROM risk_policies
           WHERE project_id = $1""", project_id)
    return row


async def put_policy(conn: asyncpg.Connection, project_id: str, threshold_challenge: int,
                     threshold_block: int, signals: dict[str, dict[str, Any]]) -> datetime:
    """Insert or replace the project's policy; its ``updated_at``."""
    updated: datetime = await conn.fetchval(
        """INSERT INTO risk_policies AS p (project_id, threshold_challenge, threshold_block, signals)
           VALUES ($1, $2, $3, $4)
           ON CONFLICT (project_id) DO UPDATE SET threshold_challenge = EXCLUDED.threshold_challenge,
                  threshold_block = EXCLUDED.threshold_block, signals = EXCLUDED.signals,
                  updated_at = now()
           RETURNING updated_at""",
        project_id, threshold_challenge, threshold_block, signals)
    return updated


# --- what a sign-in is scored against ---------------------------------------------------------

def history_select(project: str, user: str, device: str, network: str, country: str,
                   window: str) -> str:
    """A one-row SELECT of what a sign-in is scored against: the project ``project``'s policy
    (nulls: the default), the user ``user``'s known facts (one scan of their ``risk_known``
    rows) against the attempt's ``device``, ``network`` and ``country``, the last located
    sign-in, and the refused sign-ins of the last ``window`` (an interval; the audit log's user
    index). The arguments are SQL expressions: placeholders, or columns of a query this one is
    joined to (``LEFT JOIN LATERAL``). A user that does not exist has no facts."""
    return f"""
SELECT p.threshold_challenge, p.threshold_block, p.signals,
       coalesce(k.devices_known, false) AS devices_known,
       coalesce(k.device_seen, false) AS device_seen,
       coalesce(k.networks_known, false) AS networks_known,
       coalesce(k.network_seen, false) AS network_seen,
       coalesce(k.countries_known, false) AS countries_known,
       coalesce(k.country_seen, false) AS country_seen,
       l.latitude, l.longitude, extract(epoch FROM l.signed_in_at)::float8 AS last_at,
       l.country AS last_country, l.city AS last_city,
       (SELECT count(*) FROM audit_events e
        WHERE e.project_id = {project} AND e.user_id = {user}
          AND e.created_at > now() - {window}::interval
          AND e.action = 'auth.signin_attempt' AND e.metadata ->> 'outcome' = 'failure')::int
           AS failed_attempts
FROM (SELECT 1) AS one
LEFT JOIN risk_policies p ON p.project_id = {project}
LEFT JOIN risk_last_locations l ON l.user_id = {user}
LEFT JOIN (
    SELECT bool_or(kind = 'device') AS devices_known,
           bool_or(kind = 'device' AND value = {device}) AS device_seen,
           bool_or(kind = 'network') AS networks_known,
           bool_or(kind = 'network' AND value = {network}) AS network_seen,
           bool_or(kind = 'country') AS countries_known,
           bool_or(kind = 'country' AND value = {country}) AS country_seen
    FROM risk_known WHERE user_id = {user}
) k ON true"""


HISTORY: Final = history_select("$1", "$2", "$3", "$4", "$5", "$6")
""":func:`history_select` of project ``$1``, user ``$2``, device ``$3``, network ``$4``,
country ``$5`` and window ``$6``."""


def history_join(p: Params, *, project: str, user: str) -> str:
    """``LEFT JOIN LATERAL`` of :func:`history_select` as ``h``, for a sign-in's own lookup to
    carry what it will be scored against (one round trip less); the attempt's facts are the
    named parameters ``risk_device``, ``risk_network``, ``risk_country`` and ``risk_window``."""
    facts = history_select(project, user, p["risk_device"], p["risk_network"], p["risk_country"],
                           p["risk_window"])
    return f"LEFT JOIN LATERAL ({facts}) h ON true"


POLICY: Final = """SELECT p.threshold_challenge, p.threshold_block, p.signals
FROM (SELECT 1) AS one LEFT JOIN risk_policies p ON p.project_id = $1"""
"""The policy alone (a first sign-in has no history)."""


# --- recording, inside the sign-in statement --------------------------------------------------


def _decision_insert(p: Params, *, source: str, user: str, session: str, decision: str,
                     where: str = "") -> str:
    return f"""INSERT INTO risk_decisions (id, project_id, user_id, session_id, method, score,
                                decision, signals, reasons, inputs)
    SELECT {p['rd_id']}, {p['project_id']}, {user}, {session}, {p['rd_method']}, {p['rd_score']},
           {decision}, {p['rd_signals']}::jsonb, {p['rd_reasons']}::text[], {p['rd_inputs']}::jsonb
    FROM {source} {where}
    RETURNING id, user_id"""


def allowed_ctes(p: Params) -> str:
    """CTEs of a sign-in statement after its session ``s``: the decision ``rd`` (only when
    ``rd_record``: a step-up's sign-in was scored when it was challenged), the user's facts
    (``rk_kinds``/``rk_values``, parallel text arrays) seen now, the last location (when
    ``rl_latitude`` is not null) and ``auth.risk_evaluated`` (``risk_event_*``) per decision."""
    return f"""rd AS (
    {_decision_insert(p, source="s", user="s.user_id", session="s.id", decision="'allow'",
                      where=f"WHERE {p['rd_record']}")}
), rk AS (
    INSERT INTO risk_known (user_id, kind, value)
    SELECT s.user_id, f.kind, f.value
    FROM s, unnest({p['rk_kinds']}::text[], {p['rk_values']}::text[]) AS f (kind, value)
    ON CONFLICT (user_id, kind, value) DO UPDATE SET last_seen = now()
), rl AS (
    INSERT INTO risk_last_locations (user_id, ip, country, city, latitude, longitude, signed_in_at)
    SELECT s.user_id, {p['rl_ip']}, {p['rl_country']}, {p['rl_city']}, {p['rl_latitude']},
           {p['rl_longitude']}, now()
    FROM s WHERE {p['rl_latitude']}::float8 IS NOT NULL
    ON CONFLICT (user_id) DO UPDATE SET ip = EXCLUDED.ip, country = EXCLUDED.country,
           city = EXCLUDED.city, latitude = EXCLUDED.latitude, longitude = EXCLUDED.longitude,
           signed_in_at = EXCLUDED.signed_in_at
), re AS (
    {audit.insert_from("rd", p, name="risk_event")}
)"""


def refused_ctes(p: Params, gate: str) -> str:
    """CTEs of a refused sign-in, in place of its session, when the head ``u`` (and the CTEs of
    ``gate``) yield rows: the decision ``rd`` (``rd_decision``: ``challenge`` or ``block``), for
    a challenge the step-up challenge ``ch`` (``ch_id``, ``ch_ttl``; the sign-in's
    ``organization_id`` kept for the session it ends in), then the events:
    ``auth.signin_attempt`` (``event_*``), ``auth.risk_evaluated`` (``risk_event_*``) and the
    outcome's (``outcome_event_*``)."""
    return f"""rd AS (
    {_decision_insert(p, source=f"u{gate}", user="u.id", session="NULL", decision=p['rd_decision'])}
), ch AS (
    INSERT INTO step_up_challenges (id, project_id, user_id, decision_id, method, organization_id,
                                    expires_at)
    SELECT {p['ch_id']}, {p['project_id']}, rd.user_id, rd.id, {p['rd_method']},
           {p['organization_id']}, now() + {p['ch_ttl']}::interval
    FROM rd WHERE {p['rd_decision']} = 'challenge'
    RETURNING id
), e AS (
    {audit.insert_from("rd", p)}
), re AS (
    {audit.insert_from("rd", p, name="risk_event")}
), oe AS (
    {audit.insert_from("rd", p, name="outcome_event")}
)"""


REFUSED_SELECT: Final = """SELECT rd.id AS decision_id, (SELECT id FROM ch) AS challenge_id,
       u.email_verified OR u.phone_verified AS link_possible,
       EXISTS (SELECT 1 FROM passkeys k WHERE k.user_id = rd.user_id) AS passkey_possible
FROM rd, u"""
"""What a refused sign-in statement answers: the decision, the challenge, and which step-ups the
user can take."""


def step_up_cte(p: Params, *, after: str | None = None) -> str:
    """The CTE ``su`` of a step-up's head: the challenge ``su_id`` of the user, still pending and
    unexpired, is used up by ``su_method`` for the session ``session_id`` (when ``after`` names
    a CTE, only if it yielded a row: the proof was accepted), and ``sd`` points its decision at
    that session. Gate ``", su"``."""
    proof = f" AND EXISTS (SELECT 1 FROM {after})" if after else ""
    return f"""su AS (
    UPDATE step_up_challenges SET status = 'satisfied', satisfied_by = {p['su_method']},
           session_id = {p['session_id']}, used_at = now()
    WHERE id = {p['su_id']} AND user_id = {p['user_id']} AND project_id = {p['project_id']}
      AND status = 'pending' AND expires_at > now(){proof}
    RETURNING decision_id
), sd AS (
    UPDATE risk_decisions SET session_id = {p['session_id']}
    WHERE id = (SELECT decision_id FROM su)
)"""


# --- step-up challenges -----------------------------------------------------------------------

CHALLENGE: Final = """
SELECT c.id, c.project_id, c.user_id, c.decision_id, c.method, c.organization_id, c.status,
       c.expires_at <= now() AS expired, extract(epoch FROM c.expires_at - now()) AS seconds_left,
       u.email, u.email_verified, u.phone_number, u.phone_verified,
       EXISTS (SELECT 1 FROM passkeys k WHERE k.user_id = c.user_id) AS has_passkey
FROM step_up_challenges c JOIN users u ON u.id = c.user_id
WHERE c.id = $1 AND c.project_id = $2"""


async def fail_challenge(conn: asyncpg.Connection, challenge_id: str) -> None:
    """A pending challenge whose proof was refused is used up (``failed``)."""
    await conn.execute(
        """UPDATE step_up_challenges SET status = 'failed', used_at = now()
           WHERE id = $1 AND status = 'pending'""", challenge_id)


# --- reading decisions ------------------------------------------------------------------------


async def find_decision(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        decision_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""SELECT {DECISION_COLUMNS} FROM risk_decisions d
            LEFT JOIN step_up_challenges c ON c.decision_id = d.id
            WHERE d.id = $1 AND d.project_id = $2""", decision_id, project_id)
    return row


async def list_decisions(conn: asyncpg.Connection | asyncpg.Pool, project_id: str, *,
                         user: str | None, decision: str | None, since: datetime | None,
                         until: datetime | None, after: str | None, limit: int) -> list[asyncpg.Record]:
    """Up to ``limit`` decisions newest first (ids are ULIDs: creation order), strictly older
    than the id ``after``; the filters are exact (``since`` inclusive, ``until`` exclusive)."""
    p = Params()
    conds = [f"d.project_id = {p(project_id)}"]
    if user is not None:
        conds.append(f"d.user_id = {p(user)}")
    if decision is not None:
        conds.append(f"d.decision = {p(decision)}")
    if since is not None:
        conds.append(f"d.created_at >= {p(since)}")
    if until is not None:
        conds.append(f"d.created_at < {p(until)}")
    if after is not None:
        conds.append(f"d.id < {p(after)}")
    rows: list[asyncpg.Record] = await conn.fetch(
        f"""SELECT {DECISION_COLUMNS} FROM risk_decisions d
            LEFT JOIN step_up_challenges c ON c.decision_id = d.id
            WHERE {' AND '.join(conds)} ORDER BY d.id DESC LIMIT {p(limit)}::int""", *p.values)
    return rows


# --- housekeeping -----------------------------------------------------------------------------

FORGET_USER: Final = "UPDATE risk_decisions SET user_id = NULL WHERE project_id = $1 AND user_id = $2"
"""A deleted user's decisions stay as history without its id (the column references no user:
a data-subject deletion anonymizes them in batches instead, migration 0013)."""

KNOWN_DAYS: Final = 180
"""How long a device, network or country stays known without a sign-in from it."""
CHALLENGE_KEEP_DAYS: Final = 30
"""How long a used or expired challenge stays (its decision names it meanwhile)."""

PURGES: Final = {
    "risk_known": f"""
        DELETE FROM risk_known WHERE (user_id, kind, value) IN (
            SELECT user_id, kind, value FROM risk_known
            WHERE last_seen < now() - interval '{KNOWN_DAYS} days' LIMIT $1)""",
    "step_up_challenges": f"""
        DELETE FROM step_up_challenges WHERE id IN (
            SELECT id FROM step_up_challenges
            WHERE expires_at < now() - interval '{CHALLENGE_KEEP_DAYS} days' LIMIT $1)""",
}
"""Facts not seen for :data:`KNOWN_DAYS`, and challenges :data:`CHALLENGE_KEEP_DAYS` past their
expiry, in batches of ``$1``."""
