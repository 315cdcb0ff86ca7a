// Throwaway PostgreSQL server for tests (vitest globalSetup). Uses only node: APIs so it
// runs under both Bun and Node 20.
import { execFile, execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { access, constants } from "node:fs/promises";
import { appendFileSync, chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "./free-port";

export interface PgServer {
  /** postgres://kiln:PASS@127.0.0.1:PORT/postgres (superuser) */
  url: string;
  /** With `tls`: the server's self-signed certificate (for 127.0.0.1), to trust as sslrootcert. */
  certFile?: string;
  port: number;
  stop(): Promise<void>;
}

/** Directory holding initdb/pg_ctl/postgres: $KILN_PG_BIN, then the Debian layout, newest first. */
export async function findPgBin(): Promise<string | null> {
  const candidates = [process.env.KILN_PG_BIN, ...[17, 16, 15, 14].map((v) => `/usr/lib/postgresql/${v}/bin`)];
  for (const dir of candidates) {
    if (!dir) continue;
    try {
      for (const b of ["initdb", "pg_ctl", "postgres"]) await access(join(dir, b), constants.X_OK);
      return dir;
    } catch {}
  }
  return null;
}

// initdb/postgres refuse to run as root, so when root we run them as the `postgres` OS user.
const isRoot = process.getuid?.() === 0;
const hasRunuser = isRoot && (existsSync("/usr/sbin/runuser") || existsSync("/sbin/runuser"));
const shq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
function asPg(cmd: string, args: string[]): [string, string[]] {
  if (!isRoot) return [cmd, args];
  if (hasRunuser) return ["runuser", ["-u", "postgres", "--", cmd, ...args]];
  return ["su", ["postgres", "-s", "/bin/sh", "-c", [cmd, ...args].map(shq).join(" ")]];
}

// cwd = the temp dir: the postgres user may not be able to read the caller's cwd.
function run(cmd: string, args: string[], cwd: string, timeout = 60_000): Promise<string> {
  const [file, argv] = asPg(cmd, args);
  return new Promise((resolve, reject) =>
    execFile(file, argv, { cwd, timeout }, (err, stdout, stderr) =>
      err ? reject(new Error(`${cmd} ${args[0]} failed (${err.code ?? err.signal}): ${stderr || stdout}`)) : resolve(stdout),
    ),
  );
}


/**
 * `noReplication`: pg_hba.conf admits no replication connection (initdb's default admits local ones).
 * `tls`: ssl = on with a self-signed certificate for 127.0.0.1, and TCP connections without TLS refused.
 */
export async function startPgServer(opts: { bin?: string; noReplication?: boolean; tls?: boolean } = {}): Promise<PgServer> {
  const bin = opts.bin ?? (await findPgBin());
  if (!bin) throw new Error("PostgreSQL binaries not found (set KILN_PG_BIN)");
  const pgCtl = join(bin, "pg_ctl");

  // Layout: <dir>/data (cluster), <dir>/pwfile, <dir>/server.log, and <dir> doubles as socket dir.
  const dir = mkdtempSync(join(tmpdir(), "kiln-pg-"));
  const data = join(dir, "data");
  const log = join(dir, "server.log");
  const pwfile = join(dir, "pwfile");
  const password = randomBytes(12).toString("hex");
  writeFileSync(pwfile, password + "\n", { mode: 0o600 });
  writeFileSync(log, "");
  if (isRoot) {
    const uid = Number(execFileSync("id", ["-u", "postgres"]).toString().trim());
    const gid = Number(execFileSync("id", ["-g", "postgres"]).toString().trim());
    for (const p of [dir, pwfile, log]) chownSync(p, uid, gid);
  }

  let stopped = false;
  const stopSync = () => {
    if (stopped) return;
    stopped = true;
    process.removeListener("exit", stopSync);
    for (const s of signals) process.removeListener(s, onSignal);
    try {
      const [file, argv] = asPg(pgCtl, ["stop", "-D", data, "-m", "immediate", "-w"]);
      if (existsSync(join(data, "postmaster.pid"))) execFileSync(file, argv, { cwd: dir, stdio: "ignore", timeout: 30_000 });
    } catch {}
    rmSync(dir, { recursive: true, force: true });
  };
  // Kill the server if the parent exits or is interrupted; re-raise the signal only when no
  // one else (e.g. the test runner) handles it, so default termination still happens.
  const signals = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
  const onSignal = (sig: NodeJS.Signals) => {
    stopSync();
    if (process.listenerCount(sig) === 0) process.kill(process.pid, sig);
  };
  process.on("exit", stopSync);
  for (const s of signals) process.once(s, onSignal);

  try {
    await run(join(bin, "initdb"), ["-D", data, "-U", "kiln", `--pwfile=${pwfile}`, "-A", "scram-sha-256", "-E", "UTF8", "--no-locale", "--no-sync"], dir);
    const port = await freePort();
    // Durability off: test data is disposable and this makes DDL-heavy tests much faster.
    appendFileSync(join(data, "postgresql.conf"), [
      "", "listen_addresses = '127.0.0.1'", `port = ${port}`, `unix_socket_directories = '${dir}'`,
      "fsync = off", "synchronous_commit = off", "full_page_writes = off",
      "max_connections = 600", "shared_buffers = 32MB", "",
    ].join("\n"));
    let certFile: string | undefined;
    if (opts.tls) {
      certFile = join(dir, "server.crt");
      const key = join(dir, "server.key");
      execFileSync("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", certFile], { stdio: "ignore" });
      if (isRoot) {
        const uid = Number(execFileSync("id", ["-u", "postgres"]).toString().trim());
        chmodSync(key, 0o600);
        for (const f of [certFile, key]) chownSync(f, uid, uid === 0 ? 0 : Number(execFileSync("id", ["-g", "postgres"]).toString().trim()));
      }
      appendFileSync(join(data, "postgresql.conf"), ["", "ssl = on", `ssl_cert_file = '${certFile}'`, `ssl_key_file = '${key}'`, ""].join("\n"));
      const hba = join(data, "pg_hba.conf");
      // Unix sockets stay plaintext; every TCP connection needs TLS (pg_isready negotiates it: libpq's prefer).
      const lines = readFileSync(hba, "utf8").split("\n").map((l) => l.replace(/^(\s*)host(\s)/, "$1hostssl$2"));
      writeFileSync(hba, [...lines, "hostnossl all all 0.0.0.0/0 reject", "hostnossl all all ::/0 reject", ""].join("\n"));
    }
    if (opts.noReplication) {
      const hba = join(data, "pg_hba.conf");
      writeFileSync(hba, readFileSync(hba, "utf8").split("\n").filter((l) => !/^\s*(local|host)\s+replication\b/.test(l)).join("\n"));
    }
    await run(pgCtl, ["start", "-D", data, "-l", log, "-w", "-t", "30"], dir, 40_000);

    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        await run(join(bin, "pg_isready"), ["-q", "-h", "127.0.0.1", "-p", String(port)], dir, 5_000);
        break;
      } catch (e) {
        if (Date.now() > deadline) throw e;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    return {
      url: `postgres://kiln:${password}@127.0.0.1:${port}/postgres`,
      port,
      certFile,
      stop: async () => stopSync(),
    };
  } catch (e) {
    let tail = "";
    try { tail = readFileSync(log, "utf8").split("\n").slice(-30).join("\n"); } catch {}
    stopSync();
    throw new Error(`failed to start PostgreSQL: ${(e as Error).message}\n--- server log tail ---\n${tail}`);
  }
}
