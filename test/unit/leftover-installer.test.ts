// After a crash, the next start kills what a build cut short left running (build-runner.ts
// killLeftoverInstaller): the process group recorded beside the build folder, and any installer or
// sandbox process that names the folder but left that group (bubblewrap's inner process starts a
// session of its own; CI once saw it outlive a Kiln killed mid-build).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, expect, test } from "vitest";
import { killLeftoverInstaller } from "../../runtime-sandbox/build-runner";

const started: ChildProcess[] = [];
afterEach(() => {
  for (const p of started.splice(0)) p.kill("SIGKILL");
});

/** A long-running process shown as `name` (argv[0]) with `arg` on its command line, in a session of its own. */
function stray(name: string, arg: string): ChildProcess {
  const p = spawn("tail", ["-f", arg], { argv0: name, detached: true, stdio: "ignore" });
  started.push(p);
  return p;
}

/** Until each process runs its program (before its exec, /proc shows the parent's command line). */
async function execed(...ps: ChildProcess[]): Promise<void> {
  const shows = (p: ChildProcess) => {
    try {
      return readFileSync(`/proc/${p.pid}/cmdline`, "utf8").includes("\0-f\0");
    } catch {
      return false;
    }
  };
  while (!ps.every(shows)) await new Promise((r) => setTimeout(r, 10));
}

const alive = (p: ChildProcess) => p.exitCode === null && p.signalCode === null;
async function exited(p: ChildProcess): Promise<void> {
  if (!alive(p)) return;
  await new Promise((r) => p.once("exit", r));
}

test("strays naming the build folder go, with no pid file or one naming another group; others stay", async () => {
  const dir = mkdtempSync(join(tmpdir(), "kiln-leftover-"));
  try {
    const root = join(dir, "functions", "fn1", "dep1");
    const other = join(dir, "functions", "fn1", "dep2");
    mkdirSync(root, { recursive: true });
    mkdirSync(other, { recursive: true });
    for (const d of [root, other]) writeFileSync(join(d, "package.json"), "{}");
    const group = stray("bwrap", join(root, "package.json")); // the recorded group's leader
    const inner = stray("bwrap", join(root, "package.json")); // left the group (its own session)
    const otherBuild = stray("bwrap", join(other, "package.json"));
    const notAnInstaller = stray("tail", join(root, "package.json"));
    await execed(group, inner, otherBuild, notAnInstaller);
    writeFileSync(`${root}.build-pid`, String(group.pid));
    killLeftoverInstaller(root);
    await Promise.all([exited(group), exited(inner)]);
    expect(group.signalCode).toBe("SIGKILL");
    expect(inner.signalCode).toBe("SIGKILL");
    expect(alive(otherBuild)).toBe(true);
    expect(alive(notAnInstaller)).toBe(true);
    // Without a pid file (Kiln died before writing it), the stray still goes.
    const late = stray("npm", join(root, "package.json"));
    await execed(late);
    killLeftoverInstaller(root);
    await exited(late);
    expect(late.signalCode).toBe("SIGKILL");
    expect(alive(otherBuild)).toBe(true);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
