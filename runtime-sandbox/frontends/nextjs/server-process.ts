import { spawn, type ChildProcess } from "node:child_process";
import { PassThrough, type Readable } from "node:stream";
import type Docker from "dockerode";
import type { WorkerCgroup } from "../../cgroups";
import type { ContainerEngine } from "../../container";
import type { Mount } from "../../mounts";

/**
 * One run of a Next.js server, wherever it runs: a local sandboxed process (bubblewrap or
 * namespaces, in a cgroup of its own) or a container on the engine (`--function-runtime docker`).
 * server.ts only starts, watches and stops it.
 */
export interface ServerProcess {
  /** On the host: the sandbox's outermost process, or the container's init. */
  readonly pid: number | null;
  readonly stdout: Readable;
  readonly stderr: Readable;
  alive(): boolean;
  /** Settles once it has exited; `oomKilled` when its memory limit ended it. */
  readonly exit: Promise<{ code: number | null; signal: string | null; oomKilled: boolean }>;
  /** Settles once its output is through and what it held (cgroup, container) is released. */
  readonly closed: Promise<void>;
  kill(): void;
}

export function spawnLocal(argv: { argv: string[]; cwd: string; uid?: number; gid?: number }, env: Record<string, string>, cg: WorkerCgroup | null): ServerProcess {
  const proc: ChildProcess = spawn(argv.argv[0]!, argv.argv.slice(1), { env, cwd: argv.cwd, stdio: ["ignore", "pipe", "pipe"], detached: true, ...(argv.uid === undefined ? {} : { uid: argv.uid, gid: argv.gid }) });
  let exited = false;
  const exit = new Promise<{ code: number | null; signal: string | null; oomKilled: boolean }>((resolve) => {
    proc.once("exit", (code, signal) => {
      exited = true;
      resolve({ code, signal, oomKilled: (cg?.oomKills() ?? 0) > 0 });
    });
    proc.once("error", (e) => {
      exited = true;
      resolve({ code: null, signal: null, oomKilled: false });
      proc.stderr?.emit("data", Buffer.from(`cannot start the server: ${e.message}\n`));
    });
  });
  const kill = () => {
    try {
      if (proc.pid) process.kill(-proc.pid, "SIGKILL");
    } catch {
      // already gone
    }
    cg?.killAll();
  };
  const closed = new Promise<void>((resolve) => proc.once("close", () => resolve())).then(async () => {
    cg?.killAll();
    await cg?.remove().catch(() => {});
  });
  return { pid: proc.pid ?? null, stdout: proc.stdout!, stderr: proc.stderr!, alive: () => !exited, exit, closed, kill };
}

export interface ContainerServerSpec {
  cmd: string[];
  env: Record<string, string>;
  mounts: Mount[];
  workingDir: string;
  memoryMb: number;
  cpus: number;
  maxProcesses: number;
  labels: Record<string, string>;
}

/** The server as a container: created, attached, started; removed once it has exited. */
export async function startContainer(engine: ContainerEngine, spec: ContainerServerSpec): Promise<ServerProcess> {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const container: Docker.Container = await engine.createSandboxContainer({ ...spec, hostname: "kiln-frontend", tmpfsMb: 256 });
  const remove = () => engine.track(container.remove({ force: true }).catch(() => {}));
  let pid: number | null = null;
  try {
    const stream = (await container.attach({ stream: true, stdout: true, stderr: true })) as unknown as Readable;
    engine.docker.modem.demuxStream(stream, stdout, stderr);
    const ended = new Promise<void>((resolve) => {
      stream.once("end", resolve);
      stream.once("error", () => resolve());
      stream.once("close", () => resolve());
    });
    await container.start();
    pid = (await container.inspect()).State.Pid || null;
    let exited = false;
    const exit = container.wait().then(
      async (r: { StatusCode?: number }) => {
        exited = true;
        const after = await container.inspect().catch(() => null);
        return { code: r.StatusCode ?? null, signal: null, oomKilled: !!after?.State.OOMKilled };
      },
      () => {
        exited = true;
        return { code: null, signal: null, oomKilled: false };
      },
    );
    const closed = exit.then(async () => {
      await Promise.race([ended, new Promise((r) => setTimeout(r, 2000))]);
      stdout.end();
      stderr.end();
      remove();
    });
    return { pid, stdout, stderr, alive: () => !exited, exit, closed, kill: () => void container.kill().catch(() => {}) };
  } catch (e) {
    remove();
    throw e;
  }
}
