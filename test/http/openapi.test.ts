// The OpenAPI description: generated, self-contained, cacheable, rationed.
import { gunzipSync } from "node:zlib";
import YAML from "yaml";
import { describe, expect, test } from "vitest";
import { useKiln, withKiln } from "../support/kiln";

describe("OpenAPI description", () => {
  const k = useKiln({ env: { KILN_OPENAPI_FETCH_LIMIT: "1000" } });

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
    // Fixed windows aligned to the minute (the spec's): 31 fetches that straddle a minute's end fall in
    // two windows, so such a round does not count and is done again on a new Kiln (fresh counters).
    const minute = () => Math.floor(Date.now() / 60_000);
    for (let round = 0; ; round++) {
      const done = await withKiln({}, async (k) => {
        const first = minute();
        for (let i = 0; i < 30; i++) expect((await fetch(`${k.url}/openapi.${i % 2 ? "json" : "yaml"}`)).status).toBe(200);
        const r = await fetch(`${k.url}/openapi.json`);
        if (minute() !== first && round < 2) return false;
        expect(r.status).toBe(429);
        expect(Number(r.headers.get("retry-after"))).toBeGreaterThan(0);
        expect((await r.json()).error).toEqual(expect.any(String));
        // Other routes are unaffected.
        expect((await fetch(`${k.url}/healthz`)).status).toBe(200);
        return true;
      });
      if (done) break;
    }
  });
});
