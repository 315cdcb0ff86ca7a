import type { Command } from "commander";
import { Client, resolveTarget, type GlobalOptions } from "../client";

/** Wraps an action: builds the API client from global options and turns failures into one line. */
export function act<A extends unknown[]>(fn: (client: Client, g: GlobalOptions, ...args: A) => Promise<void>) {
  return async (...args: unknown[]) => {
    const cmd = args[args.length - 1] as Command;
    const g = cmd.optsWithGlobals() as GlobalOptions & Record<string, unknown>;
    const { url, token } = resolveTarget(g);
    await fn(new Client(url, token), g, ...(args.slice(0, -1) as A));
  };
}

export function requireProject(o: { project?: string }): string {
  const p = o.project ?? process.env.KILN_PROJECT;
  if (!p) throw new Error("missing --project <id> (or KILN_PROJECT)");
  return p;
}

export function qs(q: Record<string, string | number | boolean | undefined>): string {
  const sp = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) if (v !== undefined && v !== false) sp.set(k, String(v));
  const s = sp.toString();
  return s ? `?${s}` : "";
}

export const csv = (v: string) => v.split(",").map((s) => s.trim()).filter(Boolean);

/**
 * Long-running commands: SIGINT/SIGTERM stop cleanly and exit 0; a second signal exits at once. With a
 * `deadline`, a stop that takes longer says what it still waits for and exits 1 (as a service manager's
 * stop timeout would, but with the reason on stderr).
 */
export function stopOnSignals(stop: () => Promise<void>, deadline?: { ms: number; waitingFor: () => string }): void {
  let signals = 0;
  const handler = async () => {
    if (++signals > 1) process.exit(1);
    if (deadline) {
      setTimeout(() => {
        console.error(`kiln: stopping took longer than ${deadline.ms} ms, still waiting for: ${deadline.waitingFor()}; exiting`);
        process.exit(1);
      }, deadline.ms).unref();
    }
    await stop();
    process.exit(0);
  };
  process.on("SIGINT", handler);
  process.on("SIGTERM", handler);
}
