import { chmodSync, existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Config } from "./config";

// The data dir as Kiln holds it: one Kiln at a time, and closed to everyone else.

/**
 * One Kiln per data dir: a second instance would corrupt the embedded databases. The lock file holds
 * the pid and that process's start time (and the boot it started in), so a pid the system has since
 * given to another process does not keep the data dir locked.
 */
export function lockDataDir(dataDir: string): () => void {
  const file = join(dataDir, "kiln.pid");
  if (existsSync(file)) {
    const holder = readLockFile(readFileSync(file, "utf8"));
    if (holder && holder.pid !== process.pid && lockHolderAlive(holder)) {
      throw new Error(`data dir ${dataDir} is in use by another Kiln (pid ${holder.pid}); stop it or pass another --data-dir`);
    }
  }
  const me = processIdentity(process.pid);
  writeFileSync(file, `${process.pid}\n${me ? `start=${me.start} boot=${me.boot}\n` : ""}`, { mode: 0o600 });
  return () => rmSync(file, { force: true });
}

function readLockFile(text: string): { pid: number; start?: string; boot?: string } | null {
  const [first, second] = text.split("\n");
  const pid = Number(first?.trim());
  if (!Number.isInteger(pid) || pid <= 0) return null;
  const start = /start=(\d+)/.exec(second ?? "")?.[1];
  const boot = /boot=([\w-]+)/.exec(second ?? "")?.[1];
  return { pid, start, boot };
}

/** Linux: the process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat) and the boot id. */
function processIdentity(pid: number): { start: string; boot: string } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: count fields after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const boot = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
    return { start: fields[19]!, boot };
  } catch {
    return null;
  }
}

function lockHolderAlive(h: { pid: number; start?: string; boot?: string }): boolean {
  try {
    process.kill(h.pid, 0);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  const now = processIdentity(h.pid);
  if (h.start && now) return now.start === h.start && now.boot === h.boot;
  // A lock written by an older Kiln (pid only), or no /proc: the pid must at least be a Kiln.
  try {
    return /kiln/.test(readFileSync(`/proc/${h.pid}/cmdline`, "utf8"));
  } catch {
    return true;
  }
}

/** A root Kiln running functions without a sandbox, as the sandbox uid: that uid must reach the code. */
const codeOpen = (config: Config) => process.getuid?.() === 0 && config.allowUnsandboxedFunctions;

/**
 * Nothing of Kiln's state is open to other local users, nor to function code run without a sandbox:
 * the data dir is 0700 from the start (0711 when a root Kiln runs functions unsandboxed, so the
 * sandbox uid can pass through to the code but list nothing).
 */
export function closeDataDir(config: Config): void {
  try {
    chmodSync(config.dataDir, codeOpen(config) ? 0o711 : 0o700);
  } catch {
    // not ours to change (a shared folder): the files inside keep their own modes
  }
}

/** Once every folder exists: in that unsandboxed case, only `functions/` (the code) is readable. */
export function openCodeToSandboxUid(config: Config): void {
  if (!codeOpen(config)) return;
  for (const e of readdirSync(config.dataDir)) chmodSync(join(config.dataDir, e), e === "functions" ? 0o755 : 0o700);
}
