import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { CgroupHost, describeLimits, detectCgroups, withCgroup, type CgroupIo, type ProcView, type WorkerCgroup } from "../../runtime-sandbox/cgroups";
import { hostTool } from "../../runtime-sandbox/isolation";
import { LocalProcess } from "../../runtime-sandbox/local-process";
import type { ExitStatus } from "../../runtime-sandbox/worker";
import { FunctionError, WorkerPool } from "../../runtime-sandbox/worker-pool";

const root = mkdtempSync(join(tmpdir(), "kiln-cgroups-test-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let n = 0;

// ---------------------------------------------------------------------------------------------
// A fake cgroupfs: a folder tree with the control files, and the /proc/self views that point at it.
// Writes land in plain files, so the test reads back exactly what the code wrote. The kernel's
// rmdir of a folder full of control files is the one thing it cannot imitate: CgroupIo.

const fakeIo: CgroupIo = { rmdir: (d) => (existsSync(d) ? rmSync(d, { recursive: true }) : rmSync(d)) };
const read = (...p: string[]) => readFileSync(join(...p), "utf8");

function fakeV2(o: { own: string; controllers: string; procs: number[]; isRoot?: boolean; enabled?: string }): { mount: string; dir: string; proc: ProcView } {
  const mount = join(root, `v2-${++n}`);
  const dir = join(mount, o.own);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "cgroup.controllers"), `${o.controllers}\n`);
  writeFileSync(join(dir, "cgroup.subtree_control"), o.enabled ?? "");
  writeFileSync(join(dir, "cgroup.procs"), o.procs.map((p) => `${p}\n`).join(""));
  if (!o.isRoot) writeFileSync(join(dir, "cgroup.type"), "domain\n");
  return {
    mount,
    dir,
    proc: { mountinfo: `41 31 0:38 / ${mount} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n`, cgroup: `0::/${o.own}\n` },
  };
}

describe("cgroup v2 (fake cgroupfs)", () => {
  test("detection: controllers offered by Kiln's own cgroup, and whether its processes must move first", () => {
    const f = fakeV2({ own: "user.slice/user-1000.slice/user@1000.service/app.slice/kiln.service", controllers: "cpuset cpu io memory pids", procs: [process.pid, 4242] });
    const s = detectCgroups({ proc: f.proc });
    expect(s.v2).toEqual({ base: f.dir, controllers: ["memory", "pids", "cpu"], mustMove: true });
    expect(s.by).toEqual({ memory: 2, pids: 2, cpu: 2 });
    expect(describeLimits(s.by, { sandboxed: true })).toEqual(["memory by cgroup v2 (memory.max, memory.swap.max 0)", "processes by cgroup v2 (pids.max)", "cpu by cgroup v2 (cpu.max)"]);
    // The root cgroup (no cgroup.type) is exempt from "no internal processes"; an empty one needs no move.
    expect(detectCgroups({ proc: fakeV2({ own: "", controllers: "memory pids cpu", procs: [1, process.pid], isRoot: true }).proc }).v2?.mustMove).toBe(false);
    expect(detectCgroups({ proc: fakeV2({ own: "kiln.scope", controllers: "memory pids cpu", procs: [] }).proc }).v2?.mustMove).toBe(false);
  });

  test("a pool moves Kiln into kiln-main, enables memory, pids and cpu, and writes each worker's limits", async () => {
    const f = fakeV2({ own: "system.slice/kiln.service", controllers: "cpuset cpu io memory pids", procs: [4242, process.pid] });
    const host = CgroupHost.detect("t1", { proc: f.proc, io: fakeIo })!;
    expect(host.by).toEqual({ memory: 2, pids: 2, cpu: 2 });
    // Every process of Kiln's cgroup went into the leaf, Kiln first; then the controllers were enabled.
    expect(read(f.dir, "kiln-main", "cgroup.procs")).toBe(`${process.pid}\n4242\n`);
    expect(read(f.dir, "cgroup.subtree_control")).toBe("+memory\n+pids\n+cpu\n");
    const pool = join(f.dir, `kiln-${process.pid}-t1`);
    expect(read(pool, "cgroup.subtree_control")).toBe("+memory\n+pids\n+cpu\n");
    expect(existsSync(join(pool, "probe"))).toBe(false);

    const cg = host.create({ memoryMb: 128, maxProcesses: 32, cpus: 0.5 });
    const w = join(pool, "w1");
    expect(cg.procsFiles).toEqual([join(w, "cgroup.procs")]);
    expect({ memory: cg.memory, pids: cg.pids, cpu: cg.cpu, by: cg.by }).toEqual({ memory: true, pids: true, cpu: true, by: { memory: 2, pids: 2, cpu: 2 } });
    expect(read(w, "memory.max")).toBe(String(128 * 1024 * 1024));
    expect(read(w, "memory.swap.max")).toBe("0");
    expect(read(w, "memory.oom.group")).toBe("1");
    expect(read(w, "pids.max")).toBe("32");
    expect(read(w, "cpu.max")).toBe("50000 100000");
    // The wrapper joins the worker's one v2 folder before becoming the sandbox.
    expect(withCgroup(["/bin/true"], cg).slice(3, 6)).toEqual(["kiln-sandbox", "1", join(w, "cgroup.procs")]);

    // OOM kills are memory.events' oom_kill.
    expect(cg.oomKills()).toBe(0);
    writeFileSync(join(w, "memory.events"), "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 1\n");
    expect(cg.oomKills()).toBe(2);

    // One CPU by default; a whole number of CPUs is that many periods.
    const two = host.create({ memoryMb: 64, maxProcesses: 8, cpus: 2 });
    expect(read(pool, "w2", "cpu.max")).toBe("200000 100000");
    await cg.remove();
    await two.remove();
    expect(existsSync(w)).toBe(false);
    host.dispose();
    expect(existsSync(pool)).toBe(false);

    // A later pool of the same (moved) process finds the controllers enabled and moves nothing again.
    const again = CgroupHost.detect("t2", { proc: { ...f.proc, cgroup: "0::/system.slice/kiln.service/kiln-main\n" }, io: fakeIo })!;
    expect(again.by).toEqual({ memory: 2, pids: 2, cpu: 2 });
    expect(existsSync(join(f.dir, `kiln-${process.pid}-t2`))).toBe(true);
    expect(existsSync(join(f.dir, "kiln-main", "kiln-main"))).toBe(false);
    again.dispose();
  });

  test("only the controllers offered are used; a delegated folder that already enables them is used as is", () => {
    const f = fakeV2({ own: "kiln.service", controllers: "memory pids", procs: [], enabled: "memory pids" });
    const host = CgroupHost.detect("t3", { proc: f.proc, io: fakeIo })!;
    expect(host.by).toEqual({ memory: 2, pids: 2, cpu: null });
    expect(existsSync(join(f.dir, "kiln-main"))).toBe(false);
    expect(read(f.dir, "cgroup.subtree_control")).toBe("memory pids");
    const cg = host.create({ memoryMb: 64, maxProcesses: 8, cpus: 1 });
    expect(existsSync(join(f.dir, `kiln-${process.pid}-t3`, "w1", "cpu.max"))).toBe(false);
    expect(cg.by.cpu).toBe(null);
    host.dispose();
  });

  test("when the controllers cannot be enabled, the processes move back and nothing is enforced", () => {
    const f = fakeV2({ own: "kiln.service", controllers: "memory pids cpu", procs: [process.pid, 4242] });
    // A folder where the file should be: every write to it fails, as EBUSY would.
    rmSync(join(f.dir, "cgroup.subtree_control"));
    mkdirSync(join(f.dir, "cgroup.subtree_control"));
    expect(CgroupHost.detect("t4", { proc: f.proc, io: fakeIo })).toBe(null);
    expect(existsSync(join(f.dir, "kiln-main"))).toBe(false);
    expect(read(f.dir, "cgroup.procs")).toBe(`${process.pid}\n4242\n`);
  });

  test("folders left by a dead Kiln are removed", () => {
    const f = fakeV2({ own: "kiln.service", controllers: "memory", procs: [], enabled: "memory" });
    mkdirSync(join(f.dir, "kiln-999999999-old", "w3"), { recursive: true });
    CgroupHost.detect("t5", { proc: f.proc, io: fakeIo })!.dispose();
    expect(existsSync(join(f.dir, "kiln-999999999-old"))).toBe(false);
  });
});

describe("cgroup v1 (fake hierarchies) and none", () => {
  // This host's shape: v1 hierarchies for memory, pids and cpu, and a cgroup2 mount with no controllers.
  function fakeHybrid(): { dirs: Record<string, string>; proc: ProcView } {
    const base = join(root, `v1-${++n}`);
    const dirs: Record<string, string> = {};
    let mountinfo = `41 31 0:38 / ${base}/unified rw,relatime - cgroup2 cgroup2 rw\n`;
    for (const [i, c] of ["memory", "pids", "cpu"].entries()) {
      dirs[c] = join(base, c, "kiln.slice");
      mkdirSync(dirs[c]!, { recursive: true });
      mountinfo += `${35 + i} 31 0:${32 + i} / ${base}/${c} rw,relatime - cgroup cgroup rw,${c}\n`;
    }
    mkdirSync(join(base, "unified"));
    writeFileSync(join(base, "unified", "cgroup.controllers"), "hugetlb\n");
    writeFileSync(join(base, "memory", "kiln.slice", "memory.memsw.limit_in_bytes"), "");
    return { dirs, proc: { mountinfo, cgroup: "4:memory:/kiln.slice\n8:pids:/kiln.slice\n1:cpu:/kiln.slice\n0::/\n" } };
  }

  test("v1 where v2 lacks the controllers: memory.limit_in_bytes (+memsw), pids.max, cfs quota", async () => {
    const f = fakeHybrid();
    const s = detectCgroups({ proc: f.proc });
    expect(s.v2).toBe(null);
    expect(s.by).toEqual({ memory: 1, pids: 1, cpu: 1 });
    expect(describeLimits(s.by, { sandboxed: true })).toEqual(["memory by cgroup v1 (memory.limit_in_bytes)", "processes by cgroup v1 (pids.max)", "cpu by cgroup v1 (cfs quota)"]);
    const host = CgroupHost.detect("t6", { proc: f.proc, io: fakeIo })!;
    const cg = host.create({ memoryMb: 100, maxProcesses: 20, cpus: 1.5 });
    const w = (c: string) => join(f.dirs[c]!, `kiln-${process.pid}-t6`, "w1");
    expect(cg.procsFiles).toEqual(["memory", "pids", "cpu"].map((c) => join(w(c), "cgroup.procs")));
    expect(read(w("memory"), "memory.limit_in_bytes")).toBe(String(100 * 1024 * 1024));
    expect(read(w("pids"), "pids.max")).toBe("20");
    expect(read(w("cpu"), "cpu.cfs_period_us")).toBe("100000");
    expect(read(w("cpu"), "cpu.cfs_quota_us")).toBe("150000");
    writeFileSync(join(w("memory"), "memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
    expect(cg.oomKills()).toBe(1);
    await cg.remove();
    host.dispose();
  });

  test("no cgroup: the rlimit each limit falls back to, in doctor's words", () => {
    const s = detectCgroups({ proc: { mountinfo: `41 31 0:38 / ${root}/none rw - cgroup2 cgroup2 rw\n`, cgroup: "0::/\n" } });
    expect(s.by).toEqual({ memory: null, pids: null, cpu: null });
    expect(CgroupHost.detect("t7", { support: s, io: fakeIo })).toBe(null);
    const [memory, processes, cpu] = describeLimits(s.by, { sandboxed: true, why: s.why });
    expect(memory).toBe(hostTool("prlimit") ? "memory by RLIMIT_DATA (no writable memory cgroup)" : "memory by the runtime's own flag only (no writable memory cgroup; prlimit not found)");
    expect(processes).toMatch(/^processes (by RLIMIT_NPROC|not limited)/);
    expect(cpu).toBe("cpu not capped (no writable cpu cgroup; the per-invocation CPU budget still applies)");
  });
});

// ---------------------------------------------------------------------------------------------
// This machine's own cgroups (v1 or v2, whichever it has). CI runs as root, where a writable memory
// and cpu cgroup must exist: there these tests run (and fail) rather than skip.

const real = process.platform === "linux" ? CgroupHost.detect(`test${process.pid}`) : null;
const required = !!process.env.CI && process.platform === "linux";
afterAll(() => real?.dispose());

function run(argv: string[], cg: WorkerCgroup): Promise<{ status: ExitStatus; out: string }> {
  const p = new LocalProcess(withCgroup(argv, cg), { PATH: process.env.PATH ?? "/usr/bin:/bin" }, root, cg);
  let out = "";
  p.stdout.on("data", (d: Buffer) => (out += d.toString()));
  return new Promise((resolve) => p.onExit((status) => p.onClose(() => resolve({ status, out }))));
}

describe("this machine's cgroups", () => {
  test.skipIf(!real?.hasMemory && !required)("a process beyond its memory limit is killed by the cgroup's OOM killer, not an rlimit", async () => {
    expect(real?.hasMemory, `no writable memory cgroup here: ${JSON.stringify(detectCgroups().details)}`).toBe(true);
    const cg = real!.create({ memoryMb: 128, maxProcesses: 64, cpus: 1 });
    try {
      // Prints its data rlimit and cgroups, then touches 8 MB buffers up to 1.5 GB (far past 128 MB).
      const script = [
        "const fs = require('fs');",
        "console.log(fs.readFileSync('/proc/self/limits', 'utf8').match(/^Max data size.*$/m)[0]);",
        "console.log(fs.readFileSync('/proc/self/cgroup', 'utf8').trim().split('\\n').join(' '));",
        "const a = []; for (let i = 0; i < 192; i++) a.push(Buffer.alloc(8 << 20, 1));",
        "console.log('survived');",
      ].join("\n");
      const { status, out } = await run([process.execPath, "-e", script], cg);
      // No rlimit: the data size was unlimited, so nothing but the cgroup could stop it.
      expect(out).toMatch(/^Max data size\s+unlimited\s+unlimited/m);
      expect(out).toContain(`/kiln-${process.pid}-test${process.pid}/w`);
      expect(out).not.toContain("survived");
      expect(status.signal).toBe("SIGKILL");
      expect(status.oomKilled).toBe(true);
      expect(cg.oomKills()).toBeGreaterThanOrEqual(1);
    } finally {
      cg.killAll();
      await cg.remove();
    }
  }, 60_000);

  test.skipIf(!real?.hasCpu && !required)("a CPU limit holds a busy process to its share", async () => {
    expect(real?.hasCpu, `no writable cpu cgroup here: ${JSON.stringify(detectCgroups().details)}`).toBe(true);
    const cg = real!.create({ memoryMb: 256, maxProcesses: 64, cpus: 0.2 });
    try {
      const script = "const end = Date.now() + 1500; while (Date.now() < end) {} const u = process.cpuUsage(); console.log((u.user + u.system) / 1e6);";
      const { status, out } = await run([process.execPath, "-e", script], cg);
      expect(status.code).toBe(0);
      // Unlimited it would use ~1.5 s of CPU (plus start-up); at 0.2 CPU about 0.3 s.
      expect(Number(out.trim())).toBeLessThan(0.75);
    } finally {
      await cg.remove();
    }
  }, 30_000);

  test.skipIf(!real?.hasMemory && !required)("a pool's worker past its memory limit is an OOM kill by the cgroup (no RLIMIT_DATA)", async () => {
    const logs: string[] = [];
    const pool = new WorkerPool({ log: (m) => logs.push(m) });
    try {
      const codeDir = join(root, "hog");
      mkdirSync(codeDir);
      // Buffers live outside V8's heap: its own flag cannot stop them, only the cgroup (or RLIMIT_DATA).
      writeFileSync(join(codeDir, "index.js"), "exports.handler = async () => { const a = []; for (;;) a.push(Buffer.alloc(8 << 20, 1)); };");
      const v = { key: "hog:d1:local", functionName: "hog", region: "local", runtime: "nodejs22.x", codeDir, entry: "index.js", handler: "handler", env: {}, limits: { memoryMb: 128, timeoutMs: 30_000 }, network: false };
      const e = await pool.invoke(v, null, { invocationId: "inv-hog" }).then(
        () => null,
        (x: FunctionError) => x,
      );
      expect(e?.kind).toBe("out_of_memory");
      // Under RLIMIT_DATA node would have thrown "Array buffer allocation failed"; the OOM killer is silent.
      expect(e?.logs.map((l) => l.message).join("\n")).not.toContain("Array buffer allocation failed");
      expect(logs.find((l) => l.startsWith("function limits:"))).toMatch(/memory by cgroup v[12]/);
    } finally {
      await pool.close();
    }
  }, 300_000);

  test("kiln doctor's detection agrees with what a pool gets here", () => {
    const s = detectCgroups();
    expect(real?.by ?? { memory: null, pids: null, cpu: null }).toEqual(s.by);
    if (required && process.getuid?.() === 0) expect(s.by.memory).not.toBe(null);
  });
});
