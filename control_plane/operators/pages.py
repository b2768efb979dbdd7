"""The operator console's pages: server-rendered HTML, one small script, no framework.

Accessible: a skip link, one ``<h1>`` per page, landmarks (header, nav, main), every field with
its ``<label>``, tables with captions and column headers, buttons whose accessible names say
what they act on, the current page marked ``aria-current``, a polite live region for outcomes,
a visible focus ring, and colours of a contrast above 7:1 (``#111``/``#0b3d91`` on white). The
focus order is the reading order: skip link, navigation, project picker, sign-out, then the
page. Every value is HTML-escaped (:func:`e`); the script reads what it needs from ``data-``
attributes, never from markup it builds itself.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any, Final
from urllib.parse import urlencode

from control_plane.audit.schemas import AuditEvent
from control_plane.operators.schemas import Operator
from control_plane.passkeys.schemas import Passkey
from control_plane.recovery.schemas import RecoveryRequest
from control_plane.tenancy.schemas import ApiKey, ProjectRef

NAV: Final = (("recovery", "Recovery requests"), ("devices", "Device sign-ins"),
              ("api-keys", "API keys"), ("audit", "Audit log"), ("passkeys", "Your passkeys"))
"""The console's sections: path under /console and label."""

STYLE: Final = """
:root { color: #111; background: #fff; }
body { font-family: system-ui, sans-serif; margin: 0; line-height: 1.5; }
a { color: #0b3d91; }
.skip { position: absolute; left: -999px; top: 0; background: #fff; padding: .5rem; }
.skip:focus { left: .5rem; }
header { border-bottom: 1px solid #767676; padding: .75rem 1.5rem; display: flex; flex-wrap: wrap;
         gap: 1rem 2rem; align-items: center; }
header .brand { font-weight: 700; margin: 0; }
nav ul { list-style: none; display: flex; gap: 1.25rem; margin: 0; padding: 0; flex-wrap: wrap; }
nav a[aria-current="page"] { font-weight: 700; text-decoration-thickness: 3px; }
main { padding: 1rem 1.5rem 3rem; max-width: 72rem; }
.narrow { max-width: 32rem; margin: 3rem auto; padding: 0 1rem; }
label { font-weight: 600; }
input, select { font: inherit; padding: .4rem .5rem; border: 1px solid #444; border-radius: 4px;
                color: #111; background: #fff; }
button { font: inherit; padding: .4rem 1rem; border-radius: 4px; cursor: pointer;
         border: 2px solid #0b3d91; background: #0b3d91; color: #fff; }
button.secondary { background: #fff; color: #0b3d91; }
button:disabled { opacity: .6; cursor: default; }
:focus-visible { outline: 3px solid #b35c00; outline-offset: 2px; }
table { border-collapse: collapse; width: 100%; margin: 1rem 0; }
caption { text-align: left; font-weight: 600; padding: .25rem 0; }
th, td { border-bottom: 1px solid #767676; padding: .4rem .5rem; text-align: left; vertical-align: top; }
code { font-family: ui-monospace, monospace; font-size: .9em; overflow-wrap: anywhere; }
.field { display: flex; flex-direction: column; gap: .2rem; }
.filters { display: flex; flex-wrap: wrap; gap: .75rem 1rem; align-items: flex-end; }
.hint { color: #333; font-size: .9rem; margin: .2rem 0 0; }
.alert { border: 2px solid #8a1c1c; color: #8a1c1c; padding: .5rem .75rem; }
.outcome { font-weight: 600; }
#status { font-weight: 600; min-height: 1.5em; }
.picker { display: flex; gap: .5rem; align-items: center; }
.who { margin: 0 0 0 auto; display: flex; gap: .75rem; align-items: center; }
"""

SCRIPT: Final = """
"use strict";
const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
const project = document.body.dataset.project || "";
const statusBox = document.getElementById("status");
function say(text) { statusBox.textContent = text; }
async function post(path, body) {
  const url = project ? path + "?" + new URLSearchParams({project_id: project}) : path;
  const response = await fetch(url, {method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
    body: JSON.stringify(body || {})});
  let data = null;
  try { data = await response.json(); } catch (err) { data = null; }
  if (response.status === 401) {
    window.location.assign("/console/sign-in");
    throw new Error("Your session has ended: sign in again.");
  }
  if (!response.ok) throw new Error(data && data.error ? data.error.message : "The request was refused.");
  return data;
}
for (const button of document.querySelectorAll("button[data-post]")) {
  button.addEventListener("click", async () => {
    const row = button.closest("[data-row]") || document.body;
    const buttons = Array.from(row.querySelectorAll("button[data-post]"));
    const body = {};
    const note = button.dataset.note ? document.getElementById(button.dataset.note) : null;
    if (note && note.value.trim()) body.note = note.value.trim();
    for (const b of buttons) b.disabled = true;
    say(button.dataset.working || "Working…");
    try {
      await post(button.dataset.post, body);
      const outcome = row.querySelector(".outcome");
      if (outcome) { outcome.textContent = button.dataset.done; outcome.focus(); }
      for (const b of buttons) b.hidden = true;
      if (note) note.disabled = true;
      say(button.dataset.done + " " + (button.dataset.what || ""));
    } catch (err) {
      say(err.message);
      for (const b of buttons) b.disabled = false;
    }
  });
}
const signOut = document.getElementById("sign-out");
if (signOut) signOut.addEventListener("click", async () => {
  signOut.disabled = true;
  try { await post("/console/sign-out"); } catch (err) { say(err.message); }
  window.location.assign("/console/sign-in");
});
const webauthn = window.PublicKeyCredential
  && typeof PublicKeyCredential.parseCreationOptionsFromJSON === "function"
  && typeof PublicKeyCredential.parseRequestOptionsFromJSON === "function";
const noWebauthn = "This browser cannot use passkeys here (it needs WebAuthn's JSON helpers: "
  + "Chrome 129+, Firefox 119+, Safari 18.4+); use a sign-in link.";
const device = document.getElementById("device");
if (device) {
  const code = document.getElementById("user_code");
  async function decide(decision) {
    if (!code.value.trim()) { say("Enter the code authio login shows."); code.focus(); return; }
    const buttons = device.querySelectorAll("button");
    for (const b of buttons) b.disabled = true;
    say(decision === "approve" ? "Approving…" : "Denying…");
    try {
      const result = await post("/console/devices/approve", {user_code: code.value.trim(), decision});
      say(result.status === "approved"
        ? "Approved " + result.user_code + ": the tool is signed in to project " + result.project_id
          + " with the scopes " + result.scopes.join(", ") + "."
        : "Denied " + result.user_code + ": the tool was refused.");
      code.value = "";
    } catch (err) { say(err.message); }
    for (const b of buttons) b.disabled = false;
  }
  device.addEventListener("submit", (event) => { event.preventDefault(); decide("approve"); });
  document.getElementById("deny").addEventListener("click", () => decide("deny"));
}
"""


def e(value: Any) -> str:
    """``value`` as HTML text (quotes included: safe in attributes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def href(path: str, **params: str | None) -> str:
    """``path`` with the given query parameters (those not None), escaped for an attribute."""
    given = {k: v for k, v in params.items() if v is not None}
    return e(f"{path}?{urlencode(given)}" if given else path)


def _document(nonce: str, *, title: str, body: str, csrf: str = "", project: str = "",
              script: str = "") -> str:
    """The page: ``body``, then the shared script and the page's own ``script`` (a block of
    its own after the shared one, whose ``say`` and ``post`` it may use)."""
    meta = f'<meta name="csrf-token" content="{e(csrf)}">' if csrf else ""
    own = f"{{{script}}}" if script else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">{meta}
<title>{e(title)} · authio console</title>
<style nonce="{nonce}">{STYLE}</style></head>
<body data-project="{e(project)}">
{body}
<script nonce="{nonce}">{SCRIPT}{own}</script></body></html>
"""


def layout(nonce: str, *, title: str, section: str, operator: Operator,
           projects: Sequence[ProjectRef], project: ProjectRef | None, csrf: str,
           main: str, script: str = "") -> str:
    """A signed-in page: the header (sections, project picker, who is signed in) and ``main``
    under the page's ``<h1>`` ``title``, with the page's own ``script``."""
    pid = project.id if project else None
    current = ' aria-current="page"'
    links = "".join(
        f'<li><a href="{href(f"/console/{path}", project_id=pid)}"'
        f'{current if path == section else ""}>{e(label)}</a></li>'
        for path, label in NAV)
    if len(projects) > 1:
        options = "".join(
            f'<option value="{e(p.id)}"{" selected" if project and p.id == project.id else ""}>'
            f'{e(p.name)} ({e(p.environment)})</option>' for p in projects)
        picker = (f'<form class="picker" method="get" action="/console/{e(section)}">'
                  f'<label for="project">Project</label>'
                  f'<select id="project" name="project_id">{options}</select>'
                  f'<button type="submit" class="secondary">Switch</button></form>')
    elif project is not None:
        picker = f'<p class="picker">Project: {e(project.name)} ({e(project.environment)})</p>'
    else:
        picker = '<p class="picker">This tenant has no project yet.</p>'
    who = (f'<div class="who"><span>Signed in as {e(operator.email)}</span>'
           f'<button type="button" id="sign-out" class="secondary">Sign out</button></div>')
    body = f"""<a class="skip" href="#main">Skip to the page</a>
<header><p class="brand">authio console</p>
<nav aria-label="Console"><ul>{links}</ul></nav>
{picker}{who}</header>
<main id="main" tabindex="-1"><h1>{e(title)}</h1>
<p id="status" role="status" aria-live="polite"></p>
{main}</main>"""
    return _document(nonce, title=title, body=body, csrf=csrf, project=pid or "", script=script)


def alert(message: str | None) -> str:
    return f'<p class="alert" role="alert">{e(message)}</p>' if message else ""


def next_link(path: str, label: str, next_cursor: str | None, **params: str | None) -> str:
    if not next_cursor:
        return ""
    return f'<p><a href="{href(path, **params, cursor=next_cursor)}">{e(label)}</a></p>'


# --- the pages ---------------------------------------------------------------------------------


STEP_UP: Final = """<section id="step-up" hidden aria-labelledby="step-up-title">
<h2 id="step-up-title" tabindex="-1">Confirm it is you</h2>
<p>This sign-in is unusual for you (a new device, network or place, say), so it needs
confirming before the console opens.</p>
<p><button type="button" id="step-up-passkey" hidden>Confirm with your passkey</button>
<button type="button" id="step-up-link" class="secondary" hidden>Email me a confirmation
link</button></p>
</section>"""
"""The step-up of a challenged sign-in (:data:`SIGN_IN_SCRIPT`'s ``stepUp``), hidden until
one is needed."""

SIGN_IN_SCRIPT: Final = """
class Refused extends Error {
  constructor(error) {
    super(error.message);
    this.code = error.code;
    this.details = error.details || {};
  }
}
async function json(path, body) {
  const init = {method: "POST", credentials: "same-origin"};
  if (body !== undefined) {
    init.headers = {"Content-Type": "application/json"};
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let data = null;
  try { data = await response.json(); } catch (err) { data = null; }
  if (!response.ok) {
    throw new Refused(data && data.error ? data.error : {message: "The request was refused."});
  }
  return data;
}
async function openConsole(grant) {
  const session = await json("/console/session",
    {access_token: grant.access_token, refresh_token: grant.refresh_token});
  say("Signed in as " + session.operator.email + ".");
  window.location.assign("/console/recovery");
}
function stepUp(projectId, details) {
  const box = document.getElementById("step-up");
  const byPasskey = document.getElementById("step-up-passkey");
  const byLink = document.getElementById("step-up-link");
  const methods = details.methods || [];
  const challenge = {challenge_id: details.challenge_id};
  const q = "?" + new URLSearchParams({project_id: projectId});
  byPasskey.hidden = !(methods.includes("passkey") && webauthn);
  byLink.hidden = !methods.includes("magic_link");
  box.hidden = false;
  if (byPasskey.hidden && byLink.hidden) {
    say(methods.includes("passkey") ? noWebauthn : "This sign-in needs confirming, and there is no way to here.");
    return;
  }
  say("This sign-in needs confirming: " + (byPasskey.hidden ? "" : "use your passkey")
      + (byPasskey.hidden || byLink.hidden ? "" : ", or ")
      + (byLink.hidden ? "" : "get a link by e-mail") + " within "
      + Math.round(details.expires_in / 60) + " minutes.");
  document.getElementById("step-up-title").focus();
  function busy(on) { byPasskey.disabled = on; byLink.disabled = on; }
  byPasskey.onclick = async () => {
    busy(true);
    say("Confirming with your passkey…");
    try {
      const options = await json("/v1/auth/step-up/passkey/options" + q, challenge);
      const credential = await navigator.credentials.get(
        {publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options)});
      const grant = await json("/v1/auth/step-up/passkey/verify" + q,
                               {...credential.toJSON(), ...challenge});
      await openConsole(grant);
    } catch (err) {
      say(err.name === "NotAllowedError" ? "No passkey was used." : err.message);
      busy(false);
    }
  };
  byLink.onclick = async () => {
    busy(true);
    say("Sending…");
    try {
      const sent = await json("/v1/auth/step-up/magic-link/send" + q, challenge);
      say("A confirmation link is on its way to " + sent.destination + ". It expires in "
          + Math.round(sent.expires_in / 60) + " minutes; opening it signs you in.");
      byPasskey.disabled = false;
    } catch (err) {
      say(err.message);
      busy(false);
    }
  };
}
"""
"""The sign-in pages' own helpers: ``json`` (a POST whose refusal throws :class:`Refused`
with the envelope's ``code`` and ``details``), ``openConsole`` (hand a sign-in's tokens to
``POST /console/session``) and ``stepUp`` (offer the methods a ``step_up_required`` refusal
allows, with the public step-up calls of the operator project)."""


def sign_in(nonce: str) -> str:
    body = f"""<main id="main" class="narrow"><h1>Sign in to the operator console</h1>
<p>Enter the e-mail address you were added with as an operator. We send a sign-in link
there; it works once.</p>
<form id="sign-in" novalidate>
<div class="field"><label for="email">E-mail address</label>
<input id="email" name="email" type="email" autocomplete="email" required
       aria-describedby="email_hint"></div>
<p class="hint" id="email_hint">Operators are added by the tenant's owners, with an API key.
Once signed in, you can add a passkey and sign in with it next time.</p>
<p><button type="submit" id="send">Email me a sign-in link</button></p>
</form>
<p>Or, with a passkey you added in the console (no address needed):
<button type="button" id="passkey" class="secondary">Sign in with a passkey</button></p>
<p id="status" role="status" aria-live="polite"></p>
{STEP_UP}
</main>"""
    script = SIGN_IN_SCRIPT + """
const form = document.getElementById("sign-in"), email = document.getElementById("email");
email.focus();
form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const address = email.value.trim();
  if (!address) { say("Enter your e-mail address."); email.focus(); return; }
  const button = document.getElementById("send");
  button.disabled = true;
  say("Sending…");
  try {
    const data = await json("/console/sign-in", {email: address});
    say("If " + address + " is an operator's address, a sign-in link is on its way. "
        + "It expires in " + Math.round(data.expires_in / 60) + " minutes.");
  } catch (err) {
    say(err instanceof Refused ? err.message : "Could not reach the server; try again.");
  }
  button.disabled = false;
});
const passkey = document.getElementById("passkey");
passkey.addEventListener("click", async () => {
  if (!webauthn) { say(noWebauthn); return; }
  passkey.disabled = true;
  say("Signing in with a passkey…");
  try {
    const options = await json("/console/sign-in/passkey");
    const credential = await navigator.credentials.get(
      {publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options)});
    await openConsole(await json("/console/sign-in/passkey/verify", credential.toJSON()));
  } catch (err) {
    if (err.code === "step_up_required") { stepUp(err.details.project_id, err.details); return; }
    say(err.name === "NotAllowedError" ? "No passkey was used." : err.message);
    passkey.disabled = false;
  }
});
"""
    return _document(nonce, title="Sign in", body=body, script=script)


def verify(nonce: str) -> str:
    body = f"""<main id="main" class="narrow"><h1>Sign in to the operator console</h1>
<p id="status" role="status" aria-live="polite">Press the button to finish signing in.</p>
<button id="signin" type="button">Sign in</button>
{STEP_UP}
</main>"""
    script = SIGN_IN_SCRIPT + """
const button = document.getElementById("signin");
const params = new URLSearchParams(window.location.search);
const project = params.get("project_id") || "";
const token = new URLSearchParams(window.location.hash.slice(1)).get("token") || "";
button.focus();
button.addEventListener("click", async () => {
  button.disabled = true;
  say("Signing in…");
  let grant;
  try {
    grant = await json("/v1/auth/magic-link/verify?" + new URLSearchParams({project_id: project}),
                       {token});
  } catch (err) {
    if (!(err instanceof Refused)) { say("Could not reach the server; try again."); button.disabled = false; return; }
    history.replaceState(null, "", window.location.pathname + window.location.search);
    button.hidden = true;
    if (err.code === "step_up_required") { stepUp(project, err.details); return; }
    say(err.message);
    return;
  }
  history.replaceState(null, "", window.location.pathname + window.location.search);
  try {
    await openConsole(grant);
  } catch (err) {
    say(err instanceof Refused ? err.message : "Could not reach the server; try again.");
  }
});
"""
    return _document(nonce, title="Sign in", body=body, script=script)


def _when(value: Any) -> str:
    text = value.isoformat().replace("+00:00", "Z") if hasattr(value, "isoformat") else str(value)
    return f'<time datetime="{e(text)}">{e(text[:19].replace("T", " "))}</time>'


def recovery(requests: Iterable[RecoveryRequest], *, error: str | None,
             more: str) -> str:
    rows = []
    for r in requests:
        who = f"user {r.user_id}"
        rows.append(f"""<tr data-row id="{e(r.id)}">
<td>{_when(r.created_at)}</td><td><code>{e(r.user_id)}</code></td>
<td>{e("E-mail" if r.channel == "email" else "SMS")}: {e(r.destination)}</td>
<td>{e(r.reason or "")}</td>
<td><label for="note-{e(r.id)}">Note <span class="hint">(kept with the decision)</span></label>
<input id="note-{e(r.id)}" maxlength="2000"></td>
<td><button type="button" data-post="/console/recovery/{e(r.id)}/approve"
 data-note="note-{e(r.id)}" data-done="Approved." data-working="Approving…"
 data-what="A recovery link is on its way to {e(r.destination)}."
 aria-label="Approve the recovery of {e(who)}">Approve</button>
<button type="button" class="secondary" data-post="/console/recovery/{e(r.id)}/deny"
 data-note="note-{e(r.id)}" data-done="Denied." data-working="Denying…"
 aria-label="Deny the recovery of {e(who)}">Deny</button>
<span class="outcome" tabindex="-1"></span></td></tr>""")
    table = f"""<table><caption>Pending requests, oldest first</caption>
<thead><tr><th scope="col">Requested</th><th scope="col">User</th>
<th scope="col">New destination</th><th scope="col">Reason</th><th scope="col">Note</th>
<th scope="col">Decision</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>""" if rows else "<p>No request is waiting.</p>"
    return f"""{alert(error)}<p>A user who lost every way in asked, through your application, to
be let in at a new address. Approving makes it the user's, ends every session of the user and
sends a one-time link there; denying changes nothing.</p>
{table}{more}"""


def devices(*, user_code: str | None, project: ProjectRef | None) -> str:
    target = f"{e(project.name)} (<code>{e(project.id)}</code>)" if project else "this project"
    return f"""<p><code>authio login</code> shows a code and opens this page. Approve it only if you
started it and the code is the one it shows: the tool gets a new API key of {target}.</p>
<form id="device" novalidate>
<div class="field"><label for="user_code">Code shown by authio login</label>
<input id="user_code" name="user_code" autocomplete="off" autocapitalize="characters"
 spellcheck="false" required value="{e(user_code or "")}" aria-describedby="code_hint"></div>
<p class="hint" id="code_hint">Eight letters, such as WDJB-MJHT.</p>
<p><button type="submit" id="approve">Approve</button>
<button type="button" id="deny" class="secondary">Deny</button></p>
</form>"""


def api_keys(keys: Iterable[ApiKey], *, error: str | None, more: str) -> str:
    rows = []
    for k in keys:
        state = (f"Revoked {_when(k.revoked_at)}" if k.revoked_at else
                 f'<button type="button" class="secondary" data-post="/console/api-keys/{e(k.id)}/revoke"'
                 f' data-done="Revoked." data-working="Revoking…"'
                 f' aria-label="Revoke the key {e(k.name)} ({e(k.prefix)}…{e(k.last_four)})">Revoke</button>'
                 f'<span class="outcome" tabindex="-1"></span>')
        scopes = ", ".join(k.scopes) if k.scopes else "full access"
        rows.append(f"""<tr data-row id="{e(k.id)}"><td>{e(k.name)}</td>
<td><code>{e(k.prefix)}…{e(k.last_four)}</code></td><td>{e(scopes)}</td>
<td>{_when(k.created_at)}</td><td>{state}</td></tr>""")
    table = f"""<table><caption>The project's keys, oldest first</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Key</th><th scope="col">Scopes</th>
<th scope="col">Created</th><th scope="col">State</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>""" if rows else "<p>The project has no key.</p>"
    return f"""{alert(error)}<p>A revoked key is refused everywhere at once, for good.</p>
{table}{more}"""


AUDIT_FIELDS: Final = (
    ("type", "Action", "Comma-separated, such as recovery.request.approved."),
    ("actor", "Actor id", "An operator, key or user id."),
    ("user", "User id", "Events about this user."),
    ("from", "From (UTC)", "Such as 2026-01-31T09:00."),
    ("to", "To (UTC)", "Before this time."),
    ("q", "Search", "Text in the action, actor, target or description."),
)


def audit(events: Iterable[AuditEvent] | None, *, project: ProjectRef | None,
          filters: dict[str, str | None], error: str | None, more: str) -> str:
    pid = project.id if project else None
    fields = "".join(
        f'<div class="field"><label for="f-{name}">{e(label)}</label>'
        f'<input id="f-{name}" name="{name}" value="{e(filters.get(name) or "")}"'
        f' aria-describedby="h-{name}"><span class="hint" id="h-{name}">{e(hint)}</span></div>'
        for name, label, hint in AUDIT_FIELDS)
    form = f"""<form class="filters" method="get" action="/console/audit">
<input type="hidden" name="project_id" value="{e(pid or "")}">{fields}
<p><button type="submit">Filter</button> <a href="{href("/console/audit", project_id=pid)}">Clear</a></p>
</form>"""
    given = {k: v for k, v in filters.items() if v}
    exports = (f'<p>Export these events: <a href="{href("/console/audit/events.csv", project_id=pid, **given)}">'
               f'CSV</a>, <a href="{href("/console/audit/events.jsonl", project_id=pid, **given)}">'
               f'JSON lines</a> (up to 100,000, newest first).</p>')
    rows = [f"""<tr><td>{e(ev.created_at[:19].replace("T", " "))}</td><td><code>{e(ev.action)}</code></td>
<td>{e(ev.actor_type)}<br><code>{e(ev.actor_id or "")}</code></td><td><code>{e(ev.user_id or "")}</code></td>
<td>{e(ev.target_type or "")}<br><code>{e(ev.target_id or "")}</code></td><td>{e(ev.description or "")}</td></tr>"""
            for ev in events or ()]
    if events is None:
        table = ""
    elif rows:
        table = f"""<table id="events"><caption>Events, newest first (times in UTC)</caption>
<thead><tr><th scope="col">Time</th><th scope="col">Action</th><th scope="col">Actor</th>
<th scope="col">User</th><th scope="col">Target</th><th scope="col">Description</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>"""
    else:
        table = "<p>No event matches.</p>"
    return f"{form}{alert(error)}{exports}{table}{more}"


PASSKEYS_SCRIPT: Final = """
const said = sessionStorage.getItem("authio_console_said");
if (said) { sessionStorage.removeItem("authio_console_said"); say(said); }
const add = document.getElementById("add-passkey");
if (add) add.addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!webauthn) { say(noWebauthn); return; }
  const button = document.getElementById("add");
  const name = document.getElementById("passkey-name").value.trim();
  button.disabled = true;
  say("Adding a passkey…");
  try {
    const options = await post("/console/passkeys/options", name ? {name} : {});
    const credential = await navigator.credentials.create(
      {publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(options)});
    const added = await post("/console/passkeys", credential.toJSON());
    sessionStorage.setItem("authio_console_said", "Added the passkey " + added.name + ".");
    window.location.reload();  // to list it; the reloaded page says it was added
  } catch (err) {
    say(err.name === "NotAllowedError" ? "No passkey was added." : err.message);
    button.disabled = false;
  }
});
"""


def passkeys(keys: Iterable[Passkey], *, error: str | None) -> str:
    rows = []
    for k in keys:
        rows.append(f"""<tr data-row id="{e(k.id)}"><td>{e(k.name)}</td><td>{_when(k.created_at)}</td>
<td>{_when(k.last_used_at) if k.last_used_at else "never"}</td>
<td><button type="button" class="secondary" data-post="/console/passkeys/{e(k.id)}/remove"
 data-done="Removed." data-working="Removing…"
 aria-label="Remove the passkey {e(k.name)}">Remove</button>
<span class="outcome" tabindex="-1"></span></td></tr>""")
    table = f"""<table id="passkeys"><caption>Your passkeys, oldest first</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Added</th><th scope="col">Last used</th>
<th scope="col">Remove</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>""" if rows else "<p>You have no passkey yet.</p>"
    form = "" if error else """<form id="add-passkey" novalidate>
<div class="field"><label for="passkey-name">Name of the new passkey</label>
<input id="passkey-name" maxlength="100" autocomplete="off" aria-describedby="name_hint"></div>
<p class="hint" id="name_hint">Such as the device it is on (default: Passkey).</p>
<p><button type="submit" id="add">Add a passkey</button></p></form>"""
    return f"""{alert(error)}<p>A passkey signs you in to the console without a mailed link: on the
sign-in page, choose Sign in with a passkey (no address needed). A removed passkey signs no
one in any more.</p>
{table}{form}"""
