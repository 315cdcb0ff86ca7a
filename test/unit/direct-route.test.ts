import { Elysia } from "elysia";
import { describe, expect, test } from "vitest";
import * as z from "zod";
import type { Kiln } from "../../server/context";
import { badRequest } from "../../server/http/errors";
import { Router } from "../../server/http/route";

const kiln = {
  config: { validateResponses: false },
  guard: { authorize: async () => ({ principal: null, project: null }) },
  http: { renderError: (err: Error) => new Response(`error: ${err.message}`, { status: 400 }) },
} as unknown as Kiln;

function router() {
  const r = new Router();
  r.add({
    method: "POST",
    path: "/things/{thingId}/poke",
    summary: "",
    tag: "t",
    auth: { kind: "none" },
    params: z.object({ thingId: z.string().min(1) }),
    body: z.unknown(),
    bodyValidation: "handler",
    direct: true,
    responses: { 200: { description: "ok" } },
    handler: ({ params, body }) => {
      if ((body as { fail?: boolean }).fail) throw badRequest("asked to fail");
      return new Response(JSON.stringify({ thingId: params.thingId, body }));
    },
  });
  const app = new Elysia({ normalize: false });
  r.bind(app, kiln, () => ({ ip: "127.0.0.1", arrivedAt: 0 }));
  return { r, app };
}

const req = (method: string, path: string, body?: string) => new Request(`http://127.0.0.1:7070${path}`, { method, body });

describe("direct routes", () => {
  test("a request of the exact shape gets the same answer as through Elysia; other shapes are left to Elysia", async () => {
    const { r, app } = router();
    const meta = { ip: "127.0.0.1", arrivedAt: 0 };
    const served = ["/things/abc/poke", "/things/abc/poke?x=1"];
    for (const path of served) {
      for (const body of ['{"a":1}', "", "not json", '{"fail":true}']) {
        const direct = await r.direct(req("POST", path, body), kiln, meta);
        const routed = await app.handle(req("POST", path, body));
        expect(direct).not.toBeNull();
        expect([direct!.status, await direct!.text()]).toEqual([routed.status, await routed.text()]);
      }
    }
    // Elysia decodes parameters and matches a trailing slash; those, and other methods, stay with it.
    for (const [method, path] of [["POST", "/things/abc/poke/"], ["POST", "/things/a%2541/poke"], ["GET", "/things/abc/poke"], ["POST", "/things/abc"]] as const)
      expect(r.direct(req(method, path), kiln, meta)).toBeNull();
  });
});
