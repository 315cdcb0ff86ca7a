import type { Guard } from "./auth/guard";
import type { AreaRouter } from "./http/route";
import type { Platform } from "./platform";
import type { SecretColumn } from "./secrets/store-secrets";
import type { Migration } from "./store/migrations";
import type { Sql } from "./store/store";
import type { Upgrade } from "./http/websocket-bridge";

/**
 * Requests addressed by host name (function addresses), tried before the path routes; null passes.
 * `meta.upgrade` (WebSocket upgrade requests only) hands the connection to a bridge; the router then
 * answers UPGRADED (server/http/websocket-bridge.ts).
 */
export type HostRouter = (request: Request, meta: { ip: string; arrivedAt: number; upgrade?: Upgrade }) => Promise<Response> | null;

/**
 * One API area (`server/<area>/area.ts`): everything Kiln needs to know to run it. `start` declares
 * what the area needs by its parameter's type (shared infrastructure from `Platform`, services of
 * areas listed before it in `server/main.ts`) and returns what it provides to the areas after it.
 * Its routes, lifecycle hooks and background work see exactly `Needs & Provides`.
 */
export interface Area<Name extends string, Needs extends object, Provides extends object> {
  name: Name;
  /** Its schema, run in order after those of the areas before it; ids are `<area>/<nnn>-<what>`. */
  migrations?: readonly Migration[];
  /** Its columns that hold secrets: written encrypted with the instance secret key (server/secrets). */
  secrets?: readonly SecretColumn[];
  start(deps: Needs): Provides | Promise<Provides>;
  routes?(r: AreaRouter<Needs & Provides>): void;
  /** Host-name routing (function addresses); gets the guard, which exists once every area started. */
  hostRouter?(deps: Needs & Provides, guard: Guard): HostRouter;
  /** What a project owns of this area: made in the project's creating transaction, removed with it. */
  project?: {
    setup?(tx: Sql, projectId: string, deps: Needs & Provides): Promise<void>;
    /** Runs in the background deletion; must be repeatable (an interrupted deletion runs it again). */
    cleanup?(projectId: string, deps: Needs & Provides): Promise<void>;
  };
  /**
   * Once every area has started: resume interrupted work, start timers. At a start this runs just
   * after Kiln listens (server/main.ts): /healthz answers meanwhile, every other request waits for it.
   */
  resume?(deps: Needs & Provides): Promise<void>;
  /** Stopping begins, before in-flight requests are awaited: end responses that never finish by themselves (live tails). */
  closing?(deps: Needs & Provides): void;
  /** Stopping, in reverse order: finish in-flight work (no new requests arrive by then). */
  drain?(deps: Needs & Provides): Promise<void>;
  /** Stopping, in reverse order after every drain: release engines, files, sockets. */
  stop?(deps: Needs & Provides): Promise<void>;
  /**
   * Putting back a snapshot in place (server/snapshots/controller.ts, docs/testing.md). A restore
   * that changes none of an area's tables (those its migrations create) or files does nothing to it.
   * One that changes them calls these hooks (`flush` and `resume` of every area that has them,
   * `release` in reverse order) instead of stopping and starting every area; if any area whose
   * state changed has no hook, every area is stopped and started instead.
   */
  reset?: {
    /** Top-level data-dir entries that hold this area's files (e.g. "databases"). */
    files?: readonly string[];
    /** First, on every restore, before changes are looked for: write what the area holds in memory (counters, log lines). */
    flush?(deps: Needs & Provides): Promise<void> | void;
    /** Before rows and files are put back: stop background work on them, close what holds changed files open. */
    release?(deps: Needs & Provides, changed: ResetChanges): Promise<void> | void;
    /** After: read back what the area keeps in memory from its restored rows and files, restart background work. */
    resume(deps: Needs & Provides, changed: ResetChanges): Promise<void> | void;
  };
}

/** What a restore puts back of one area: its tables (unqualified names) and files (paths relative to the data dir). */
export interface ResetChanges {
  tables: ReadonlySet<string>;
  files: readonly string[];
}

export type AnyArea = Area<string, any, any>;
type NeedsOf<A> = A extends Area<string, infer N, any> ? N : never;
type ProvidesOf<A> = A extends Area<string, any, infer P> ? P : never;

/** Infers an area's needs from its `start` parameter and what it provides from its result. */
export function defineArea<const Name extends string, Needs extends object, Provides extends object>(area: Area<Name, Needs, Provides>): Area<Name, Needs, Provides> {
  return area;
}

/**
 * "ok" when every area's needs are met by the platform and the areas before it; otherwise the
 * first area that is not, with what it is missing (shown by the type checker at `server/main.ts`).
 */
export type CheckOrder<L extends readonly AnyArea[], Have> = L extends readonly [infer H, ...infer T extends readonly AnyArea[]]
  ? [Have] extends [NeedsOf<H>]
    ? CheckOrder<T, Have & ProvidesOf<H>>
    : { area: H extends AnyArea ? H["name"] : never; missing: Exclude<keyof NeedsOf<H>, keyof Have> }
  : "ok";

/** Everything the areas of a list provide, together. */
export type ServicesOf<L extends readonly AnyArea[]> = L extends readonly [infer H, ...infer T extends readonly AnyArea[]] ? ProvidesOf<H> & ServicesOf<T> : unknown;

/**
 * Starts the areas in order on one registry object: each area's `start` receives it (typed as what
 * the area declared) and its result is merged in for the areas after it. `started` is called after
 * each, so a failing start can undo what the earlier ones made.
 */
export async function startAreas<const L extends readonly AnyArea[]>(
  areas: L,
  platform: Platform,
  started: (area: AnyArea) => void,
): Promise<Platform & ServicesOf<L>> {
  const registry: Record<string, unknown> = { ...platform };
  const trace = process.env.KILN_TRACE_STARTUP === "1";
  for (const area of areas) {
    const t0 = trace ? performance.now() : 0;
    const provided = await area.start(registry);
    if (trace) console.error(`startup: area ${area.name} +${Math.round(performance.now() - t0)} ms`);
    for (const key of Object.keys(provided)) {
      if (key in registry) throw new Error(`area ${area.name} provides '${key}', which is already provided`);
      registry[key] = provided[key];
    }
    started(area);
  }
  return registry as Platform & ServicesOf<L>;
}
