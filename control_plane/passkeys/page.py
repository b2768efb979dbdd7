"""The passkey page (``GET /v1/auth/passkey/page``): both ceremonies in a browser, calling the
passkey endpoints with ``navigator.credentials``. WebAuthn's JSON helpers
(``PublicKeyCredential.parseCreationOptionsFromJSON``, ``parseRequestOptionsFromJSON``,
``toJSON``) are used where the browser has them, base64url conversion by hand otherwise."""

from __future__ import annotations

from typing import Final

PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Passkeys</title>
<style nonce="{nonce}">
body {{ font-family: system-ui, sans-serif; max-width: 30rem; margin: 4rem auto; padding: 0 1rem; }}
button, input {{ font-size: 1.05rem; padding: .5rem .8rem; margin: .3rem 0; }}
section {{ margin: 1.5rem 0; }}
</style></head>
<body><main>
<h1>Passkeys</h1>
<p id="status" role="status" aria-live="polite"></p>
<section>
<h2>Sign in</h2>
<label>Email <input id="username" name="username" autocomplete="username webauthn"></label><br>
<button id="login" type="button">Sign in with a passkey</button>
</section>
<section>
<h2>Add a passkey</h2>
<p>For the signed-in user.</p>
<label>Name <input id="name" maxlength="100" placeholder="Passkey"></label><br>
<button id="register" type="button">Add a passkey</button>
</section>
</main>
<script nonce="{nonce}">
"use strict";
const project = new URLSearchParams(window.location.search).get("project_id") || "";
const query = project ? "?" + new URLSearchParams({{project_id: project}}) : "";
const status = document.getElementById("status");
const b64 = {{
  decode(s) {{
    const t = s.replace(/-/g, "+").replace(/_/g, "/");
    return Uint8Array.from(atob(t + "===".slice((t.length + 3) % 4)), c => c.charCodeAt(0)).buffer;
  }},
  encode(buf) {{
    let s = "";
    for (const b of new Uint8Array(buf)) s += String.fromCharCode(b);
    return btoa(s).replace(/\\+/g, "-").replace(/\\//g, "_").replace(/=+$/, "");
  }},
}};
function creationOptions(o) {{
  if (PublicKeyCredential.parseCreationOptionsFromJSON) return PublicKeyCredential.parseCreationOptionsFromJSON(o);
  return {{...o, challenge: b64.decode(o.challenge), user: {{...o.user, id: b64.decode(o.user.id)}},
    excludeCredentials: (o.excludeCredentials || []).map(c => ({{...c, id: b64.decode(c.id)}}))}};
}}
function requestOptions(o) {{
  if (PublicKeyCredential.parseRequestOptionsFromJSON) return PublicKeyCredential.parseRequestOptionsFromJSON(o);
  return {{...o, challenge: b64.decode(o.challenge),
    allowCredentials: (o.allowCredentials || []).map(c => ({{...c, id: b64.decode(c.id)}}))}};
}}
function credentialJSON(c) {{
  if (typeof c.toJSON === "function") return c.toJSON();
  const r = c.response, out = {{id: c.id, rawId: b64.encode(c.rawId), type: c.type,
    authenticatorAttachment: c.authenticatorAttachment || null,
    clientExtensionResults: c.getClientExtensionResults(), response: {{clientDataJSON: b64.encode(r.clientDataJSON)}}}};
  if (r.attestationObject) {{
    out.response.attestationObject = b64.encode(r.attestationObject);
    out.response.transports = r.getTransports ? r.getTransports() : [];
  }} else {{
    out.response.authenticatorData = b64.encode(r.authenticatorData);
    out.response.signature = b64.encode(r.signature);
    if (r.userHandle) out.response.userHandle = b64.encode(r.userHandle);
  }}
  return out;
}}
async function post(path, body) {{
  const response = await fetch(path + query, {{method: "POST", credentials: "same-origin",
    headers: {{"Content-Type": "application/json"}}, body: JSON.stringify(body)}});
  const data = await response.json();
  if (!response.ok) throw new Error(data.error.code + ": " + data.error.message);
  return data;
}}
let pending = null;  // the conditional (autofill) request, aborted before a button's ceremony
async function login(mediation) {{
  if (pending) pending.abort();
  const controller = new AbortController();
  if (mediation === "conditional") pending = controller;
  const email = document.getElementById("username").value.trim();
  const options = await post("/v1/auth/passkey/login/options",
                             mediation === "conditional" || !email ? {{}} : {{email}});
  const credential = await navigator.credentials.get({{publicKey: requestOptions(options),
                                                        mediation, signal: controller.signal}});
  const grant = await post("/v1/auth/passkey/login/verify", credentialJSON(credential));
  status.textContent = "Signed in as " + (grant.user.email || grant.user.id) + ".";
  status.dataset.userId = grant.user.id;
  status.dataset.sessionId = grant.session.id;
}}
document.getElementById("login").addEventListener("click", () => {{
  status.textContent = "Signing in…";
  login("optional").catch(err => {{ status.textContent = "Sign-in failed: " + err.message; }});
}});
document.getElementById("register").addEventListener("click", async () => {{
  if (pending) {{ pending.abort(); pending = null; }}
  status.textContent = "Adding a passkey…";
  try {{
    const name = document.getElementById("name").value.trim();
    const options = await post("/v1/auth/passkey/register/options", name ? {{name}} : {{}});
    const credential = await navigator.credentials.create({{publicKey: creationOptions(options)}});
    const passkey = await post("/v1/auth/passkey/register/verify", credentialJSON(credential));
    status.textContent = "Added the passkey " + passkey.name + ".";
    status.dataset.passkeyId = passkey.id;
  }} catch (err) {{
    status.textContent = "Could not add a passkey: " + err.message;
  }}
}});
if (window.PublicKeyCredential && PublicKeyCredential.isConditionalMediationAvailable) {{
  PublicKeyCredential.isConditionalMediationAvailable().then(available => {{
    if (available) login("conditional").catch(() => {{}});  // aborted, or no passkey chosen
  }});
}}
</script></body></html>
"""
