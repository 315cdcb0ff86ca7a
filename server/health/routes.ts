import * as z from "zod";
import { reply, type AreaRouter } from "../http/route";


export function healthRoutes(r: AreaRouter<unknown>): void {
  r.add({
    method: "GET",
    path: "/healthz",
    tag: "Health",
    summary: "Liveness: 200 once Kiln is ready",
    auth: { kind: "none" },
    alsoHead: true,
    responses: { 200: { description: "ready", schema: z.object({ status: z.literal("ok") }) } },
    handler: () => reply.ok({ status: "ok" }),
  });
}
