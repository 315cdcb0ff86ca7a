import { defineArea } from "../area";
import type { DurableEngine } from "../durable/engine";
import { invoke, type InvokeDeps } from "../functions/invoke";
import { takeFault } from "../config";
import { HttpError } from "../http/errors";
import type { Platform } from "../platform";
import { SCHEDULERS_MIGRATIONS } from "./migrations";
import { projectSchedulerRoutes, schedulerRoutes } from "./routes";
import { SchedulersService } from "./service";
import { SchedulerTicker, type RunOutcome, type TickTarget } from "./ticker";

/** A failed answer's message: its `error` field when it is the usual JSON error body, else its text. */
function errorOf(text: string, status: number): string {
  try {
    const body = JSON.parse(text) as { error?: unknown };
    if (typeof body?.error === "string") return body.error;
  } catch {}
  return text.slice(0, 2000) || `status ${status}`;
}

type Needs = Pick<Platform, "store" | "config" | "clock" | "log" | "address"> & InvokeDeps & { durable: DurableEngine };

/** Function schedulers: cron ticks on the platform clock that invoke a function with a payload. */
export const schedulersArea = defineArea({
  name: "schedulers",
  migrations: SCHEDULERS_MIGRATIONS,
  start: (deps: Needs) => {
    const { store, config, clock, log, functions } = deps;
    // A tick of a standard function is an invocation with no caller (the platform's own).
    const invokeStandard: TickTarget = async (fn, event) => {
      const t = performance.now();
      try {
        const res = await invoke(deps, fn, null, event, t, t);
        const ok = res.status < 400;
        return { ok, httpStatus: res.status, invocationId: res.headers.get("X-Service-Invocation-Id"), error: ok ? null : errorOf(await res.text(), res.status) };
      } catch (err) {
        if (!(err instanceof HttpError)) throw err;
        const body = err.body as { error?: string; code?: string };
        return { ok: false, httpStatus: err.status, invocationId: err.headers["X-Service-Invocation-Id"] ?? null, error: body.error ?? body.code ?? `status ${err.status}` } satisfies RunOutcome;
      }
    };
    // A tick of a durable function starts an execution (the payload plus __service_schedule as its input).
    const startDurable: TickTarget = async (fn, event) => {
      try {
        const exec = await deps.durable.start(fn, event, null);
        return { ok: true, httpStatus: 202, invocationId: exec.id as string, error: null };
      } catch (err) {
        if (!(err instanceof HttpError)) throw err;
        return { ok: false, httpStatus: err.status, invocationId: null, error: (err.body as { error?: string }).error ?? `status ${err.status}` };
      }
    };
    const schedulerTicker = new SchedulerTicker({
      store,
      clock,
      log,
      regions: config.regions,
      awaitRuns: config.controllableClock,
      // One instance (embedded store) knows every change itself; several must look for each other's.
      pollMs: store.kind === "postgres" ? Number(process.env.KILN_SCHEDULER_POLL_MS ?? 1000) : null,
      findFunction: (id) => functions.byId(id),
      fault: (name) => takeFault(config, name),
      targets: { standard: invokeStandard, durable: startDurable },
    });
    const schedulers = new SchedulersService(store, clock, config.regions, () => schedulerTicker.rearm());
    functions.onDelete(async (tx, functionId) => void (await schedulers.removeForFunction(tx, functionId)));
    return { schedulers, schedulerTicker };
  },
  routes: (r) => {
    projectSchedulerRoutes(r);
    schedulerRoutes(r, "functions", "standard");
    schedulerRoutes(r, "durable-functions", "durable");
  },
  project: { cleanup: (projectId, { schedulers }) => schedulers.removeAll(projectId) },
  resume: ({ schedulerTicker }) => schedulerTicker.start(),
  drain: ({ schedulerTicker }) => schedulerTicker.stop(),
  // Its timer stands for the earliest due scheduler: re-armed from the restored rows when they changed.
  reset: {
    release: ({ schedulerTicker }, changed) => (changed.tables.size ? schedulerTicker.stop() : undefined),
    resume: ({ schedulerTicker }, changed) => (changed.tables.size ? schedulerTicker.restart() : undefined),
  },
});
