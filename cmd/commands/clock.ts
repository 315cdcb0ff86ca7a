import type { Command } from "commander";
import { output, printObject } from "../output";
import { act } from "./shared";

const UNITS: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86_400, w: 604_800 };

/** `90`, `90s`, `15m`, `1h`, `2d`, `1w`, or a sum such as `1h30m`: seconds. */
export function parseDuration(v: string): number {
  const s = v.trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s);
  const parts = [...s.matchAll(/(\d+(?:\.\d+)?)([smhdw])/g)];
  if (!parts.length || parts.map((p) => p[0]).join("") !== s) throw new Error(`'${v}' is not a duration (examples: 90, 15m, 1h30m, 2d)`);
  return parts.reduce((sum, p) => sum + Number(p[1]) * UNITS[p[2]!]!, 0);
}

export function clockCommand(program: Command): void {
  const cmd = program
    .command("clock")
    .description("Kiln's controllable clock (start Kiln with --controllable-clock): show it, or move it forward")
    .action(
      act(async (c, g) => {
        const r = await c.request("GET", "/_kiln/clock");
        output(g.json, r, () => printObject(r));
      }),
    );
  cmd
    .command("advance <duration>")
    .description("move the clock forward (90, 15m, 1h30m, 2d); timers due on the way fire before it returns")
    .action(
      act(async (c, g, duration: string) => {
        const r = await c.request("POST", "/_kiln/clock/advance", { seconds: parseDuration(duration) });
        output(g.json, r, () => printObject(r));
      }),
    );
  cmd
    .command("set <instant>")
    .description("move the clock forward to an RFC 3339 instant, e.g. 2030-01-01T00:00:00Z")
    .action(
      act(async (c, g, instant: string) => {
        const r = await c.request("POST", "/_kiln/clock/set", { now: instant });
        output(g.json, r, () => printObject(r));
      }),
    );
}
