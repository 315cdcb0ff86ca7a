import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import type { Socket } from "node:net";
import type { WorkerCgroup } from "./sandbox";
import type { ExitStatus, WorkerProcess } from "./worker";

/**
 * A worker as a local process (bubblewrap or plain): the protocol channel is fd 3, a socketpair made
 * by the spawn; the process gets its own process group so a kill reaches whatever it started.
 */
export class LocalProcess implements WorkerProcess {
  readonly stdout;
  readonly stderr;
  readonly channel: Promise<Socket>;
  private readonly proc: ChildProcess;
  private runtimePidCache: number | null = null;
  private exitListeners: Array<(s: ExitStatus) => void> = [];
  private closeListeners: Array<() => void> = [];
  private status: ExitStatus | null = null;

  constructor(
    argv: string[],
    env: Record<string, string>,
    cwd: string,
    private readonly cgroup: WorkerCgroup | null,
    /** Spawn as this user (an unsandboxed worker of a root Kiln). */
    user?: { uid: number; gid: number },
  ) {
    this.proc = spawn(argv[0]!, argv.slice(1), { cwd, env, stdio: ["ignore", "pipe", "pipe", "pipe"], detached: true, ...(user ?? {}) });
    this.stdout = this.proc.stdout!;
    this.stderr = this.proc.stderr!;
    this.channel = Promise.resolve(this.proc.stdio[3] as Socket);
    this.proc.on("error", (e) => this.exit({ code: null, signal: null, error: e.message, oomKilled: false }));
    this.proc.on("exit", (code, signal) => this.exit({ code, signal, oomKilled: (this.cgroup?.oomKills() ?? 0) > 0 }));
    this.proc.on("close", () => {
      for (const l of this.closeListeners.splice(0)) l();
    });
  }

  onExit(l: (s: ExitStatus) => void): void {
    if (this.status) l(this.status);
    else this.exitListeners.push(l);
  }

  onClose(l: () => void): void {
    this.closeListeners.push(l);
  }

  kill(): void {
    try {
      if (this.proc.pid) process.kill(-this.proc.pid, "SIGKILL");
    } catch {
      // group already empty
      if (!this.status) this.proc.kill("SIGKILL");
    }
    this.cgroup?.killAll();
  }

  cleanup(): void {
    void this.cgroup?.remove();
  }

  /** The interpreter's pid on the host: below the bubblewrap and cgroup-wrapper processes when sandboxed. */
  runtimePid(): number | null {
    if (this.runtimePidCache) return this.runtimePidCache;
    let pid = this.proc.pid ?? null;
    for (let depth = 0; pid && depth < 4; depth++) {
      let comm: string;
      try {
        comm = readFileSync(`/proc/${pid}/comm`, "utf8").trim();
      } catch {
        return null;
      }
      if (comm !== "bwrap" && comm !== "sh") return (this.runtimePidCache = pid);
      pid = firstChild(pid);
    }
    return null;
  }

  private exit(s: ExitStatus): void {
    if (this.status) return;
    this.status = s;
    for (const l of this.exitListeners.splice(0)) l(s);
  }
}

function firstChild(pid: number): number | null {
  try {
    const c = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/)[0];
    return c ? Number(c) : null;
  } catch {
    return null;
  }
}
