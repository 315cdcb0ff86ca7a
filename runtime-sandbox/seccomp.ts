import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";

/**
 * The seccomp filter every sandboxed worker and build runs under: a classic-BPF program generated
 * here (no npm package ships one, and libseccomp would be a native dependency) and installed by a
 * small loader just before the runtime starts, after the sandbox has made its namespaces (bubblewrap's
 * own --seccomp cannot be used: a root Kiln's sandbox makes its inner user namespace after bwrap would
 * install the filter).
 *
 * It denies with EPERM what user code has no business doing and what widens the kernel's attack
 * surface: new namespaces (unshare, clone with CLONE_NEW* flags, setns), ptrace and
 * process_vm_readv/writev, the key management calls (keyctl, add_key, request_key), bpf, every mount
 * call (mount, umount2, pivot_root, the new mount API), perf_event_open, userfaultfd, kexec, kernel
 * modules, reboot, swap, acct, syslog, quotactl, open_by_handle_at. clone3 and io_uring answer ENOSYS:
 * clone3's flags sit in memory BPF cannot read, so libc falls back to clone, whose flags it can; libuv
 * falls back from io_uring to its thread pool. Another architecture's system calls (i386 or x32 on
 * x86_64) kill the process: they would bypass the table.
 */

// Classic BPF opcodes (linux/filter.h) and seccomp's return values (linux/seccomp.h).
const LD_W_ABS = 0x20;
const JEQ_K = 0x15;
const JGE_K = 0x35;
const JSET_K = 0x45;
const RET_K = 0x06;
const RET_ALLOW = 0x7fff0000;
const RET_ERRNO = 0x00050000;
const RET_KILL_PROCESS = 0x80000000;
const EPERM = 1;
const ENOSYS = 38;
// struct seccomp_data: nr at 0, arch at 4, args[] from 16 (the low word of args[0] on little-endian).
const OFF_NR = 0;
const OFF_ARCH = 4;
const OFF_ARG0_LO = 16;

// CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET; unshare also takes NEWTIME
// (0x80, which in clone's flags is part of the exit signal).
const CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000;
const CLONE_NEWTIME = 0x80;

const DENIED = [
  "setns",
  "ptrace",
  "process_vm_readv",
  "process_vm_writev",
  "keyctl",
  "add_key",
  "request_key",
  "bpf",
  "mount",
  "umount2",
  "pivot_root",
  "move_mount",
  "open_tree",
  "fsopen",
  "fsconfig",
  "fsmount",
  "fspick",
  "mount_setattr",
  "perf_event_open",
  "userfaultfd",
  "kexec_load",
  "kexec_file_load",
  "init_module",
  "finit_module",
  "delete_module",
  "reboot",
  "swapon",
  "swapoff",
  "acct",
  "syslog",
  "quotactl",
  "open_by_handle_at",
  "lookup_dcookie",
] as const;
const NOT_THERE = ["clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"] as const;
type Syscall = (typeof DENIED)[number] | (typeof NOT_THERE)[number] | "clone" | "unshare" | "prctl" | "seccomp";

interface ArchTable {
  /** AUDIT_ARCH_* as seccomp_data.arch reports it. */
  audit: number;
  /** Numbers at or above this are another ABI sharing the arch (x32 on x86_64). */
  foreignFrom?: number;
  nr: Record<Syscall, number>;
}

// From asm/unistd_64.h (x86_64) and asm-generic/unistd.h (aarch64).
const TABLES: Record<string, ArchTable> = {
  x64: {
    audit: 0xc000003e,
    foreignFrom: 0x40000000,
    nr: {
      setns: 308, ptrace: 101, process_vm_readv: 310, process_vm_writev: 311, keyctl: 250, add_key: 248, request_key: 249, bpf: 321,
      mount: 165, umount2: 166, pivot_root: 155, move_mount: 429, open_tree: 428, fsopen: 430, fsconfig: 431, fsmount: 432, fspick: 433,
      mount_setattr: 442, perf_event_open: 298, userfaultfd: 323, kexec_load: 246, kexec_file_load: 320, init_module: 175,
      finit_module: 313, delete_module: 176, reboot: 169, swapon: 167, swapoff: 168, acct: 163, syslog: 103, quotactl: 179,
      open_by_handle_at: 304, lookup_dcookie: 212, clone3: 435, io_uring_setup: 425, io_uring_enter: 426, io_uring_register: 427,
      clone: 56, unshare: 272, prctl: 157, seccomp: 317,
    },
  },
  arm64: {
    audit: 0xc00000b7,
    nr: {
      setns: 268, ptrace: 117, process_vm_readv: 270, process_vm_writev: 271, keyctl: 219, add_key: 217, request_key: 218, bpf: 280,
      mount: 40, umount2: 39, pivot_root: 41, move_mount: 429, open_tree: 428, fsopen: 430, fsconfig: 431, fsmount: 432, fspick: 433,
      mount_setattr: 442, perf_event_open: 241, userfaultfd: 282, kexec_load: 104, kexec_file_load: 294, init_module: 105,
      finit_module: 273, delete_module: 106, reboot: 142, swapon: 224, swapoff: 225, acct: 89, syslog: 116, quotactl: 60,
      open_by_handle_at: 265, lookup_dcookie: 18, clone3: 435, io_uring_setup: 425, io_uring_enter: 426, io_uring_register: 427,
      clone: 220, unshare: 97, prctl: 167, seccomp: 277,
    },
  },
};

type Insn = { code: number; jt: number | string; jf: number | string; k: number } | { label: string };

/** The filter for `arch` (Node's process.arch names) as struct sock_filter[] bytes, or null for an architecture without a table. */
export function seccompProgram(arch: string = process.arch): Buffer | null {
  const t = TABLES[arch];
  if (!t) return null;
  const p: Insn[] = [];
  const stmt = (code: number, k: number) => p.push({ code, jt: 0, jf: 0, k });
  const jump = (code: number, k: number, jt: number | string, jf: number | string) => p.push({ code, jt, jf, k });
  stmt(LD_W_ABS, OFF_ARCH);
  jump(JEQ_K, t.audit, 0, "kill");
  stmt(LD_W_ABS, OFF_NR);
  if (t.foreignFrom) jump(JGE_K, t.foreignFrom, "kill", 0);
  for (const s of DENIED) jump(JEQ_K, t.nr[s], "eperm", 0);
  for (const s of NOT_THERE) jump(JEQ_K, t.nr[s], "enosys", 0);
  jump(JEQ_K, t.nr.clone, "clone", 0);
  jump(JEQ_K, t.nr.unshare, "unshare", 0);
  stmt(RET_K, RET_ALLOW);
  p.push({ label: "clone" });
  stmt(LD_W_ABS, OFF_ARG0_LO);
  jump(JSET_K, CLONE_NEW_ANY, "eperm", 0);
  stmt(RET_K, RET_ALLOW);
  p.push({ label: "unshare" });
  stmt(LD_W_ABS, OFF_ARG0_LO);
  jump(JSET_K, CLONE_NEW_ANY | CLONE_NEWTIME, "eperm", 0);
  stmt(RET_K, RET_ALLOW);
  p.push({ label: "eperm" });
  stmt(RET_K, RET_ERRNO | EPERM);
  p.push({ label: "enosys" });
  stmt(RET_K, RET_ERRNO | ENOSYS);
  p.push({ label: "kill" });
  stmt(RET_K, RET_KILL_PROCESS);

  // Labels to instruction indexes; a jump's offset counts from the instruction after it.
  const at = new Map<string, number>();
  const code: Array<{ code: number; jt: number | string; jf: number | string; k: number }> = [];
  for (const i of p) {
    if ("label" in i) at.set(i.label, code.length);
    else code.push(i);
  }
  const buf = Buffer.alloc(code.length * 8);
  code.forEach((i, n) => {
    const off = (x: number | string) => {
      if (typeof x === "number") return x;
      const d = at.get(x)! - n - 1;
      if (d < 0 || d > 255) throw new Error(`seccomp: jump to ${x} out of range (${d})`);
      return d;
    };
    buf.writeUInt16LE(i.code, n * 8);
    buf.writeUInt8(off(i.jt), n * 8 + 2);
    buf.writeUInt8(off(i.jf), n * 8 + 3);
    buf.writeUInt32LE(i.k >>> 0, n * 8 + 4);
  });
  return buf;
}

/** The system calls the filter refuses (EPERM), for docs and doctor. */
export const SECCOMP_DENIED: readonly string[] = [...DENIED, "unshare/clone with CLONE_NEW*"];

// The loader: Perl (perl-base is part of every Debian and Ubuntu install; Fedora and Arch have it
// with git) sets no_new_privs, installs the filter through the seccomp system call, and execs the
// command. Perl runs single-threaded, so the filter covers the whole process, and it needs none of
// its modules. Arguments: the system call numbers (SETUP_CALLS order), the program in hex, then the
// command.
//
// In the namespaces sandbox it also finishes the sandbox first, in this one process instead of a
// dozen (ln, ip, pivot_root, umount, mount, setpriv, unshare: each start costs milliseconds):
// namespace-sandbox.sh hands it KILN_SANDBOX_SETUP, lines of `key value` (removed from the
// environment before the command starts):
//   root R          the prepared root (its mounts done): links made, pivoted into, the old root gone,
//                   the new one remounted read-only
//   rootlinks T...  links at the root: /basename(T) -> T (bin -> usr/bin ...)
//   devlinks        /dev/fd, /dev/stdin, /dev/stdout, /dev/stderr
//   lo              the private network namespace's loopback brought up (SIOCSIFFLAGS)
//   chdir D         the command's working directory
//   drop UID GID    a root Kiln's sandbox: empty capability bounding set, no groups, that uid/gid
//   map U           a nested user namespace in which the command is uid/gid U
// with, in every case, no inheritable (nor so ambient) capabilities left: what setpriv
// --inh-caps=-all [--bounding-set=-all --reuid --regid --clear-groups] and unshare --user --map-user
// did before.
const SETUP_CALLS = ["prctl", "seccomp", "pivot_root", "umount2", "mount", "unshare", "setgroups", "setresuid", "setresgid", "capget", "capset"] as const;
const SETUP_NR: Record<string, Record<(typeof SETUP_CALLS)[number], number>> = {
  x64: { prctl: 157, seccomp: 317, pivot_root: 155, umount2: 166, mount: 165, unshare: 272, setgroups: 116, setresuid: 117, setresgid: 119, capget: 125, capset: 126 },
  arm64: { prctl: 167, seccomp: 277, pivot_root: 41, umount2: 39, mount: 40, unshare: 97, setgroups: 159, setresuid: 147, setresgid: 149, capget: 90, capset: 91 },
};
const LOADER = String.raw`
my ($nr, $hex) = splice(@ARGV, 0, 2);
my ($prctl, $seccomp, $pivot, $umount2, $mount, $unshare, $setgroups, $setresuid, $setresgid, $capget, $capset) = split /,/, $nr;
sub fail { print STDERR "kiln sandbox: @_\n"; exit 125 }
sub put { my ($p, $v) = @_; open(my $fh, ">", $p) or fail "$p: $!"; print $fh $v or fail "$p: $!"; close $fh or fail "$p: $!" }
my $setup = delete $ENV{KILN_SANDBOX_SETUP};
if (defined $setup) {
  my %s = map { my ($k, $v) = split / /, $_, 2; ($k, $v // "") } split /\n/, $setup;
  my $r = $s{root};
  for my $t (split / /, $s{rootlinks} // "") { my ($b) = $t =~ m{([^/]+)$}; symlink($t, "$r/$b") or fail "cannot link /$b: $!" }
  if (exists $s{devlinks}) {
    my %l = (fd => "/proc/self/fd", stdin => "/proc/self/fd/0", stdout => "/proc/self/fd/1", stderr => "/proc/self/fd/2");
    for my $n (sort keys %l) { symlink($l{$n}, "$r/dev/$n") or fail "cannot link /dev/$n: $!" }
  }
  unlink "$r/.old/fstab";
  if (exists $s{lo}) {
    socket(my $sk, 2, 2, 0) or fail "socket: $!";
    my $q = pack("a16 x24", "lo");
    ioctl($sk, 0x8913, $q) or fail "cannot read the loopback's flags: $!";
    my $f = unpack("x16 s", $q);
    ioctl($sk, 0x8914, pack("a16 s x22", "lo", $f | 1)) or fail "cannot bring up the sandbox's loopback: $!";
    close $sk;
  }
  chdir $r or fail "$r: $!";
  my ($here, $put_old, $old, $slash) = (".", ".old", "/.old", "/");
  syscall($pivot + 0, $here, $put_old) == 0 or fail "pivot_root failed: $!";
  chdir "/";
  syscall($umount2 + 0, $old, 2) == 0 or fail "cannot detach the old root: $!";
  rmdir "/.old";
  syscall($mount + 0, 0, $slash, 0, 4129, 0);
  chdir $s{chdir} or fail "$s{chdir}: $!";
  if (exists $s{drop}) {
    my ($u, $g) = split / /, $s{drop};
    for my $c (0 .. 63) { syscall($prctl + 0, 24, $c, 0, 0, 0) }
    syscall($setgroups + 0, 0, 0) == 0 or fail "setgroups: $!";
    syscall($setresgid + 0, $g + 0, $g + 0, $g + 0) == 0 or fail "setresgid: $!";
    syscall($setresuid + 0, $u + 0, $u + 0, $u + 0) == 0 or fail "setresuid: $!";
    syscall($prctl + 0, 4, 1, 0, 0, 0);
  }
  my $hdr = pack("L L", 0x20080522, 0);
  my $caps = "\0" x 24;
  syscall($capget + 0, $hdr, $caps) == 0 or fail "capget: $!";
  my @c = unpack("L6", $caps);
  @c[2, 5] = (0, 0);
  $caps = pack("L6", @c);
  syscall($capset + 0, $hdr, $caps) == 0 or fail "capset: $!";
  if (exists $s{map}) {
    my ($u, $g) = ($> + 0, $) + 0);
    syscall($unshare + 0, 0x10000000) == 0 or fail "cannot make the user namespace: $!";
    put("/proc/self/setgroups", "deny");
    put("/proc/self/uid_map", "$s{map} $u 1");
    put("/proc/self/gid_map", "$s{map} $g 1");
  }
}
my $f = pack("H*", $hex);
syscall($prctl + 0, 38, 1, 0, 0, 0) == 0 or fail "no_new_privs: $!";
my $prog = pack("S x![p] P", length($f) / 8, $f);
syscall($seccomp + 0, 1, 0, $prog) == 0 or fail "seccomp: $!";
exec { $ARGV[0] } @ARGV or fail "cannot run $ARGV[0]: $!";
`.trim().replace(/\n\s*/g, " ");

export interface Seccomp {
  /** Put before the command inside the sandbox (after its namespaces are made). */
  prefix: string[];
}

let cached: Seccomp | string | undefined;

/**
 * The loader's argv prefix, or why there is none here (not Linux, no table for this architecture,
 * no Perl under /usr, a kernel without seccomp filters). Tried once, outside any sandbox.
 */
export function seccompLoader(): Seccomp | string {
  if (cached !== undefined) return cached;
  cached = findLoader();
  return cached;
}

function findLoader(): Seccomp | string {
  if (process.platform !== "linux") return "not Linux";
  const prog = seccompProgram();
  const t = TABLES[process.arch];
  if (!prog || !t) return `no system call table for ${process.arch}`;
  // Under /usr, which every sandbox mounts: the same path works inside.
  const perl = ["/usr/bin/perl"].find((p) => existsSync(p));
  if (!perl) return "perl is not installed (/usr/bin/perl loads the filter)";
  const nr = SETUP_NR[process.arch];
  if (!nr) return `no system call table for ${process.arch}`;
  const prefix = [perl, "-e", LOADER, SETUP_CALLS.map((c) => nr[c]).join(","), prog.toString("hex")];
  // The filter must be in force: `unshare --user` is refused under it.
  const r = spawnSync(prefix[0]!, [...prefix.slice(1), perl, "-e", `exit(syscall(${t.nr.unshare}, 0x10000000) == -1 && $! == 1 ? 0 : 3)`], {
    stdio: ["ignore", "ignore", "pipe"],
    env: {},
    timeout: 10_000,
  });
  if (r.status !== 0) return `the filter could not be installed (${String(r.stderr ?? "").trim().split("\n").pop() || (r.error?.message ?? `exit ${r.status ?? r.signal}`)})`;
  return { prefix };
}

/** Test hook. */
export function resetSeccompProbe(): void {
  cached = undefined;
}
