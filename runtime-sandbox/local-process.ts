import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import type { Socket } from "node:net";
import { ancestry, descendants, sandboxProcesses } from "./process-tree";
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
  /** The worker's own processes: the runtime and its ancestors up to the spawned one (sandbox, its init). */
  private own: number[] | null = null;
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

  /**
   * Kills every process of this worker but its own (the sandbox's, its init, the runtime): what the
   * function started and left running. Synchronous, so nothing it left runs after the response. The
   * worker's cgroup lists them in one read; without one the process tree below the spawned process
   * is walked (every process of a sandbox descends from it: orphans go to the sandbox's init), after
   * a cheap look at the sandbox's own /proc says there is more than the init and the runtime.
   */
  killStrays(): number {
    if (this.status || !this.proc.pid) return 0;
    const rt = this.runtimePid();
    if (!rt) return 0;
    this.own ??= ancestry(rt, this.proc.pid);
    const own = this.own;
    if (!own) return 0;
    const init = own[1];
    if (!this.cgroup && init !== undefined && sandboxProcesses(init) === 2) return 0;
    const killed = new Set<number>();
    // A stray forking while the list is read leaves a child the next round finds (a process with a
    // pending SIGKILL forks no more), so this ends within a few rounds.
    for (let round = 0; round < 20; round++) {
      let fresh = 0;
      for (const pid of this.cgroup ? this.cgroup.processes() : descendants(this.proc.pid)) {
        if (own.includes(pid) || killed.has(pid)) continue;
        killed.add(pid);
        fresh++;
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // gone already
        }
      }
      if (!fresh) break;
    }
    this.killed = [...killed];
    return killed.size;
  }

  /** What the last killStrays() killed, until it has exited. */
  private killed: number[] = [];

  async straysGone(timeoutMs: number): Promise<void> {
    const end = Date.now() + timeoutMs;
    const running = (pid: number) => {
      try {
        // State after the command's ")": Z (zombie) or X (dead) has exited.
        const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
        return !/^[ZX]$/.test(stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3));
      } catch {
        return false;
      }
    };
    while ((this.killed = this.killed.filter(running)).length && Date.now() < end) await new Promise((r) => setTimeout(r, 2));
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
      // bwrap and its init; the namespace sandbox's unshare and its init (sh); the cgroup wrapper (sh).
      if (comm !== "bwrap" && comm !== "sh" && comm !== "unshare") return (this.runtimePidCache = pid);
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

