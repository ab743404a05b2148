// A real, certified OpenID Provider (npm oidc-provider) for the tests: `node oidc_provider.mjs CONFIG.json`.
// CONFIG: {"issuer", "port", "clients": [...], "users": {"<login>": {claims}}, "jwks": {"keys": [...]}}.
// Its dev login page takes any user named in "users" (the password is not checked); the consent page follows.
// Prints "ready" on stdout once it listens. Loopback only.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.env.OIDC_PROVIDER_DIR + "/");
const { default: Provider } = await import(require.resolve("oidc-provider"));

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const users = config.users;

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: config.jwks,
  cookies: { keys: ["turnout-test-cookie-key"] },
  pkce: { required: () => true },
  claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name"], groups: ["groups"] },
  scopes: ["openid", "email", "profile", "groups"],
  conformIdTokenClaims: false, // the claims of the granted scopes in the ID token, as Keycloak and Entra ID put groups
  features: { devInteractions: { enabled: true } },
  ttl: { IdToken: config.id_token_ttl || 600, AuthorizationCode: 120, Session: 600, Interaction: 600, Grant: 600, AccessToken: 600 },
  async findAccount(ctx, id) {
    if (!Object.hasOwn(users, id)) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...users[id] }; } };
  },
  renderError(ctx, out) {
    ctx.type = "html";
    ctx.body = `<!doctype html><title>error</title><pre id="error">${JSON.stringify(out)}</pre>`;
  },
});
provider.proxy = false;
const server = provider.listen(config.port, "127.0.0.1", () => {
  process.stdout.write("ready\n");
});
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => server.close(() => process.exit(0)));
