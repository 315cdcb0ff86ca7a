import { describe, expect, test } from "vitest";
import { resolveConfig } from "../../server/config";
import { buildOpenApi } from "../../server/http/openapi";
import { buildRouter } from "../../server/main";

describe("OpenAPI generation", () => {
  test("every route the server binds is in the document, and nothing else", () => {
    const router = buildRouter(resolveConfig({}, {}));
    const doc = buildOpenApi(router.routes) as { paths: Record<string, Record<string, unknown>> };
    const fromRoutes = new Set(router.routes.flatMap((r) => (r.alsoHead ? [r.method, "HEAD"] : [r.method]).map((m) => `${m.toLowerCase()} ${r.path.replace(/\{(\w+)\+\}/g, "{$1}")}`)));
    const fromDoc = new Set(Object.entries(doc.paths).flatMap(([p, ms]) => Object.keys(ms).map((m) => `${m} ${p}`)));
    expect(fromDoc).toEqual(fromRoutes);
    const ids = Object.values(doc.paths).flatMap((ms) => Object.values(ms).map((o: any) => o.operationId));
    expect(new Set(ids).size).toBe(ids.length);
  });
});
