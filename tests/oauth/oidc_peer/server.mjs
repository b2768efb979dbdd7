// The OAuth tests' OpenID provider: oidc-provider (the release and why: tests/oauth/peers.py,
// OIDC_PROVIDER_VERSION) with the configuration the tests pass in PEER_CONFIG, an adapter that
// keeps everything for the life of the process, POST /_accounts to register an account and its
// claims, and /interaction/{uid}?account=<id>, which signs that account in and grants the
// scopes asked for, with no page. Prints "ready" once it listens.
import http from 'node:http';
import Provider from 'oidc-provider';

const cfg = JSON.parse(process.env.PEER_CONFIG);
const accounts = new Map();

// oidc-provider's own memory adapter is an LRU of 1,000 entries: a bench that prepares
// thousands of authorizations would lose codes before redeeming them. This one keeps all
// (the process lives as long as a test run).
const store = new Map();
const byGrant = new Map();
class Adapter {
  constructor(name) { this.name = name; }
  key(id) { return `${this.name}:${id}`; }
  async upsert(id, payload) {
    store.set(this.key(id), payload);
    if (payload.uid) store.set(`${this.name}:uid:${payload.uid}`, id);
    if (payload.userCode) store.set(`${this.name}:userCode:${payload.userCode}`, id);
    if (payload.grantId) {
      if (!byGrant.has(payload.grantId)) byGrant.set(payload.grantId, new Set());
      byGrant.get(payload.grantId).add(this.key(id));
    }
  }
  async find(id) { return store.get(this.key(id)); }
  async findByUid(uid) { const id = store.get(`${this.name}:uid:${uid}`); return id && this.find(id); }
  async findByUserCode(code) { const id = store.get(`${this.name}:userCode:${code}`); return id && this.find(id); }
  async consume(id) { const p = store.get(this.key(id)); if (p) p.consumed = Math.floor(Date.now() / 1000); }
  async destroy(id) { store.delete(this.key(id)); }
  async revokeByGrantId(grantId) {
    for (const key of byGrant.get(grantId) || []) store.delete(key);
    byGrant.delete(grantId);
  }
}

const provider = new Provider(cfg.issuer, {
  adapter: Adapter,
  clients: cfg.clients,
  jwks: cfg.jwks,
  cookies: { keys: [cfg.cookieKey] },
  pkce: { required: () => true },
  ttl: { AuthorizationCode: 600 },
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  findAccount: async (ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, ...(accounts.get(id) || {}) }),
  }),
});
const callback = provider.callback();

async function body(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString() || '{}');
}

http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, cfg.issuer);
    if (req.method === 'POST' && url.pathname === '/_accounts') {
      const account = await body(req);
      accounts.set(account.id, account.claims || {});
      res.writeHead(204).end();
      return;
    }
    if (url.pathname.startsWith('/interaction/')) {
      const details = await provider.interactionDetails(req, res);
      const accountId = url.searchParams.get('account');
      const grant = new provider.Grant({ accountId, clientId: details.params.client_id });
      grant.addOIDCScope(details.params.scope);
      const grantId = await grant.save();
      await provider.interactionFinished(req, res, { login: { accountId }, consent: { grantId } },
                                         { mergeWithLastSubmission: false });
      return;
    }
    callback(req, res);
  } catch (err) {
    res.writeHead(500, { 'content-type': 'text/plain' }).end(String(err && err.stack));
  }
}).listen(cfg.port, '127.0.0.1', () => console.log('ready'));
