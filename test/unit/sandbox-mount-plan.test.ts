// The mount plan as both sandboxes apply it (namespace-sandbox.sh batches it into a few mount --all
// runs; bubblewrap takes it word by word): paths with spaces, a file bind, links at the root and deeper,
// a cover over a directory and over a file inside a read-only bind, /dev and /tmp. What the command
// sees must be the same under each.
import { spawnSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import { chooseIsolation } from "../../runtime-sandbox/isolation";
import { systemMountList, type Mount } from "../../runtime-sandbox/mounts";
import { sandboxEnv } from "../../runtime-sandbox/sandbox";

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

// Where the seccomp loader (Perl) exists it also finishes the namespaces sandbox (links, loopback,
// pivot_root, the drop to the sandbox uid, the nested user namespace) in one process instead of the
// util-linux tools' ten: what the command finds must be the same either way, down to mountinfo.
const nsIso = chooseIsolation({ want: "namespaces", allowUnsandboxed: false }).isolation;
const PROBE = [
    'open my $m, "<", "/proc/self/mountinfo"; for (<$m>) { my @f = split / /; my ($i) = grep { $f[$_] eq "-" } 0 .. $#f; print join(" ", @f[4, 5], @f[$i + 1, $i + 3]) }',
    'open my $s, "<", "/proc/self/status"; print grep { /^(Uid|Gid|Groups|Cap|NoNewPrivs|Seccomp)/ } <$s>;',
    'for my $f ("uid_map", "gid_map", "setgroups") { open my $h, "<", "/proc/self/$f"; print "$f: ", <$h> }',
    'use Cwd; print "cwd ", getcwd(), "\\n";',
    'for my $d ("/", "/dev") { opendir my $dh, $d; for (sort grep { !/^\\.\\.?$/ } readdir $dh) { my @st = lstat "$d/$_"; printf "%s/%s %o %d %d %s\\n", $d, $_, $st[2], $st[4], $st[5], (-l "$d/$_" ? readlink("$d/$_") : "") } }',
    'use Socket; socket(my $k, AF_INET, SOCK_STREAM, 0); print "loopback ", (bind($k, sockaddr_in(0, inet_aton("127.0.0.1"))) ? "up" : "down: $!"), "\\n";',
    'open my $hn, "<", "/proc/sys/kernel/hostname"; print "host ", <$hn>; print "root writable ", (open(my $w, ">", "/x") ? "yes" : "no"), "\\n";',
].join("\n");

test.skipIf(nsIso?.kind !== "namespaces")("namespaces: the loader's set-up leaves what the util-linux tools left", () => {
  const probe = PROBE;
  const cmd = nsIso!.enclose({ mounts, network: false, tmpfsBytes: 1 << 20, hostname: "plan-test", chdir: "/var/task" }, ["/usr/bin/perl", "-e", probe]);
  expect(cmd.argv).toContain("--setup-by-loader");
  const run = (argv: string[]) => spawnSync(argv[0]!, argv.slice(1), { encoding: "utf8", env: { PATH: "/usr/bin:/bin" }, cwd: "/" });
  const byLoader = run(cmd.argv);
  const byTools = run(cmd.argv.filter((a) => a !== "--setup-by-loader"));
  expect(byLoader.stderr).toBe("");
  expect(byTools.stderr).toBe("");
  expect(byLoader.stdout).toContain("/var/task ro,");
  expect(byLoader.stdout).toContain("loopback up");
  expect(byLoader.stdout).toMatch(/CapEff:\s+0+\n/);
  expect(byLoader.stdout).toMatch(/Seccomp:\s+2\n/);
  expect(byLoader.stdout).toContain("/dev/stdout 120777");
  expect(byLoader.stdout).toContain("root writable no");
  expect(byLoader.stdout).toBe(byTools.stdout);
});

// A Kiln that is not root: no drop to the sandbox uid, the outer user namespace maps Kiln's uid to
// root and the loader makes the inner one (uid 1000) from there. Run as nobody, on the system mounts.
test.skipIf(nsIso?.kind !== "namespaces" || process.getuid?.() !== 0)("namespaces, Kiln not root: the loader's set-up leaves what the tools left", () => {
  const dir = mkdtempSync(join(tmpdir(), "kiln-plan-nonroot-"));
  try {
    chmodSync(dir, 0o755);
    writeFileSync(join(dir, "probe.pl"), PROBE);
    const script = join(dir, "compare.ts");
    writeFileSync(
      script,
      `import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { chooseIsolation } from ${JSON.stringify(join(import.meta.dirname, "../../runtime-sandbox/isolation"))};
import { systemMountList } from ${JSON.stringify(join(import.meta.dirname, "../../runtime-sandbox/mounts"))};
const iso = chooseIsolation({ want: "namespaces", allowUnsandboxed: false }).isolation!;
const argv = iso.enclose({ mounts: systemMountList(), network: false, tmpfsBytes: 1 << 20, hostname: "plan-test", chdir: "/tmp" }, ["/usr/bin/perl", "-e", readFileSync(${JSON.stringify(join(dir, "probe.pl"))}, "utf8")]).argv;
const run = (a: string[]) => spawnSync(a[0]!, a.slice(1), { encoding: "utf8", env: { PATH: "/usr/bin:/bin" }, cwd: "/" });
const l = run(argv), t = run(argv.filter((a) => a !== "--setup-by-loader"));
console.log(JSON.stringify({ flag: argv.includes("--setup-by-loader"), loader: l.stdout + l.stderr, tools: t.stdout + t.stderr }));
`,
    );
    const r = spawnSync("setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "--", process.execPath, script], { encoding: "utf8", env: { PATH: "/usr/bin:/bin", HOME: dir }, cwd: dir });
    expect(r.status, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout.trim().split("\n").pop()!);
    expect(out.flag).toBe(true);
    expect(out.loader).toMatch(/Uid:\s+1000\s/);
    expect(out.loader).toMatch(/uid_map:\s+1000\s+0\s+1\n/);
    expect(out.loader).toContain("loopback up");
    expect(out.loader).toMatch(/Seccomp:\s+2\n/);
    expect(out.loader).toBe(out.tools);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a function's own KILN_SANDBOX_SETUP never reaches the loader", () => {
  const env = sandboxEnv({ runtime: { kind: "node", command: "/usr/bin/node", version: "22.0.0", mounts: [] }, env: { KILN_SANDBOX_SETUP: "root /x", MINE: "1" } });
  expect(env).not.toHaveProperty("KILN_SANDBOX_SETUP");
  expect(env.MINE).toBe("1");
});
