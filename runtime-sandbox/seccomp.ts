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
// its modules. Arguments: the prctl and seccomp numbers, the program in hex, then the command.
const LOADER = [
  "my ($prctl, $seccomp, $hex) = splice(@ARGV, 0, 3);",
  'my $f = pack("H*", $hex);',
  'syscall($prctl + 0, 38, 1, 0, 0, 0) == 0 or die "kiln sandbox: no_new_privs: $!\\n";',
  'my $prog = pack("S x![p] P", length($f) / 8, $f);',
  'syscall($seccomp + 0, 1, 0, $prog) == 0 or die "kiln sandbox: seccomp: $!\\n";',
  'exec { $ARGV[0] } @ARGV or die "kiln sandbox: cannot run $ARGV[0]: $!\\n";',
].join(" ");

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
  const prefix = [perl, "-e", LOADER, String(t.nr.prctl), String(t.nr.seccomp), prog.toString("hex")];
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
