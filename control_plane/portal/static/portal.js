// The admin portal's script (control_plane/portal/page.py). No framework: it reads the portal's
// state with the session cookie (HttpOnly, so never seen here), fills the page, and calls the
// portal's POST /v1/portal/... routes. Text only ever goes in through textContent and value
// (the page's CSP requires Trusted Types for any HTML sink).
"use strict";

const $ = (id) => document.getElementById(id);
const status = $("status");
let state = null;

function say(text, kind) {
  status.className = kind || "";
  status.textContent = text;
}

class Refused extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || "The request was refused (HTTP " + status + ").");
    this.status = status;
    this.code = error.code || "";
  }
}

async function call(method, path, body) {
  const init = {method, credentials: "same-origin", headers: {Accept: "application/json"}};
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new Refused(0, {error: {message: "Could not reach the server; check your connection and try again."}});
  }
  let data = null;
  try { data = await response.json(); } catch (err) { data = null; }
  if (!response.ok) throw new Refused(response.status, data);
  return data;
}

function ended(err) {
  // The session is over (or never began): nothing on the page can be used any more.
  for (const section of document.querySelectorAll("section")) section.hidden = true;
  $("intro").textContent = "Ask the application that sent you here for a new setup link.";
  say(err.message, "problem");
}

function failed(err) {
  if (err.status === 410) ended(err);
  else say(err.message, "problem");
}

function busy(button, on) {
  button.disabled = on;
  button.setAttribute("aria-busy", on ? "true" : "false");
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

// --- domains ------------------------------------------------------------------------------------

let current = null;  // the domain whose record is shown

function showRecord(domain) {
  current = domain.domain;
  $("record-name").value = domain.txt_record.name;
  $("record-value").value = domain.txt_record.value;
  $("record-heading").textContent = "Publish this TXT record for " + domain.domain;
  $("record").hidden = false;
}

function renderDomains(domains) {
  const list = $("domains");
  list.replaceChildren();
  $("no-domains").hidden = domains.length > 0;
  for (const domain of domains) {
    const item = document.createElement("li");
    const name = document.createElement("span");
    name.textContent = domain.domain;
    const badge = document.createElement("span");
    badge.className = "badge " + domain.status;
    badge.textContent = domain.status === "verified" ? "Verified" : "Pending verification";
    item.append(name, badge);
    if (domain.status !== "verified") {
      const show = document.createElement("button");
      show.type = "button";
      show.className = "secondary";
      show.textContent = "Show record";
      show.setAttribute("aria-label", "Show the TXT record of " + domain.domain);
      show.addEventListener("click", () => { showRecord(domain); $("verify").focus(); });
      item.append(show);
    }
    list.append(item);
  }
}

async function addDomain(event) {
  event.preventDefault();
  const field = $("domain");
  const domain = field.value.trim();
  if (!domain) {
    say("Enter a domain, such as example.com.", "problem");
    field.setAttribute("aria-invalid", "true");
    field.focus();
    return;
  }
  field.removeAttribute("aria-invalid");
  const button = $("add-domain");
  busy(button, true);
  say("Preparing the record…");
  try {
    const claimed = await call("POST", "/v1/portal/domains", {domain});
    showRecord(claimed);
    await refresh();
    if (claimed.status === "verified") {
      say(claimed.domain + " is already verified.", "done");
    } else {
      say("Publish the TXT record for " + claimed.domain + " at your DNS provider, then press Verify.");
      $("verify").focus();
    }
  } catch (err) {
    if (err.code === "invalid_request") field.setAttribute("aria-invalid", "true");
    failed(err);
  } finally {
    busy(button, false);
  }
}

async function verify() {
  if (!current) return;
  const button = $("verify");
  busy(button, true);
  say("Looking up the TXT record of " + current + "…");
  try {
    const result = await call("POST", "/v1/portal/domains/verify", {domain: current});
    await refresh();
    say(result.message, result.verified ? "done" : "problem");
    if (result.verified) $("record").hidden = true;
  } catch (err) {
    failed(err);
  } finally {
    busy(button, false);
  }
}

// --- SCIM ---------------------------------------------------------------------------------------

function fact(list, term, value) {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  dd.textContent = value;
  list.append(dt, dd);
}

function renderScim(scim) {
  const facts = $("scim-status");
  facts.replaceChildren();
  fact(facts, "SCIM base URL", scim.base_url);
  fact(facts, "Token", scim.token_minted_at ? "generated " + when(scim.token_minted_at) : "none yet");
  if (scim.users !== null) fact(facts, "Users", String(scim.users));
  if (scim.groups !== null) fact(facts, "Groups", String(scim.groups));
  fact(facts, "Last change by the directory", scim.last_synced_at ? when(scim.last_synced_at) : "none yet");
  const changes = scim.recent_changes;
  const body = $("changes-body");
  body.replaceChildren();
  for (const change of changes) {
    const row = document.createElement("tr");
    const resource = (change.resource_type === "scim_group" ? "Group " : "User ") + (change.resource_id || "");
    for (const text of [when(change.at), change.change || change.action, resource]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    body.append(row);
  }
  $("changes").hidden = changes.length === 0;
  $("no-changes").hidden = changes.length > 0;
  $("mint").textContent = scim.token_minted_at ? "Generate a new SCIM token" : "Generate a SCIM token";
}

async function mint() {
  const button = $("mint");
  busy(button, true);
  say("Generating the token…");
  try {
    const minted = await call("POST", "/v1/portal/scim/token", {});
    $("scim-base-url").value = minted.base_url;
    $("scim-token").value = minted.token;
    $("scim-secret").hidden = false;
    await refresh();
    say("Token generated. Copy it now: it is shown this once.", "done");
    $("scim-token").focus();
    $("scim-token").select();
  } catch (err) {
    failed(err);
  } finally {
    busy(button, false);
  }
}

// --- the page -----------------------------------------------------------------------------------

function render() {
  $("title").textContent = "Set up " + state.organization.name;
  if (state.intent === "domain_verification") {
    $("intro").textContent = "Prove that your organization controls its domains by publishing a DNS record.";
    $("domain-section").hidden = false;
    renderDomains(state.domains || []);
  } else {
    $("intro").textContent = "Connect your organization's directory so its users and groups are kept in sync.";
    $("scim-section").hidden = false;
    if (state.scim) renderScim(state.scim);
  }
}

async function refresh() {
  state = await call("GET", "/v1/portal/state");
  render();
}

async function start() {
  // The setup token is used up: keep it out of the address bar, the history and any bookmark.
  // A reload of /portal resumes this session from its cookie.
  if (new URLSearchParams(window.location.search).has("token")) {
    history.replaceState(null, "", window.location.pathname);
  }
  $("domain-form").addEventListener("submit", addDomain);
  $("verify").addEventListener("click", verify);
  $("mint").addEventListener("click", mint);
  try {
    await refresh();
    (state.intent === "domain_verification" ? $("domain") : $("mint")).focus();
  } catch (err) {
    failed(err);
  }
  document.documentElement.dataset.ready = String(Math.round(performance.now()));
}

start();
