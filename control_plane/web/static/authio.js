// authio's browser module: sign-in from a page on the application's own origin.
//
//   import { createClient } from "https://auth.example.com/v1/browser/authio.js";
//   const authio = createClient({ projectId: "proj_..." });
//   await authio.passkey.signIn();            // a passkey (usernameless)
//   const { user } = await authio.me();       // GET /v1/sessions/me
//
// Served by the service at /v1/browser/authio.js (docs/browser.md). The page's origin must be
// one the project allows (its WebAuthn `origins` and `cors_origins`, PATCH /v1/projects/me):
// the service answers CORS for those only. Every call names the project (`project_id` query
// parameter) and is sent with `credentials: "include"`; the access token of the last sign-in or
// refresh is kept in memory and sent as `Authorization: Bearer`, so the calls work whether or
// not the browser sends the `service_session` cookie across sites. The WebAuthn ceremonies go
// through @simplewebauthn/browser (MIT), vendored beside this file.
import "./simplewebauthn-browser.umd.min.js";

const webauthn = globalThis.SimpleWebAuthnBrowser;

/** An error answer of the service: `status`, and the envelope's `code`, `details`, `requestId`. */
export class AuthioError extends Error {
  constructor(status, body, requestId) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.name = "AuthioError";
    this.status = status;
    this.code = error.code || null;
    this.details = error.details || {};
    this.requestId = requestId || (body && body.request_id) || null;
  }
}

/** Whether this browser can run the passkey ceremonies. */
export function browserSupportsPasskeys() {
  return webauthn.browserSupportsWebAuthn();
}

/**
 * A client of one project.
 *
 * options.projectId    the project (required: it names the project on every call)
 * options.baseUrl      the service (default: where this module was loaded from)
 * options.onSession    called with the Grant after every sign-in and refresh, and with null
 *                      after sign-out (to keep the refresh token where the application likes)
 * options.refreshToken a refresh token kept from an earlier page (optional)
 */
export function createClient(options) {
  if (!options || !options.projectId) throw new TypeError("createClient: projectId is required");
  const baseUrl = (options.baseUrl || new URL(".", import.meta.url).origin).replace(/\/+$/, "");
  const projectId = options.projectId;
  const onSession = options.onSession || (() => {});
  let accessToken = null;
  let refreshToken = options.refreshToken || null;

  async function call(method, path, body) {
    const url = new URL(baseUrl + path);
    url.searchParams.set("project_id", projectId);
    const headers = {};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (accessToken) headers["Authorization"] = `Bearer ${accessToken}`;
    const response = await fetch(url, {
      method, headers, credentials: "include",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const requestId = response.headers.get("X-Request-Id");
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (!response.ok) throw new AuthioError(response.status, data, requestId);
    return data;
  }

  function granted(grant) {
    accessToken = grant.access_token;
    if (grant.refresh_token) refreshToken = grant.refresh_token;
    onSession(grant);
    return grant;
  }

  return {
    projectId,
    baseUrl,
    /** The access token of the current session (null when signed out). */
    get accessToken() { return accessToken; },
    /** The refresh token of the current session (null when signed out). */
    get refreshToken() { return refreshToken; },

    passkey: {
      /** Add a passkey to the signed-in user: POST /v1/auth/passkey/register/options, the
       *  browser's ceremony, POST /v1/auth/passkey/register/verify. Returns the passkey. */
      async register({ name } = {}) {
        const optionsJSON = await call("POST", "/v1/auth/passkey/register/options",
                                       name ? { name } : {});
        const credential = await webauthn.startRegistration({ optionsJSON });
        return call("POST", "/v1/auth/passkey/register/verify", credential);
      },
      /** Sign in with a passkey (usernameless without `email`; `autofill`: passkey autofill on
       *  an input with autocomplete="username webauthn"). Returns the Grant. */
      async signIn({ email, autofill = false } = {}) {
        const optionsJSON = await call("POST", "/v1/auth/passkey/login/options",
                                       email ? { email } : {});
        const credential = await webauthn.startAuthentication({
          optionsJSON, useBrowserAutofill: autofill });
        return granted(await call("POST", "/v1/auth/passkey/login/verify", credential));
      },
    },

    magicLink: {
      /** Send a sign-in link to an email address or E.164 phone number. `redirectUrl`: a page
       *  of yours (on an origin the project allows) the link lands on, with `#token=...`;
       *  call `verify()` there. Without it the link lands on authio's own page. */
      send(destination, { redirectUrl } = {}) {
        return call("POST", "/v1/auth/magic-link/send",
                    redirectUrl ? { destination, redirect_url: redirectUrl } : { destination });
      },
      /** Redeem a link's token (default: the `token` of this page's URL fragment, which is
       *  then taken out of the address bar and history). Returns the Grant. */
      async verify(token) {
        const value = token || new URLSearchParams(location.hash.slice(1)).get("token");
        if (!value) throw new TypeError("magicLink.verify: no token given nor in the fragment");
        if (!token) history.replaceState(history.state, "", location.pathname + location.search);
        return granted(await call("POST", "/v1/auth/magic-link/verify", { token: value }));
      },
    },

    /** A new access token (and refresh token) for the refresh token held. Returns the Grant. */
    async refresh() {
      if (!refreshToken) throw new TypeError("refresh: no refresh token held");
      return granted(await call("POST", "/v1/sessions/refresh", { refresh_token: refreshToken }));
    },

    /** Sign out: the session is revoked everywhere. */
    async signOut() {
      try {
        return await call("POST", "/v1/sessions/revoke");
      } finally {
        accessToken = null;
        refreshToken = null;
        onSession(null);
      }
    },

    /** The current session and its user (GET /v1/sessions/me). */
    me() {
      return call("GET", "/v1/sessions/me");
    },
  };
}
