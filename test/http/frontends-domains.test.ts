// Custom domains of frontends (spec part 2: Custom domain, its create body and results): uploaded
// certificates checked and served by SNI on Kiln's HTTPS port, beside the default site certificate
// from the data dir's local CA.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { connect } from "node:tls";
import forge from "node-forge";
import { beforeAll, describe, expect, it } from "vitest";
import { tgz } from "../support/functions";
import { createProject, eventually, removeDir, startKiln, useKiln, type TestKiln } from "../support/kiln";
import { freePort } from "../support/free-port";

const DAY = 86_400_000;

const tlsPort = await freePort();

interface Issued {
  cert: string;
  key: string;
  forgeCert: forge.pki.Certificate;
  forgeKey: forge.pki.rsa.PrivateKey;
}

/** A certificate for `names`, signed by `issuer` (self-signed without), valid from `from` to `to`. */
function issue(cn: string, names: string[], o: { issuer?: Issued; ca?: boolean; from?: number; to?: number } = {}): Issued {
  const keys = forge.pki.rsa.generateKeyPair(1024);
  const cert = forge.pki.createCertificate();
  cert.publicKey = keys.publicKey;
  cert.serialNumber = "0" + Math.floor(Math.random() * 1e9).toString(16);
  cert.validity.notBefore = new Date(o.from ?? Date.now() - DAY);
  cert.validity.notAfter = new Date(o.to ?? Date.now() + 30 * DAY);
  cert.setSubject([{ name: "commonName", value: cn }]);
  cert.setIssuer((o.issuer?.forgeCert.subject ?? cert.subject).attributes);
  cert.setExtensions(o.ca ? [{ name: "basicConstraints", cA: true }, { name: "keyUsage", keyCertSign: true }] : [{ name: "subjectAltName", altNames: names.map((value) => ({ type: 2, value })) }]);
  cert.sign(o.issuer?.forgeKey ?? keys.privateKey, forge.md.sha256.create());
  return { cert: forge.pki.certificateToPem(cert), key: forge.pki.privateKeyToPem(keys.privateKey), forgeCert: cert, forgeKey: keys.privateKey };
}

async function deployFrontend(k: TestKiln, projectId: string, name: string, token?: string) {
  const form = new FormData();
  form.set("name", name);
  form.set("archive", new Blob([new Uint8Array(tgz({ "index.html": `<h1>${name}</h1>` }))]), "site.tgz");
  const res = await fetch(`${k.url}/projects/${projectId}/frontends`, { method: "POST", headers: { authorization: `Bearer ${token ?? k.token}` }, body: form });
  const body = (await res.json()) as any;
  return (await eventually(() => k.api("GET", `/projects/${projectId}/frontends/${body.id}`, { token }), (r) => r.body.status === "active", 60_000)).body;
}

/** GET / over TLS to Kiln's HTTPS port with this SNI name: the certificate presented (checked against `ca` when given) and the body. */
function httpsGet(servername: string, ca?: string, port = tlsPort): Promise<{ cn: string; authorized: boolean; body: string }> {
  return new Promise((resolve, reject) => {
    const s = connect({ host: "127.0.0.1", port, servername, ca, rejectUnauthorized: false }, () => {
      const cn = String(s.getPeerCertificate().subject?.CN ?? "");
      const authorized = s.authorized;
      let data = "";
      s.on("data", (d) => (data += d));
      s.on("end", () => resolve({ cn, authorized, body: data }));
      s.write(`GET / HTTP/1.1\r\nHost: ${servername}\r\nConnection: close\r\n\r\n`);
    });
    s.on("error", reject);
  });
}

describe("custom domains", () => {
  const k = useKiln({ args: ["--frontends-tls-port", String(tlsPort)], env: { npm_config_registry: "http://127.0.0.1:9/" } });
  const ca = issue("Test Root", [], { ca: true });
  const good = issue("shop.example.test", ["shop.example.test"], { issuer: ca });
  let p: { id: string };
  let f: any;
  const path = () => `/projects/${p.id}/frontends/${f.id}/domain`;
  const body = (domain: string, tls: Record<string, unknown>) => ({ body: { domain, tls: { mode: "byoc", ...tls } } });

  beforeAll(async () => {
    p = await createProject(k);
    f = await deployFrontend(k, p.id, "shop");
    // The HTTPS listener starts once Kiln listens (its certificate is made first).
    await eventually(() => httpsGet("localhost").then(() => true, () => false), (up) => up, 30_000);
  });

  it("answers JSON null before a domain is configured, 404 for a missing frontend", async () => {
    const r = await k.api("GET", path());
    expect(r.status).toBe(200);
    expect(r.text).toBe("null");
    expect((await k.api("GET", `/projects/${p.id}/frontends/nope/domain`)).status).toBe(404);
    expect((await k.api("DELETE", path())).status).toBe(404);
  });

  it("serves the default site URL over HTTPS with a certificate from the data dir's local CA", async () => {
    const localCa = readFileSync(join(k.dataDir, "tls", "ca.pem"), "utf8");
    const host = new URL(f.site_url).hostname;
    const r = await httpsGet(host, localCa);
    expect(r.authorized).toBe(true);
    expect(r.body).toContain("<h1>shop</h1>");
  });

  it("proxies a WebSocket at the site URL over HTTPS (wss) to the app's server", async () => {
    // The stand-in app whose server takes WebSockets (test/fixtures/frontends/ws-app; no real next build).
    const archive = execFileSync("tar", ["-czf", "-", "-C", join(import.meta.dirname, "../fixtures/frontends/ws-app"), "."]);
    const form = new FormData();
    form.set("name", "live");
    form.set("framework", "nextjs");
    form.set("archive", new Blob([new Uint8Array(archive)]), "app.tgz");
    const res = await fetch(`${k.url}/projects/${p.id}/frontends`, { method: "POST", headers: { authorization: `Bearer ${k.token}` }, body: form });
    expect(res.status).toBe(201);
    const id = ((await res.json()) as any).id;
    const live = (await eventually(() => k.api("GET", `/projects/${p.id}/frontends/${id}`), (r) => r.body.status !== "provisioning", 120_000)).body;
    expect(live.status).toBe("active");
    const host = new URL(live.site_url).hostname;
    // To the loopback address (stock resolvers do not know *.localhost), the site's Host header routing it.
    const ws = new WebSocket(`wss://127.0.0.1:${tlsPort}/ws?over=tls`, { tls: { rejectUnauthorized: false }, headers: { host: `${host}:${tlsPort}` } } as unknown as string[]);
    const got: string[] = [];
    ws.addEventListener("message", (e) => got.push(String(e.data)));
    const opened = await new Promise<boolean>((resolve) => {
      ws.addEventListener("open", () => resolve(true));
      ws.addEventListener("error", () => resolve(false));
    });
    expect(opened).toBe(true);
    await eventually(async () => got.length, (n) => n >= 1, 10_000);
    expect(JSON.parse(got[0]!)).toMatchObject({ path: "/ws?over=tls", forwardedHost: `${host}:${tlsPort}` });
    ws.send("secure");
    await eventually(async () => got.length, (n) => n >= 2, 10_000);
    expect(got[1]).toBe("echo:secure");
    ws.close(1000, "bye");
  });

  it("refuses certificates that do not fit, naming the problem", async () => {
    const other = issue("other", ["other.example.test"]);
    const expired = issue("shop.example.test", ["shop.example.test"], { from: Date.now() - 10 * DAY, to: Date.now() - DAY });
    const stranger = issue("Someone Else", [], { ca: true });
    const cases: Array<[{ body: any }, RegExp]> = [
      [{ body: { domain: "shop.example.test", tls: { mode: "managed", certificate_pem: good.cert, private_key_pem: good.key } } }, /tls\.mode.*byoc/],
      [body("not a host", { certificate_pem: good.cert, private_key_pem: good.key }), /domain.*fully-qualified/],
      [body("shop.example.test", { certificate_pem: "nope", private_key_pem: good.key }), /not a PEM certificate/],
      [body("shop.example.test", { certificate_pem: good.cert, private_key_pem: "nope" }), /not a PEM private key/],
      [body("shop.example.test", { certificate_pem: good.cert, private_key_pem: other.key }), /does not match/],
      [body("shop.example.test", { certificate_pem: expired.cert, private_key_pem: expired.key }), /expired/],
      [body("www.example.test", { certificate_pem: good.cert, private_key_pem: good.key }), /does not cover www\.example\.test/],
      [body("shop.example.test", { certificate_pem: good.cert, private_key_pem: good.key, certificate_chain_pem: stranger.cert }), /chain does not verify/],
      [{ body: { domain: "shop.example.test", tls: { mode: "byoc", certificate_pem: good.cert } } }, /private_key_pem/],
    ];
    for (const [b, msg] of cases) {
      const r = await k.api("POST", path(), b);
      expect(r.status, JSON.stringify(b.body.domain)).toBe(400);
      expect(r.body.error).toMatch(msg);
    }
  });

  it("attaches a domain (201, then 200 for the same), serves it by SNI with its certificate, refuses conflicts, and detaches", async () => {
    const r = await k.api("POST", path(), body("shop.example.test", { certificate_pem: good.cert, private_key_pem: good.key, certificate_chain_pem: ca.cert }));
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({
      domain: "shop.example.test",
      tls_mode: "byoc",
      required_routing_record: { type: "CNAME", name: "shop.example.test", value: new URL(f.site_url).hostname },
      verification_records: [{ type: "TXT", name: "_kiln-verification.shop.example.test" }],
    });
    expect(JSON.stringify(r.body)).not.toContain("PRIVATE KEY");
    const active = await eventually(() => k.api("GET", path()), (g) => g.body?.domain_status === "active");
    expect(active.body.effective_urls).toEqual([f.site_url, `https://${new URL(f.site_url).hostname}:${tlsPort}`, `https://shop.example.test:${tlsPort}`]);
    expect((await k.api("GET", `/projects/${p.id}/frontends/${f.id}`)).body).toMatchObject({ custom_domain: "shop.example.test", custom_domain_status: "active" });

    const served = await httpsGet("shop.example.test", ca.cert);
    expect(served).toMatchObject({ cn: "shop.example.test", authorized: true });
    expect(served.body).toContain("<h1>shop</h1>");

    expect((await k.api("POST", path(), body("shop.example.test", { certificate_pem: good.cert, private_key_pem: good.key }))).status).toBe(200);
    const www = issue("www.example.test", ["www.example.test"]);
    const different = await k.api("POST", path(), body("www.example.test", { certificate_pem: www.cert, private_key_pem: www.key }));
    expect(different.status).toBe(409);
    const f2 = await deployFrontend(k, p.id, "blog");
    const elsewhere = await k.api("POST", `/projects/${p.id}/frontends/${f2.id}/domain`, body("shop.example.test", { certificate_pem: good.cert, private_key_pem: good.key }));
    expect(elsewhere.status).toBe(409);
    expect(elsewhere.body.error).toMatch(/another frontend/);

    expect((await k.api("DELETE", path())).status).toBe(204);
    await eventually(() => k.api("GET", path()), (g) => g.text === "null");
    // The name now gets the default certificate (not trusted for it).
    expect((await httpsGet("shop.example.test", ca.cert)).authorized).toBe(false);
  });

  it("in the configuration manifest: the domain and tls.mode without certificate or key; unchanged on a round trip; null detaches", async () => {
    const p2 = await createProject(k);
    const site = await deployFrontend(k, p2.id, "cfg");
    const cert = issue("cfg.example.test", ["cfg.example.test"], { issuer: ca });
    const attached = await k.api("POST", `/projects/${p2.id}/frontends/${site.id}/domain`, body("cfg.example.test", { certificate_pem: cert.cert, private_key_pem: cert.key, certificate_chain_pem: ca.cert }));
    expect(attached.status, attached.text).toBe(201);
    const exported = await fetch(`${k.url}/projects/${p2.id}/config?format=yaml`, { headers: { authorization: `Bearer ${k.token}` } });
    const text = await exported.text();
    expect(exported.status, text).toBe(200);
    expect(text).toContain("custom_domain:\n      domain: cfg.example.test\n      tls:\n        mode: byoc\n");
    expect(text).not.toMatch(/BEGIN|PRIVATE|certificate|fingerprint/);
    const put = (manifest: string | object) =>
      fetch(`${k.url}/projects/${p2.id}/config`, {
        method: "PUT",
        headers: { authorization: `Bearer ${k.token}`, "content-type": typeof manifest === "string" ? "application/yaml" : "application/json" },
        body: typeof manifest === "string" ? manifest : JSON.stringify(manifest),
      }).then(async (r) => ({ status: r.status, body: (await r.json()) as any }));
    const same = await put(text);
    expect(same.status).toBe(200);
    expect(same.body.results.filter((r: any) => r.section.startsWith("frontend"))).toEqual([
      { section: "frontends", name: "cfg", action: "unchanged" },
      { section: "frontend_domains", name: "cfg", action: "unchanged" },
    ]);
    // Another domain needs its own certificate: an error entry, the attached one stays.
    const other = await put({ version: 1, frontends: [{ name: "cfg", custom_domain: { domain: "www.cfg.example.test", tls: { mode: "byoc" } } }] });
    expect(other.body.results[1]).toMatchObject({ section: "frontend_domains", action: "error", notice: expect.stringMatching(/kiln frontends domain set cfg www\.cfg\.example\.test/) });
    expect((await k.api("GET", `/projects/${p2.id}/frontends/${site.id}/domain`)).body.domain).toBe("cfg.example.test");
    // null: detached (what DELETE .../domain does).
    const off = await put({ version: 1, frontends: [{ name: "cfg", custom_domain: null }] });
    expect(off.body.results).toEqual([
      { section: "frontends", name: "cfg", action: "unchanged" },
      { section: "frontend_domains", name: "cfg", action: "deleted" },
    ]);
    await eventually(() => k.api("GET", `/projects/${p2.id}/frontends/${site.id}/domain`), (g) => g.text === "null");
    const after = await fetch(`${k.url}/projects/${p2.id}/config`, { headers: { authorization: `Bearer ${k.token}` } }).then((r) => r.json() as any);
    expect(after.frontends[0].custom_domain).toBeNull();
  });

  it("is SUPERAGENT only: 403 on HOBBY", async () => {
    const acct = await k.api("POST", "/admin/accounts", { token: k.adminToken, body: { plan: "hobby" } });
    const hp = await createProject(k, undefined, acct.body.platform_token);
    const hf = await deployFrontend(k, hp.id, "hob", acct.body.platform_token);
    const r = await k.api("POST", `/projects/${hp.id}/frontends/${hf.id}/domain`, { token: acct.body.platform_token, ...body("shop.example.test", { certificate_pem: good.cert, private_key_pem: good.key }) });
    expect(r.status).toBe(403);
    expect(r.body.error).toMatch(/HOBBY/);
  });
});

describe("after a restart on the same data dir", () => {
  it("serves the sites and the custom domains it served, and runs again a deployment the stop interrupted", async () => {
    const port = await freePort();
    const ca = issue("Restart Root", [], { ca: true });
    const leaf = issue("www.restart.test", ["www.restart.test"], { issuer: ca });
    // Builds wait an hour of platform time: the first is released by advancing the clock, the second is
    // still waiting when Kiln stops.
    const first = await startKiln({ args: ["--frontends-tls-port", String(port), "--controllable-clock"], env: { KILN_FAULTS: "frontend_build_delay:3600000" } });
    let second: TestKiln | null = null;
    try {
      const p = await createProject(first);
      const deploying = deployFrontend(first, p.id, "kept");
      await eventually(() => first.api("GET", `/projects/${p.id}/frontends/kept`), (r) => r.status === 200);
      expect((await first.api("POST", "/_kiln/clock/advance", { token: null, body: { seconds: 3600 } })).status).toBe(200);
      const f = await deploying;
      await eventually(() => httpsGet("localhost", undefined, port).then(() => true, () => false), (up) => up, 30_000);
      const d = await first.api("POST", `/projects/${p.id}/frontends/${f.id}/domain`, { body: { domain: "www.restart.test", tls: { mode: "byoc", certificate_pem: leaf.cert, private_key_pem: leaf.key, certificate_chain_pem: ca.cert } } });
      expect(d.status).toBe(201);
      // A deploy still building (its build held for an hour of platform time) when Kiln stops.
      const form = new FormData();
      form.set("name", "interrupted");
      form.set("archive", new Blob([new Uint8Array(tgz({ "index.html": "<h1>interrupted</h1>" }))]), "site.tgz");
      const res = await fetch(`${first.url}/projects/${p.id}/frontends`, { method: "POST", headers: { authorization: `Bearer ${first.token}` }, body: form });
      const pending = (await res.json()) as any;
      const code = await first.stop();
      expect(code, first.stderr.slice(-3000)).toBe(0);

      second = await startKiln({ dataDir: first.dataDir, databaseUrl: first.databaseUrl, args: ["--frontends-tls-port", String(port)], env: { KILN_PLATFORM_TOKEN: first.token } });
      const again = (await second.api("GET", `/projects/${p.id}/frontends/${f.id}`)).body;
      expect(again).toMatchObject({ status: "active", site_url: f.site_url.replace(new URL(f.site_url).port, new URL(second.url).port) });
      const u = new URL(again.site_url);
      expect(await (await fetch(`http://127.0.0.1:${u.port}/`, { headers: { host: u.host } })).text()).toContain("<h1>kept</h1>");
      await eventually(() => httpsGet("www.restart.test", ca.cert, port).then((r) => r.authorized && r.body.includes("<h1>kept</h1>"), () => false), (ok) => ok, 30_000);
      const resumed = (await eventually(() => second!.api("GET", `/projects/${p.id}/frontends/${pending.id}`), (r) => r.body.status === "active", 60_000)).body;
      const ru = new URL(resumed.site_url);
      expect(await (await fetch(`http://127.0.0.1:${ru.port}/`, { headers: { host: ru.host } })).text()).toContain("interrupted");
    } finally {
      if (second) await second.stop();
      else await first.stop();
      removeDir(first.dataDir);
    }
  }, 180_000);
});
