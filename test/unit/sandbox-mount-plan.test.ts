// The mount plan as both sandboxes apply it (namespace-sandbox.sh batches it into a few mount --all
// runs; bubblewrap takes it word by word): paths with spaces, a file bind, links at the root and deeper,
// a cover over a directory and over a file inside a read-only bind, /dev and /tmp. What the command
// sees must be the same under each.
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import { chooseIsolation } from "../../runtime-sandbox/isolation";
import { systemMountList, type Mount } from "../../runtime-sandbox/mounts";

const host = mkdtempSync(join(tmpdir(), "kiln plan "));
afterAll(() => rmSync(host, { recursive: true, force: true }));
mkdirSync(join(host, "code dir", "secret dir"), { recursive: true });
writeFileSync(join(host, "code dir", "main.txt"), "main");
writeFileSync(join(host, "code dir", "secret file"), "hidden");
writeFileSync(join(host, "code dir", "secret dir", "x"), "hidden");
writeFileSync(join(host, "a file"), "one file");

const mounts: Mount[] = [
  ...systemMountList(),
  { kind: "bind", src: join(host, "a file"), dest: "/etc/a file" },
  { kind: "bind", src: join(host, "code dir"), dest: "/var/task" },
  { kind: "cover-dir", dest: "/var/task/secret dir" },
  { kind: "cover-file", dest: "/var/task/secret file" },
  { kind: "symlink", target: "/etc/a file", dest: "/opt/deep/the link" },
  { kind: "symlink", target: "/var/task/main.txt", dest: "/etc/plain-link" },
];

const SCRIPT = [
  'cat "/etc/a file" /var/task/main.txt "/opt/deep/the link" /etc/plain-link',
  'echo; ls -A "/var/task/secret dir"; (cat "/var/task/secret file" 2>/dev/null) | wc -c',
  "readlink /bin /dev/stdout; ls /dev | tr '\\n' ' '; echo",
  "echo w > /tmp/t && cat /tmp/t; (echo w > /var/task/new) 2>/dev/null || echo read-only; hostname",
].join("; ");

for (const want of ["bubblewrap", "namespaces"] as const) {
  const iso = chooseIsolation({ want, allowUnsandboxed: false }).isolation;
  test.skipIf(iso?.kind !== want)(`${want}: the plan's paths, links and covers are what the command sees`, () => {
    const cmd = iso!.enclose({ mounts, network: false, tmpfsBytes: 1 << 20, hostname: "plan-test", chdir: "/" }, ["/bin/sh", "-c", SCRIPT]);
    const r = spawnSync(cmd.argv[0]!, cmd.argv.slice(1), { encoding: "utf8", env: { PATH: "/usr/bin:/bin" }, cwd: "/" });
    expect(r.stderr).toBe("");
    expect(r.status).toBe(0);
    const lines = r.stdout.split("\n");
    expect(lines[0]).toBe("one filemainone filemain");
    // The covered directory is empty; the covered file is /dev/null (bubblewrap binds it nodev: unreadable).
    expect(lines[1]).toBe("0");
    expect(lines[2]).toBe("usr/bin");
    expect(lines[3]).toBe("/proc/self/fd/1");
    // (bubblewrap's /dev also has core, ptmx and pts.)
    expect(lines[4]!.split(" ").filter(Boolean)).toEqual(expect.arrayContaining(["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"]));
    expect(lines.slice(5, 8)).toEqual(["w", "read-only", "plan-test"]);
  });
}
