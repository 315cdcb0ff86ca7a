import * as z from "zod";
import type { Clock } from "../clock";
import { errorSchema } from "../http/common-schemas";
import { badRequest, notFound } from "../http/errors";
import { reply, type AreaRouter } from "../http/route";

const clockSchema = z.object({ now: z.string(), offset_ms: z.number().int() });
const TEN_YEARS_S = 10 * 365 * 86_400;

export interface ClockRouteDeps {
  clock: Clock;
  config: { controllableClock: boolean };
}

/**
 * A clock tests can move forward (`--controllable-clock`): token expiry, lease TTLs, scheduler ticks
 * and rate-limit windows then pass in milliseconds instead of real minutes. Every timer due in the
 * skipped interval fires, in order, before the answer. Off (404) unless asked for.
 */
export function clockRoutes(r: AreaRouter<ClockRouteDeps>): void {
  const enabled = (deps: ClockRouteDeps) => {
    if (!deps.config.controllableClock) throw notFound("the controllable clock is off; start Kiln with --controllable-clock");
    return deps.clock;
  };
  const view = (clock: Clock) => reply.ok({ now: clock.now().toISOString(), offset_ms: clock.offsetMs() });
  r.add({
    method: "GET",
    path: "/_kiln/clock",
    tag: "Testing",
    summary: "Kiln's current time and how far it has been moved forward",
    auth: { kind: "none" },
    responses: { 200: { description: "clock", schema: clockSchema }, 404: errorSchema },
    handler: ({ deps }) => view(enabled(deps)),
  });
  r.add({
    method: "POST",
    path: "/_kiln/clock/advance",
    tag: "Testing",
    summary: "Move Kiln's clock forward (never back); timers due on the way fire in order before the answer",
    auth: { kind: "none" },
    body: z.object({ seconds: z.number().positive().max(TEN_YEARS_S) }),
    responses: { 200: { description: "clock", schema: clockSchema }, 400: errorSchema, 404: errorSchema },
    handler: async ({ deps, body }) => {
      const clock = enabled(deps);
      await clock.advance(Math.round(body.seconds * 1000));
      return view(clock);
    },
  });
  r.add({
    method: "POST",
    path: "/_kiln/clock/set",
    tag: "Testing",
    summary: "Move Kiln's clock forward to an absolute instant; timers due on the way fire in order before the answer",
    auth: { kind: "none" },
    body: z.object({ now: z.iso.datetime({ offset: true }) }),
    responses: { 200: { description: "clock", schema: clockSchema }, 400: errorSchema, 404: errorSchema },
    handler: async ({ deps, body }) => {
      const clock = enabled(deps);
      const target = Date.parse(body.now);
      if (target < clock.nowMs()) throw badRequest(`invalid request: body field 'now': ${body.now} is before the clock's current time ${clock.now().toISOString()}; the clock only moves forward`);
      if (target - clock.nowMs() > TEN_YEARS_S * 1000) throw badRequest("invalid request: body field 'now': more than ten years ahead");
      await clock.set(target);
      return view(clock);
    },
  });
}
