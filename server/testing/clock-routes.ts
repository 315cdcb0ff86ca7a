import * as z from "zod";
import { errorSchema } from "../http/common-schemas";
import { notFound } from "../http/errors";
import { reply, type Router } from "../http/route";

const clockSchema = z.object({ now: z.string(), offset_ms: z.number().int() });

/**
 * A clock tests can move forward (`--controllable-clock`): token expiry, lease TTLs and rate-limit
 * windows then pass in milliseconds instead of real minutes. Off (404) unless asked for.
 */
export function clockRoutes(r: Router, enabled: boolean): void {
  const guard = () => {
    if (!enabled) throw notFound("the controllable clock is off; start Kiln with --controllable-clock");
  };
  r.add({
    method: "GET",
    path: "/_kiln/clock",
    tag: "Testing",
    summary: "Kiln's current time and how far it has been moved forward",
    auth: { kind: "none" },
    responses: { 200: { description: "clock", schema: clockSchema }, 404: errorSchema },
    handler: ({ kiln }) => {
      guard();
      return reply.ok({ now: kiln.clock.now().toISOString(), offset_ms: kiln.clock.offsetMs() });
    },
  });
  r.add({
    method: "POST",
    path: "/_kiln/clock/advance",
    tag: "Testing",
    summary: "Move Kiln's clock forward (never back)",
    auth: { kind: "none" },
    body: z.object({ seconds: z.number().positive().max(10 * 365 * 86_400) }),
    responses: { 200: { description: "clock", schema: clockSchema }, 400: errorSchema, 404: errorSchema },
    handler: ({ kiln, body }) => {
      guard();
      kiln.clock.advance(Math.round(body.seconds * 1000));
      return reply.ok({ now: kiln.clock.now().toISOString(), offset_ms: kiln.clock.offsetMs() });
    },
  });
}
