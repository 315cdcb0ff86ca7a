// Secrets at rest: the control store keeps variable values, database and branch passwords and end
// users' signing keys encrypted with the instance secret key (kept outside the store). Read the store
// directly (PGlite of a stopped Kiln, or the test's PostgreSQL database), on both control stores.
import { PGlite } from "@electric-sql/pglite";
import { randomBytes } from "node:crypto";
import { readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { exportJWK, generateKeyPair, importJWK, jwtVerify, createRemoteJWKSet } from "jose";
import postgres from "postgres";
import { afterAll, describe, expect, test } from "vitest";
import { activeDatabase } from "../support/databases";
import { connect } from "../support/database-clients";
import { createProject, eventually, removeDir, startKiln, STORE, type KilnOptions, type TestKiln } from "../support/kiln";

const KEY_A = randomBytes(32).toString("base64");
const KEY_B = randomBytes(32).toString("hex");
const ANOTHER_KEY = /this data was written with another KILN_SECRET_KEY/;

type Query = (sql: string, params?: unknown[]) => Promise<Record<string, any>[]>;

/** Runs `fn` on the control store of a stopped Kiln (or the store's PostgreSQL database). */
async function withStore<T>(k: { dataDir: string; databaseUrl?: string }, fn: (q: Query) => Promise<T>): Promise<T> {
  if (STORE === "embedded") {
    const db = new PGlite(join(k.dataDir, "control"));
    try {
      return await fn(async (sql, params) => (await db.query<Record<string, any>>(sql, params)).rows);
    } finally {
      await db.close();
    }
  }
  const sql = postgres(k.databaseUrl!, { max: 1, onnotice: () => {} });
  try {
    return await fn(async (text, params) => [...(await sql.unsafe(text, params as any[]))]);
  } finally {
    await sql.end();
  }
}

/** Every value of every table of the store, as text: what someone with a copy of the store reads. */
async function dump(q: Query): Promise<string> {
  const tables = await q(`select table_name from information_schema.tables where table_schema = 'public' and table_type = 'BASE TABLE'`);
  let out = "";
  for (const { table_name } of tables) for (const r of await q(`select t::text as row from "${table_name}" t`)) out += `${r.row}\n`;
  return out;
}

/** The stored secret columns' raw values. */
async function secretColumns(q: Query) {
  const variables = (await q(`select name, value from variables`)).map((r) => r.value as string);
  const passwords = [...(await q(`select client_password from databases`)), ...(await q(`select client_password from database_branches`))].map((r) => r.client_password as string);
  const jwks = (await q(`select jsonb_typeof(private_jwk) as type, private_jwk #>> '{}' as value from auth_signing_keys`)) as { type: string; value: string }[];
  const oauth = (await q(`select client_secret from oauth_configs where client_secret is not null`)).map((r) => r.client_secret as string);
  return { variables, passwords, jwks, oauth, all: [...variables, ...passwords, ...jwks.map((j) => j.value), ...oauth] };
}

const keyIdOf = (v: string) => /^kiln:v1:([0-9a-f]+):/.exec(v)?.[1] ?? null;

const passwordOf = (connectionString: string) => decodeURIComponent(new URL(connectionString).password);
/** A connection string without its port (the wire listener takes a free port at every start). */
const sansPort = (connectionString: string) => connectionString.replace(/@([^/:]+):\d+\//, "@$1/");

const dirs: string[] = [];
afterAll(() => dirs.forEach(removeDir));

/** Starts Kiln on the same data dir and store as `base`, with the given key settings. */
function restart(base: { dataDir: string; databaseUrl?: string }, env: KilnOptions["env"]) {
  return startKiln({ dataDir: base.dataDir, databaseUrl: base.databaseUrl, env });
}

describe("secrets at rest", () => {
  // One store through its lives: written under key A, refused a wrong key, restarted with A, rotated
  // to B, then given plaintext rows as a Kiln before encryption wrote them. (Each start costs seconds:
  // the restart with A after the refused start is the one that proves the same key reads them.)
  let base: { dataDir: string; databaseUrl?: string };
  let project: { id: string };
  let anon: string;
  const value = `v-${randomBytes(12).toString("hex")}`;
  let dbUrl: string;
  let branchUrl: string;
  let accessToken: string;
  const user = { email: `u-${randomBytes(4).toString("hex")}@example.com`, password: "correct horse" };
  const oauthSecret = `GOCSPX-${randomBytes(16).toString("hex")}`;
  const masked = `${oauthSecret.slice(0, 4)}…${oauthSecret.slice(-4)}`;

  async function expectApiUnchanged(k: TestKiln) {
    const v = await k.api("GET", `/projects/${project.id}/variables/SECRET_VALUE`);
    expect(v.body.value).toBe(value);
    const now = (await k.api("GET", `/projects/${project.id}/databases/app`)).body.connection_string;
    expect(sansPort(now)).toBe(sansPort(dbUrl));
    expect(sansPort((await k.api("GET", `/projects/${project.id}/databases/app/branches/b1`)).body.connection_string)).toBe(sansPort(branchUrl));
    // The wire listener checks the decrypted password.
    const c = connect(now);
    try {
      expect((await c`select 1 as one`)[0]!.one).toBe(1);
    } finally {
      await c.end({ timeout: 1 });
    }
    // A token signed before verifies; a new one is signed with the decrypted private key.
    expect((await k.api("GET", "/auth/user", { token: accessToken })).status).toBe(200);
    const signin = await k.api("POST", "/auth/signin", { token: anon, body: user });
    expect(signin.status).toBe(200);
    const jwks = createRemoteJWKSet(new URL(`${k.url}/auth/jwks.json?project_id=${project.id}`));
    await jwtVerify(signin.body.access_token, jwks, { audience: "authenticated" });
    // An OAuth client secret is read back (masked) from what the key decrypts.
    expect((await k.api("GET", `/projects/${project.id}/oauth/configs/google`)).body.client_secret).toBe(masked);
  }

  test("variable values, database and branch passwords and signing keys are stored encrypted; the API returns what it did", async () => {
    const k = await startKiln({ env: { KILN_SECRET_KEY: KEY_A } });
    dirs.push(k.dataDir);
    base = { dataDir: k.dataDir, databaseUrl: k.databaseUrl };
    try {
      project = await createProject(k);
      const v = await k.api("POST", `/projects/${project.id}/variables`, { body: { name: "SECRET_VALUE", value } });
      expect(v.status).toBe(201);
      expect(v.body.value).toBe(value);
      expect((await k.api("GET", `/projects/${project.id}/variables`)).body.data[0].value).toBe(value);
      dbUrl = (await activeDatabase(k, project.id)).connection_string;
      const b = await k.api("POST", `/projects/${project.id}/databases/app/branches`, { body: { name: "b1" } });
      expect(b.status).toBe(202);
      const branch = await eventually(() => k.api("GET", `/projects/${project.id}/databases/app/branches/b1`), (x) => x.body.status !== "provisioning", 30_000);
      expect(branch.body.status).toBe("active");
      branchUrl = branch.body.connection_string;
      anon = (await k.api("GET", `/projects/${project.id}/anon-keys`)).body.data[0].key;
      const signup = await k.api("POST", "/auth/signup", { token: anon, body: user });
      expect(signup.status).toBe(201);
      accessToken = signup.body.access_token;
      const oauth = await k.api("POST", `/projects/${project.id}/oauth/configs`, {
        body: { provider: "google", client_id: "web", client_secret: oauthSecret, redirect_url: `${k.url}/auth/oauth/google/callback` },
      });
      expect(oauth.status).toBe(201);
    } finally {
      expect(await k.stop()).toBe(0);
    }

    const { stored, everything } = await withStore(k, async (q) => ({ stored: await secretColumns(q), everything: await dump(q) }));
    expect(stored.variables).toHaveLength(1);
    expect(stored.passwords).toHaveLength(2);
    expect(stored.jwks.length).toBeGreaterThanOrEqual(1);
    expect(stored.oauth).toHaveLength(1);
    for (const j of stored.jwks) expect(j.type).toBe("string");
    for (const s of stored.all) expect(s).toMatch(/^kiln:v1:[0-9a-f]{12}:[A-Za-z0-9_-]+$/);
    expect(new Set(stored.all.map(keyIdOf)).size).toBe(1);
    // Nowhere in the store: the value, the passwords, a private key's "d".
    for (const secret of [value, passwordOf(dbUrl), passwordOf(branchUrl), oauthSecret]) expect(everything).not.toContain(secret);
    expect(everything).not.toMatch(/"d": ?"/);
    // (The restart with the same key that reads them all: the next test's, after a refused start.)
  });

  test("a start with another key is refused with a message that names the fix, and changes nothing: a restart with the same key reads every secret as before", async () => {
    await expect(restart(base, { KILN_SECRET_KEY: KEY_B })).rejects.toThrow(/this data was written with another KILN_SECRET_KEY.*give the old key as KILN_SECRET_KEY_PREVIOUS/);
    const again = await restart(base, { KILN_SECRET_KEY: KEY_A });
    try {
      await expectApiUnchanged(again);
    } finally {
      expect(await again.stop()).toBe(0);
    }
  });

  test("rotation: the new key with KILN_SECRET_KEY_PREVIOUS re-encrypts every row; then the new key alone works and the old one is refused", async () => {
    const before = await withStore(base, async (q) => (await secretColumns(q)).all);
    const oldId = keyIdOf(before[0]!);
    const rotated = await restart(base, { KILN_SECRET_KEY: KEY_B, KILN_SECRET_KEY_PREVIOUS: KEY_A });
    try {
      await expectApiUnchanged(rotated);
    } finally {
      expect(await rotated.stop()).toBe(0);
    }
    const after = await withStore(base, async (q) => ({
      ...(await secretColumns(q)),
      check: (await q(`select check_value from kiln_secret_key_check`))[0]!.check_value as string,
    }));
    const ids = new Set([...after.all, after.check].map(keyIdOf));
    expect(ids.size).toBe(1);
    expect(ids.has(oldId)).toBe(false);
    expect(after.all.length).toBe(before.length);

    await expect(restart(base, { KILN_SECRET_KEY: KEY_A })).rejects.toThrow(ANOTHER_KEY);
    const plain = await restart(base, { KILN_SECRET_KEY: KEY_B });
    try {
      await expectApiUnchanged(plain);
    } finally {
      expect(await plain.stop()).toBe(0);
    }
  });

  test("a store written before encryption (plaintext rows, no key check recorded) is encrypted at start, and its secrets still work", async () => {
    const password = passwordOf(dbUrl);
    const plainValue = `plain-${randomBytes(8).toString("hex")}`;
    // A signing key in plaintext, as an older Kiln stored it: tokens signed after the start must verify with its public half.
    const { privateKey, publicKey } = await generateKeyPair("ES256", { extractable: true });
    let kid = "";
    const pub = { ...(await exportJWK(publicKey)), alg: "ES256", use: "sig" };
    await withStore(base, async (q) => {
      await q(`update variables set value = $1`, [plainValue]);
      await q(`update databases set client_password = $1`, [password]);
      await q(`update database_branches set client_password = $1`, [passwordOf(branchUrl)]);
      await q(`update oauth_configs set client_secret = $1`, [oauthSecret]);
      kid = (await q(`select kid from auth_signing_keys where project_id = $1 and rotated_at is null`, [project.id]))[0]!.kid;
      await q(`update auth_signing_keys set private_jwk = $2::text::jsonb, public_jwk = $3::text::jsonb where kid = $1`, [
        kid,
        JSON.stringify(await exportJWK(privateKey)),
        JSON.stringify({ ...pub, kid }),
      ]);
      await q(`delete from kiln_secret_key_check`);
    });
    const k = await restart(base, { KILN_SECRET_KEY: KEY_B });
    try {
      expect((await k.api("GET", `/projects/${project.id}/variables/SECRET_VALUE`)).body.value).toBe(plainValue);
      expect(sansPort((await k.api("GET", `/projects/${project.id}/databases/app`)).body.connection_string)).toBe(sansPort(dbUrl));
      expect(sansPort((await k.api("GET", `/projects/${project.id}/databases/app/branches/b1`)).body.connection_string)).toBe(sansPort(branchUrl));
      const signin = await k.api("POST", "/auth/signin", { token: anon, body: user });
      expect(signin.status).toBe(200);
      const { protectedHeader } = await jwtVerify(signin.body.access_token, await importJWK(pub, "ES256"), { audience: "authenticated" });
      expect(protectedHeader.kid).toBe(kid);
      expect((await k.api("GET", `/projects/${project.id}/oauth/configs/google`)).body.client_secret).toBe(masked);
    } finally {
      expect(await k.stop()).toBe(0);
    }
    const { stored, everything } = await withStore(base, async (q) => ({ stored: await secretColumns(q), everything: await dump(q) }));
    for (const s of stored.all) expect(s).toMatch(/^kiln:v1:[0-9a-f]{12}:/);
    for (const secret of [plainValue, password, passwordOf(branchUrl), oauthSecret]) expect(everything).not.toContain(secret);
    expect(everything).not.toMatch(/"d": ?"/);
    // Once encrypted, a second start has nothing left to encrypt and reads the same.
    const again = await restart(base, { KILN_SECRET_KEY: KEY_B });
    try {
      expect((await again.api("GET", `/projects/${project.id}/variables/SECRET_VALUE`)).body.value).toBe(plainValue);
    } finally {
      expect(await again.stop()).toBe(0);
    }
  });
});

describe("where the key comes from", () => {
  test("a weak KILN_SECRET_KEY is refused at start with what a key must be", async () => {
    await expect(startKiln({ env: { KILN_SECRET_KEY: "hunter2" } })).rejects.toThrow(/KILN_SECRET_KEY must be 32 random bytes written as base64 \(44 characters\) or hex \(64 characters\)/);
    await expect(startKiln({ env: { KILN_SECRET_KEY: "00".repeat(32) } })).rejects.toThrow(/KILN_SECRET_KEY does not look random/);
  });

  test("without a key Kiln makes <data-dir>/secret.key (0600) and uses it at the next start; KILN_SECRET_KEY_FILE reads a key from a file; the production profile warns that instances must share the key", async () => {
    const k = await startKiln({ env: { KILN_SECRET_KEY: undefined } });
    dirs.push(k.dataDir);
    const file = join(k.dataDir, "secret.key");
    try {
      expect(statSync(file).mode & 0o777).toBe(0o600);
      const p = await createProject(k);
      expect((await k.api("POST", `/projects/${p.id}/variables`, { body: { name: "X", value: "y" } })).status).toBe(201);
      if (STORE === "postgres") expect(k.stderr).toMatch(/every Kiln instance sharing this store needs the same key; give each one KILN_SECRET_KEY_FILE/);
      else expect(k.stderr).not.toMatch(/sharing this store/);
    } finally {
      expect(await k.stop()).toBe(0);
    }
    // The same key, given through KILN_SECRET_KEY_FILE from elsewhere, opens the store; another key does not.
    const elsewhere = join(k.dataDir, "..", `kiln-key-${randomBytes(4).toString("hex")}`);
    writeFileSync(elsewhere, readFileSync(file));
    rmSync(file);
    try {
      await expect(restart(k, { KILN_SECRET_KEY: undefined, KILN_SECRET_KEY_FILE: join(k.dataDir, "missing.key") })).rejects.toThrow(/KILN_SECRET_KEY_FILE .*missing.key cannot be read/);
      const again = await restart(k, { KILN_SECRET_KEY: undefined, KILN_SECRET_KEY_FILE: elsewhere });
      try {
        expect(again.stderr).not.toMatch(/sharing this store/);
      } finally {
        expect(await again.stop()).toBe(0);
      }
      // No key given and none in the data dir: a new one is made, which the store refuses.
      await expect(restart(k, { KILN_SECRET_KEY: undefined })).rejects.toThrow(ANOTHER_KEY);
    } finally {
      rmSync(elsewhere, { force: true });
    }
  });
});
