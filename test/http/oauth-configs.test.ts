// OAuth provider configurations (admin): create/list/get/update/delete, masking, default scopes,
// the device provider addressed by client_id, the redirect URL rules, the catalogue, credentials.
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { describe, expect, test } from "vitest";
import { BUN, createProject, createToken, KILN, ROOT, useCli, useKiln } from "../support/kiln";

const k = useKiln();
const cli = useCli(k, { passToken: true });

const secret = () => `GOCSPX-${randomBytes(18).toString("hex")}`;
const configs = (p: string) => `/projects/${p}/oauth/configs`;
const callback = (provider: string) => `http://localhost:7070/auth/oauth/${provider}/callback`;

async function configure(p: string, provider: string, extra: Record<string, unknown> = {}) {
  const body = { provider, client_id: `${provider}-client`, client_secret: secret(), redirect_url: callback(provider), ...extra };
  const r = await k.api("POST", configs(p), { body });
  return { r, body };
}

describe("provider configurations", () => {
  test("create answers 201 with the secret masked (first 4 … last 4) and each provider's default scopes", async () => {
    const p = await createProject(k);
    const expected: Record<string, string[]> = {
      google: ["openid", "email", "profile"],
      microsoft: ["openid", "email", "profile"],
      github: ["read:user", "user:email"],
      apple: ["email", "name"],
    };
    for (const [provider, scopes] of Object.entries(expected)) {
      const { r, body } = await configure(p.id, provider);
      expect(r.status).toBe(201);
      expect(r.body).toMatchObject({ provider, client_id: body.client_id, enabled: true, redirect_url: body.redirect_url, scopes });
      expect(r.body.client_secret).toBe(`${body.client_secret.slice(0, 4)}…${body.client_secret.slice(-4)}`);
      expect(r.text).not.toContain(body.client_secret);
      expect(r.body.id).toEqual(expect.any(String));
      expect(Date.parse(r.body.created_at)).not.toBeNaN();
    }
    // Scopes given replace the defaults.
    const q = await createProject(k);
    const own = await configure(q.id, "google", { scopes: ["openid", "email"] });
    expect(own.r.body.scopes).toEqual(["openid", "email"]);
  });

  test("a second config of the same provider is 409; client_secret and redirect_url are required but for device (400)", async () => {
    const p = await createProject(k);
    expect((await configure(p.id, "github")).r.status).toBe(201);
    const again = await configure(p.id, "github", { client_id: "another" });
    expect(again.r.status).toBe(409);
    expect(again.r.body.error).toBe("provider github is already configured for this project");

    const noSecret = await k.api("POST", configs(p.id), { body: { provider: "google", client_id: "x", redirect_url: callback("google") } });
    expect(noSecret.status).toBe(400);
    expect(noSecret.body.error).toBe("client_secret is required for provider google");
    const noRedirect = await k.api("POST", configs(p.id), { body: { provider: "google", client_id: "x", client_secret: secret() } });
    expect(noRedirect.status).toBe(400);
    expect(noRedirect.body.error).toBe("redirect_url is required for provider google");
    const noClient = await k.api("POST", configs(p.id), { body: { provider: "google", client_secret: secret(), redirect_url: callback("google") } });
    expect(noClient.status).toBe(400);
    expect(noClient.body.error).toContain("'client_id'");
    const unknown = await k.api("POST", configs(p.id), { body: { provider: "myspace", client_id: "x" } });
    expect(unknown.status).toBe(400);
    expect(unknown.body.error).toContain("provider must be one of google, github, microsoft, apple, device");

    const device = await k.api("POST", configs(p.id), { body: { provider: "device", client_id: "tv-app" } });
    expect(device.status).toBe(201);
    expect(device.body).toMatchObject({ provider: "device", client_id: "tv-app", enabled: true, redirect_url: null, scopes: [] });
    expect(device.body.client_secret).toBeUndefined();
  });

  test("redirect URL rules: http or https only, no '@', no wildcards, never javascript:, plain http only for localhost; each 400 names its rule", async () => {
    const p = await createProject(k);
    const cases: Array<[string, string]> = [
      ["ftp://example.com/cb", "must use http or https"],
      ["javascript:alert(1)", "must use http or https"],
      ["https://user@example.com/cb", "must not contain '@'"],
      ["https://*.example.com/cb", "must not contain wildcards"],
      ["http://example.com/cb", "may use plain http only for localhost addresses"],
      ["/auth/oauth/google/callback", "is not an absolute URL"],
    ];
    for (const [url, rule] of cases) {
      const r = await k.api("POST", configs(p.id), { body: { provider: "google", client_id: "x", client_secret: secret(), redirect_url: url } });
      expect(r.status, url).toBe(400);
      expect(r.body.error).toBe(`invalid request: body field 'redirect_url': '${url}' ${rule}`);
    }
    // Updates follow the same rules.
    await configure(p.id, "google", { redirect_url: "http://localhost:3000/auth/oauth/google/callback" });
    const put = await k.api("PUT", `${configs(p.id)}/google`, { body: { redirect_url: "javascript:alert(1)" } });
    expect(put.status).toBe(400);
    expect(put.body.error).toContain("must use http or https");
    expect((await configure((await createProject(k)).id, "google", { redirect_url: "https://app.example.com/auth/callback?x=1" })).r.status).toBe(201);
  });

  test("list carries no secrets; get masks the secret; PUT changes only what was sent (200); DELETE is 204, then 404", async () => {
    const p = await createProject(k);
    const g = await configure(p.id, "google");
    const gh = await configure(p.id, "github");
    const list = await k.api("GET", configs(p.id));
    expect(list.status).toBe(200);
    expect(list.body.configs.map((c: any) => c.provider)).toEqual(["google", "github"]);
    for (const c of list.body.configs) expect(c).not.toHaveProperty("client_secret");
    expect(list.text).not.toContain(g.body.client_secret);
    expect(list.text).not.toContain(gh.body.client_secret);
    expect(list.text).not.toContain(g.body.client_secret.slice(-4) + '"');

    const one = await k.api("GET", `${configs(p.id)}/google`);
    expect(one.status).toBe(200);
    expect(one.body.client_secret).toBe(`${g.body.client_secret.slice(0, 4)}…${g.body.client_secret.slice(-4)}`);

    const put = await k.api("PUT", `${configs(p.id)}/google`, { body: { enabled: false } });
    expect(put.status).toBe(200);
    expect(put.body).toMatchObject({ enabled: false, client_id: g.body.client_id, redirect_url: g.body.redirect_url, scopes: ["openid", "email", "profile"] });
    expect(put.body.client_secret).toBe(one.body.client_secret);
    const newSecret = secret();
    const put2 = await k.api("PUT", `${configs(p.id)}/google`, { body: { client_secret: newSecret, scopes: ["openid"] } });
    expect(put2.status).toBe(200);
    expect(put2.body).toMatchObject({ enabled: false, scopes: ["openid"], client_secret: `${newSecret.slice(0, 4)}…${newSecret.slice(-4)}` });
    expect(Date.parse(put2.body.updated_at)).toBeGreaterThanOrEqual(Date.parse(put.body.updated_at));

    expect((await k.api("DELETE", `${configs(p.id)}/google`)).status).toBe(204);
    const gone = await k.api("GET", `${configs(p.id)}/google`);
    expect(gone.status).toBe(404);
    expect(gone.body.error).toBe("provider google is not configured for this project");
    expect((await k.api("DELETE", `${configs(p.id)}/google`)).status).toBe(404);
    expect((await k.api("PUT", `${configs(p.id)}/apple`, { body: { enabled: false } })).status).toBe(404);
    // Another project's configs are not this one's.
    const other = await createProject(k);
    expect((await k.api("GET", configs(other.id))).body.configs).toEqual([]);
  });

  test("the device provider: addressed by client_id for update and delete; only client_id and enabled change", async () => {
    const p = await createProject(k);
    expect((await k.api("POST", configs(p.id), { body: { provider: "device", client_id: "tv" } })).status).toBe(201);
    expect((await k.api("POST", configs(p.id), { body: { provider: "device", client_id: "cli" } })).status).toBe(201);
    const dup = await k.api("POST", configs(p.id), { body: { provider: "device", client_id: "tv" } });
    expect(dup.status).toBe(409);

    const noId = await k.api("PUT", `${configs(p.id)}/device`, { body: { enabled: false } });
    expect(noId.status).toBe(400);
    expect(noId.body.error).toContain("client_id");
    const secretField = await k.api("PUT", `${configs(p.id)}/device?client_id=tv`, { body: { client_secret: secret() } });
    expect(secretField.status).toBe(400);
    expect(secretField.body.error).toBe("a device client takes only client_id and enabled; not client_secret");
    const off = await k.api("PUT", `${configs(p.id)}/device?client_id=tv`, { body: { enabled: false, client_id: "tv2" } });
    expect(off.status).toBe(200);
    expect(off.body).toMatchObject({ provider: "device", client_id: "tv2", enabled: false });
    expect((await k.api("GET", `${configs(p.id)}/device?client_id=cli`)).body.enabled).toBe(true);
    expect((await k.api("GET", `${configs(p.id)}/device?client_id=tv`)).status).toBe(404);
    expect((await k.api("DELETE", `${configs(p.id)}/device`)).status).toBe(400);
    expect((await k.api("DELETE", `${configs(p.id)}/device?client_id=tv2`)).status).toBe(204);
    expect((await k.api("GET", configs(p.id))).body.configs.map((c: any) => c.client_id)).toEqual(["cli"]);
    // With one device client left, a get needs no client_id.
    expect((await k.api("GET", `${configs(p.id)}/device`)).body.client_id).toBe("cli");
  });

  test("GET /oauth/providers lists the catalogue with default scopes", async () => {
    const p = await createProject(k);
    const r = await k.api("GET", `/projects/${p.id}/oauth/providers`);
    expect(r.status).toBe(200);
    expect(r.body.providers.map((x: any) => x.id)).toEqual(["google", "github", "microsoft", "apple", "device"]);
    expect(r.body.providers.find((x: any) => x.id === "github")).toEqual({ id: "github", name: "GitHub", default_scopes: ["read:user", "user:email"] });
    expect(r.body.providers.find((x: any) => x.id === "apple").default_scopes).toEqual(["email", "name"]);
  });

  test("credentials: platform or project token; read-only tokens read, full scope writes; application keys and no token refused", async () => {
    const p = await createProject(k);
    const full = (await createToken(k, p.id, { name: "full", scope: "full" })).token;
    const ro = (await createToken(k, p.id, { name: "ro", scope: "read_only" })).token;
    const anon = (await k.api("GET", `/projects/${p.id}/anon-keys`)).body.data[0].key;
    const body = { provider: "google", client_id: "x", client_secret: secret(), redirect_url: callback("google") };
    expect((await k.api("POST", configs(p.id), { token: ro, body })).status).toBe(403);
    expect((await k.api("POST", configs(p.id), { token: anon, body })).status).toBe(403);
    expect((await k.api("POST", configs(p.id), { token: null, body })).status).toBe(401);
    expect((await k.api("POST", configs(p.id), { token: full, body })).status).toBe(201);
    expect((await k.api("GET", configs(p.id), { token: ro })).status).toBe(200);
    expect((await k.api("GET", `${configs(p.id)}/google`, { token: ro })).status).toBe(200);
    expect((await k.api("DELETE", `${configs(p.id)}/google`, { token: ro })).status).toBe(403);
    const other = await createProject(k);
    expect((await k.api("GET", configs(other.id), { token: full })).status).toBe(403);
  });
});

describe("kiln auth oauth", () => {
  test("configs create|list|get|update|delete and providers; the secret from standard input, masked in every output", async () => {
    const p = await createProject(k);
    const s = secret();
    // --client-secret - reads the secret from standard input (kept out of shell history and ps).
    const created = spawnSync(
      BUN,
      [KILN, "--url", k.url, "--token", k.token, "--json", "auth", "oauth", "configs", "create", "google", "--project", p.id, "--client-id", "web-client", "--client-secret", "-", "--redirect-url", callback("google")],
      { cwd: ROOT, input: `${s}\n`, encoding: "utf8", env: { ...process.env, KILN_CONFIG_DIR: cli.configDir } },
    );
    expect(created.status, created.stderr).toBe(0);
    const c = JSON.parse(created.stdout);
    expect(c).toMatchObject({ provider: "google", client_id: "web-client", scopes: ["openid", "email", "profile"], client_secret: `${s.slice(0, 4)}…${s.slice(-4)}` });
    expect(cli.json("auth", "oauth", "configs", "create", "device", "--project", p.id, "--client-id", "tv")).toMatchObject({ provider: "device", client_id: "tv" });

    const list = cli.run("auth", "oauth", "configs", "list", "--project", p.id);
    expect(list.code).toBe(0);
    expect(list.out).toMatch(/PROVIDER\s+CLIENT_ID/);
    expect(list.out).toContain("web-client");
    expect(list.out).not.toContain(s);
    expect(cli.json("auth", "oauth", "configs", "get", "google", "--project", p.id).client_secret).toBe(c.client_secret);
    const human = cli.run("auth", "oauth", "configs", "get", "google", "--project", p.id);
    expect(human.out).not.toContain(s);

    const upd = cli.json("auth", "oauth", "configs", "update", "google", "--project", p.id, "--enabled", "false", "--scopes", "openid,email");
    expect(upd).toMatchObject({ enabled: false, scopes: ["openid", "email"], client_id: "web-client" });
    expect(cli.json("auth", "oauth", "configs", "update", "device", "--project", p.id, "--device-client", "tv", "--client-id", "tv2")).toMatchObject({ client_id: "tv2" });
    const bad = cli.run("--json", "auth", "oauth", "configs", "update", "device", "--project", p.id, "--device-client", "tv2", "--scopes", "x");
    expect(bad.code).not.toBe(0);
    const e = JSON.parse(bad.err.trim());
    expect(e.status).toBe(400);
    expect(e.error).toContain("a device client takes only client_id and enabled; not scopes");

    expect(cli.json("auth", "oauth", "configs", "delete", "device", "--project", p.id, "--device-client", "tv2")).toEqual({ deleted: "device", client_id: "tv2" });
    expect(cli.json("auth", "oauth", "configs", "delete", "google", "--project", p.id)).toEqual({ deleted: "google" });
    expect(cli.json("auth", "oauth", "configs", "list", "--project", p.id)).toEqual({ configs: [] });

    const providers = cli.json("auth", "oauth", "providers", "--project", p.id);
    expect(providers.providers.find((x: any) => x.id === "microsoft").default_scopes).toEqual(["openid", "email", "profile"]);
    expect(cli.run("auth", "oauth", "providers", "--project", p.id).out).toMatch(/github\s+GitHub\s+read:user user:email/);
  });
});
