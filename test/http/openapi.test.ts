// The OpenAPI description: generated, self-contained, cacheable, rationed.
import { gunzipSync } from "node:zlib";
import YAML from "yaml";
import { beforeEach, describe, expect, test } from "vitest";
import { useKiln } from "../support/kiln";

// One Kiln for the file. The fetch ration counts in fixed windows of the platform clock's minutes,
// so each test starts on a minute of its own by moving the clock (no Kiln per round for fresh counters).
const k = useKiln({ args: ["--controllable-clock"] });

/** Sets the platform clock to the start of a later minute: a new window of the ration, 60 s long. */
async function nextMinute() {
  const now = Date.parse((await k.api("GET", "/_kiln/clock", { token: null })).body.now);
  const start = (Math.floor(now / 60_000) + 1) * 60_000;
  expect((await k.api("POST", "/_kiln/clock/set", { token: null, body: { now: new Date(start).toISOString() } })).status).toBe(200);
}

describe("OpenAPI description", () => {
  beforeEach(nextMinute);

  const get = (path: string, headers: Record<string, string> = {}, method = "GET") =>
    fetch(k.url + path, { method, headers: { "accept-encoding": "identity", ...headers } });

  test("JSON and YAML are the same OpenAPI 3.0 document, served without a credential", async () => {
    const json = await get("/openapi.json");
    expect(json.status).toBe(200);
    expect(json.headers.get("content-type")).toMatch(/application\/json/);
    const doc = await json.json();
    expect(doc.openapi).toMatch(/^3\.0\./);
    const yaml = await get("/openapi.yaml");
    expect(yaml.status).toBe(200);
    expect(yaml.headers.get("content-type")).toMatch(/yaml/);
    expect(YAML.parse(await yaml.text())).toEqual(doc);
  });

  test("describes every route with its schemas, including validation limits", async () => {
    const doc = await (await get("/openapi.json")).json();
    for (const [path, methods] of Object.entries({
      "/projects": ["get", "post"],
      "/projects/{projectId}": ["get", "patch", "delete"],
      "/projects/{projectId}/access-tokens": ["get", "post"],
      "/projects/{projectId}/access-tokens/usage": ["get"],
      "/projects/{projectId}/access-tokens/{tokenId}": ["get", "delete"],
      "/projects/{projectId}/access-tokens/{tokenId}/usage": ["get"],
      "/projects/{projectId}/service-keys": ["get", "post"],
      "/projects/{projectId}/service-keys/{keyId}": ["get", "patch", "delete"],
      "/projects/{projectId}/anon-keys": ["get", "post"],
      "/projects/{projectId}/anon-keys/{keyId}": ["delete"],
      "/projects/{projectId}/variables": ["get", "post"],
      "/projects/{projectId}/variables/{variableId}": ["get", "patch", "delete"],
      "/openapi.json": ["get", "head"],
      "/openapi.yaml": ["get", "head"],
      "/healthz": ["get"],
    }))
      for (const m of methods) expect(doc.paths[path]?.[m], `${m} ${path}`).toBeDefined();
    const list = doc.paths["/projects"].get;
    const search = list.parameters.find((p: any) => p.name === "search");
    expect(search.schema.maxLength).toBe(256);
    const limit = list.parameters.find((p: any) => p.name === "limit");
    expect(limit.schema.maximum).toBe(100);
    const body = doc.paths["/projects/{projectId}/access-tokens"].post.requestBody.content["application/json"].schema;
    expect(body.required).toEqual(expect.arrayContaining(["name", "scope"]));
    expect(body.properties.scope.enum).toEqual(["full", "read_only"]);
    expect(doc.paths["/projects/{projectId}"].get.security).toEqual([{ bearerAuth: [] }]);
    expect(doc.paths["/openapi.json"].get.security).toBeUndefined();
    // Self-contained: no external references.
    expect(JSON.stringify(doc)).not.toMatch(/"\$ref":"(?!#)/);
  });

  test("strong ETag, 304 on If-None-Match, HEAD with the same headers and no body", async () => {
    const r = await get("/openapi.json");
    const etag = r.headers.get("etag")!;
    expect(etag).toMatch(/^"[^"]+"$/); // strong: no W/ prefix
    const again = await get("/openapi.json", { "if-none-match": etag });
    expect(again.status).toBe(304);
    expect(await again.text()).toBe("");
    expect((await get("/openapi.json", { "if-none-match": '"other"' })).status).toBe(200);
    const head = await get("/openapi.json", {}, "HEAD");
    expect(head.status).toBe(200);
    expect(head.headers.get("etag")).toBe(etag);
    expect(await head.text()).toBe("");
    expect((await get("/openapi.yaml")).headers.get("etag")).not.toBe(etag);
  });

  test("the gzip form carries its own ETag and decodes to the same document", async () => {
    const plain = await get("/openapi.json");
    const text = await plain.text();
    const gz = await fetch(k.url + "/openapi.json", { headers: { "accept-encoding": "gzip" }, decompress: false } as RequestInit);
    expect(gz.headers.get("content-encoding")).toBe("gzip");
    const gzEtag = gz.headers.get("etag")!;
    expect(gzEtag).not.toBe(plain.headers.get("etag"));
    expect(gunzipSync(Buffer.from(await gz.arrayBuffer())).toString()).toBe(text);
    const cached = await fetch(k.url + "/openapi.json", { headers: { "accept-encoding": "gzip", "if-none-match": gzEtag } });
    expect(cached.status).toBe(304);
  });
});

describe("OpenAPI fetch ration", () => {
  test("30 fetches a minute per address, then 429 with Retry-After", async () => {
    await nextMinute();
    for (let i = 0; i < 30; i++) expect((await fetch(`${k.url}/openapi.${i % 2 ? "json" : "yaml"}`)).status).toBe(200);
    const r = await fetch(`${k.url}/openapi.json`);
    expect(r.status).toBe(429);
    expect(Number(r.headers.get("retry-after"))).toBeGreaterThan(0);
    expect((await r.json()).error).toEqual(expect.any(String));
    // Other routes are unaffected.
    expect((await fetch(`${k.url}/healthz`)).status).toBe(200);
    // The next minute of the platform clock is a new window.
    await nextMinute();
    expect((await fetch(`${k.url}/openapi.json`)).status).toBe(200);
  });
});
