"""The device approval page (``GET /device``): server-rendered, one small script, no framework.

Accessible: every field has a label, the status is a polite live region, the focus goes from
the code to the key to Approve then Deny, and colours keep a contrast above 7:1. The script
fills the code from the ``user_code`` query parameter (the ``verification_uri_complete`` link),
never the key: the operator pastes it, and it leaves the page only in the approval call's
``Authorization`` header."""

from __future__ import annotations

from typing import Final

APPROVAL_PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Approve a device</title>
<style nonce="{nonce}">
body {{ font-family: system-ui, sans-serif; max-width: 32rem; margin: 3rem auto; padding: 0 1rem;
        color: #111; background: #fff; line-height: 1.5; }}
label {{ display: block; font-weight: 600; margin-top: 1rem; }}
input {{ font: inherit; width: 100%; box-sizing: border-box; padding: .5rem; border: 1px solid #444;
         border-radius: 4px; }}
#user_code {{ font-family: ui-monospace, monospace; letter-spacing: .15em; text-transform: uppercase; }}
.hint {{ color: #333; font-size: .9rem; margin: .25rem 0 0; }}
.actions {{ margin-top: 1.5rem; display: flex; gap: .75rem; }}
button {{ font: inherit; padding: .55rem 1.3rem; border-radius: 4px; cursor: pointer; border: 2px solid #0b3d91; }}
#approve {{ background: #0b3d91; color: #fff; }}
#deny {{ background: #fff; color: #0b3d91; }}
button:focus-visible, input:focus-visible {{ outline: 3px solid #b35c00; outline-offset: 2px; }}
#status {{ margin-top: 1.25rem; font-weight: 600; }}
</style></head>
<body><main>
<h1>Approve a device</h1>
<p>A command-line tool asks to act on your project. Approve it only if you started it
(<code>authio login</code>) and the code below is the one it shows.</p>
<form id="approval" novalidate>
<label for="user_code">Code shown by the tool</label>
<input id="user_code" name="user_code" autocomplete="off" autocapitalize="characters"
       spellcheck="false" required pattern="[A-Za-z]{{4}}-?[A-Za-z]{{4}}" aria-describedby="code_hint">
<p class="hint" id="code_hint">Eight letters, such as WDJB-MJHT.</p>
<label for="api_key">Your project's full-access API key</label>
<input id="api_key" name="api_key" type="password" autocomplete="off" spellcheck="false" required
       aria-describedby="key_hint">
<p class="hint" id="key_hint">It proves you may approve; it is sent once with your answer and
never stored by this page.</p>
<div class="actions">
<button id="approve" type="submit">Approve</button>
<button id="deny" type="button">Deny</button>
</div>
</form>
<p id="status" role="status" aria-live="polite"></p>
</main>
<script nonce="{nonce}">
const code = document.getElementById("user_code"), key = document.getElementById("api_key");
const status = document.getElementById("status");
code.value = new URLSearchParams(window.location.search).get("user_code") || "";
(code.value ? key : code).focus();
async function decide(decision) {{
  if (!code.value.trim() || !key.value.trim()) {{
    status.textContent = "Enter the code and your API key.";
    (code.value.trim() ? key : code).focus();
    return;
  }}
  for (const b of document.querySelectorAll("button")) b.disabled = true;
  status.textContent = decision === "approve" ? "Approving…" : "Denying…";
  try {{
    const response = await fetch("/v1/cli/device/approve", {{
      method: "POST",
      headers: {{"Content-Type": "application/json", "Authorization": "Bearer " + key.value.trim()}},
      body: JSON.stringify({{user_code: code.value.trim(), decision: decision}}),
    }});
    const body = await response.json();
    if (response.ok) {{
      key.value = "";
      document.getElementById("approval").hidden = true;
      status.textContent = body.status === "approved"
        ? "Approved. Return to your terminal: the tool is signed in to project " + body.project_id + "."
        : "Denied. The tool was refused.";
      return;
    }}
    status.textContent = body.error ? body.error.message : "The request was refused.";
  }} catch (err) {{
    status.textContent = "Could not reach the server; try again.";
  }}
  for (const b of document.querySelectorAll("button")) b.disabled = false;
}}
document.getElementById("approval").addEventListener("submit", (e) => {{ e.preventDefault(); decide("approve"); }});
document.getElementById("deny").addEventListener("click", () => decide("deny"));
</script></body></html>
"""
