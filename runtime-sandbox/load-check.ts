import { realpathSync } from "node:fs";
import type { BuildLog, BuildOptions } from "./build-runner";
import { chooseIsolation, noSandboxMessage } from "./isolation";
import { LocalProcess } from "./local-process";
import { TASK_ROOT } from "./mounts";
import type { ResolvedRuntime } from "./runtimes";
import { planLaunch } from "./sandbox";
import { FunctionError, Worker, type LogLine, type WorkerProcess } from "./worker";

/**
 * The last step of a build: the built code is loaded once the way a worker loads it (the runtime's
 * bootstrap in the worker sandbox: no network, read-only code, no project variables), so a syntax
 * error, a failing import or a handler that does not exist fails the deploy with the language's own
 * error instead of the first invocation. The worker is stopped as soon as it says it is ready.
 */
export async function checkCodeLoads(
  s: { root: string; entry: string; handler: string; runtime: ResolvedRuntime; env: Record<string, string> },
  o: BuildOptions,
  log: BuildLog,
): Promise<string | null> {
  const timeoutMs = Number(process.env.KILN_FUNCTION_INIT_TIMEOUT_MS) || 10_000;
  const memoryMb = Number(process.env.KILN_FUNCTION_MEMORY_MB) || 256;
  const spec = { runtime: s.runtime, codeDir: s.root, entry: s.entry, handler: s.handler, env: s.env, limits: { memoryMb, timeoutMs }, network: false };
  let proc: WorkerProcess;
  let taskRoot = TASK_ROOT;
  if (s.runtime.image && o.containers) {
    // A --runtime-image interpreter exists only in its image: the check runs in a container of it.
    proc = o.containers.launch(spec, { "dev.kiln.build": "load-check" });
  } else {
    const { isolation, problems } = chooseIsolation(o.sandbox);
    if (!isolation) return noSandboxMessage(problems);
    const plan = planLaunch(spec, { isolation, hiddenPaths: o.hiddenPaths, cgroupMemory: false, cgroupPids: false });
    proc = new LocalProcess(plan.argv, plan.env, plan.cwd, null, plan.uid === undefined ? undefined : { uid: plan.uid, gid: plan.gid! });
    if (isolation.kind === "none") taskRoot = realpathSync(s.root);
  }
  const worker = new Worker({ process: proc, onExit: () => {} }, Date.now() + timeoutMs, `${s.entry} did not finish loading within ${timeoutMs / 1000} s`);
  const stop = () => worker.kill();
  o.signal?.addEventListener("abort", stop, { once: true });
  try {
    await worker.ready;
    worker.stop();
    await log("info", `code check: ${s.entry} loads and exports ${s.handler}`);
    return null;
  } catch (e) {
    if (!(e instanceof FunctionError)) throw e;
    // What the runtime printed (its traceback or stack) goes to the build log as it is.
    for (const l of e.logs) await log(l.level === "info" ? "info" : "error", l.message);
    const at = location(e.logs, taskRoot);
    return `the code does not load: ${e.message}${at && !e.message.includes(at) ? ` (${at})` : ""}`;
  } finally {
    o.signal?.removeEventListener("abort", stop);
  }
}

/** `index.js:3` from the first line of the runtime's output naming a file of the function. */
function location(lines: LogLine[], taskRoot: string): string | null {
  const re = new RegExp(`${taskRoot.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}/([^\\s:()"']+)(?::(\\d+)|", line (\\d+))`);
  for (const l of lines) {
    const m = re.exec(l.message);
    if (m) return `${m[1]}:${m[2] ?? m[3]}`;
  }
  return null;
}
