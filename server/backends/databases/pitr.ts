import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import postgresClient from "postgres";
import type postgres from "postgres";
import { RestoreNotStarted, type ServerPointInTime } from "./engine";

type PitrStatus = ReturnType<ServerPointInTime["status"]>;
import { parseLsn } from "./wal";

/**
 * Point-in-time restore on the production engine, with nothing changed in the server's own
 * configuration (no archive_mode, no archive_command, no restart):
 *
 * - **WAL archive.** Kiln streams the server's WAL over the replication protocol into
 *   `<dir>/wal` with `pg_receivewal` (the same protocol a standby uses; wal_level replica, the
 *   default, is enough). It needs a role with REPLICATION (or a superuser) and a `replication` line in
 *   pg_hba.conf that lets it in. It runs as long as Kiln runs; restarted when it exits.
 * - **Base backups.** `pg_basebackup` of the whole server (plain format, its own WAL streamed along)
 *   into `<dir>/bases/<id>`: one when archiving starts, then every `baseIntervalMs`; those older than
 *   `retentionMs` go (the newest one before that boundary stays, so the whole retention is
 *   restorable), and with them the archived WAL older than the oldest kept base.
 * - **Restore to T.** A throwaway local server (the server's major version of `postgres`, run as an
 *   unprivileged user when Kiln is root) is started on a copy of the newest base that ended before T,
 *   with the archived WAL and `recovery_target_time = T`, `recovery_target_action = promote`. PostgreSQL
 *   replays every transaction committed at or before T and none after. The one database is dumped
 *   from it (`pg_dump`), and the throwaway server is stopped and removed; the caller restores the dump
 *   in place (same connection string).
 *
 * The server's WAL is the whole cluster's: the archive and the bases hold every database on it, not
 * only Kiln's. Times here are Kiln's real clock (epoch ms); the server's clock is measured against it
 * and recovery targets are given in the server's time.
 */
export interface ServerPitrOptions {
  /** The engine's admin connection URL (a role with REPLICATION for this to work). */
  url: URL;
  /** Where the archive, the bases and the state live (`<data-dir>/database-pitr`). */
  dir: string;
  /** The server's major version: the throwaway server must be exactly it. */
  serverMajor: number;
  admin: postgres.Sql;
  /** libpq environment for a client tool (password out of argv). */
  env: (database?: string) => Record<string, string>;
  log: { error: (m: string, e?: unknown) => void; info?: (m: string) => void };
  /** A new base every this long (real time); default a day. */
  baseIntervalMs?: number;
  /** Bases (and WAL) older than this go, but the newest one before the boundary; default 7 days. */
  retentionMs?: number;
}

interface Base {
  id: string;
  /** Where recovery from it starts (the backup's START WAL LOCATION). */
  startLsn: number;
  /** Kiln's real time when the backup had ended: it restores any instant from here on. */
  endMs: number;
}

const BASE_INFO = "kiln-base.json";
const SEGMENT = /^[0-9A-F]{24}$/;

type Tools = { receivewal: string; basebackup: string; postgres: string; pgCtl: string; dump: string };

export class ServerPitr {
  private state: PitrStatus = {
    state: "unavailable",
    reason: "the WAL archive is starting",
  };
  private tools: Tools | null = null;
  private receiver: ReturnType<typeof Bun.spawn> | null = null;
  private stopped = false;
  private timers: ReturnType<typeof setInterval>[] = [];
  /** Server clock minus Kiln's (ms). */
  private skewMs = 0;
  /** Kiln real time up to which the archive is known complete. */
  private completeMs: number | null = null;
  /** Recent polls: (Kiln real time, the server's WAL insert position then). */
  private polls: { at: number; lsn: number }[] = [];
  private basing: Promise<void> | null = null;
  private readonly appName: string;
  private readonly walDir: string;
  private readonly basesDir: string;
  private readonly baseIntervalMs: number;
  private readonly retentionMs: number;
  private restarts = 0;
  /** Why pg_receivewal last failed (cleared when the archive is seen receiving). */
  private receiverError: string | null = null;

  constructor(private readonly o: ServerPitrOptions) {
    this.walDir = join(o.dir, "wal");
    this.basesDir = join(o.dir, "bases");
    this.appName = `kiln_wal_${createHash("sha256").update(o.dir).digest("hex").slice(0, 10)}`;
    this.baseIntervalMs = o.baseIntervalMs ?? 86_400_000;
    this.retentionMs = o.retentionMs ?? 7 * 86_400_000;
  }

  status(): PitrStatus {
    // Archiving that has never worked (pg_hba.conf, a password, too few WAL senders) is not "on".
    if (this.state.state === "on" && this.receiverError && this.completeMs === null)
      return { state: "unavailable", reason: `the server refuses Kiln's WAL archive: ${this.receiverError}` };
    return this.state;
  }

  /** Checks what it needs, then starts archiving (and the first base backup in the background). */
  async start(): Promise<void> {
    const why = await this.prerequisites();
    if (why) {
      this.state = { state: "unavailable", reason: why };
      return;
    }
    // An archive of another server (Kiln pointed elsewhere since) leads nowhere: start over.
    const [{ id }] = (await this.o.admin.unsafe(`select system_identifier::text as id from pg_control_system()`)) as unknown as [{ id: string }];
    const marker = join(this.o.dir, "server.json");
    const known = existsSync(marker) ? (JSON.parse(readFileSync(marker, "utf8")) as { system_identifier: string }).system_identifier : null;
    if (known !== id) {
      this.wipe();
      mkdirSync(this.o.dir, { recursive: true, mode: 0o700 });
      writeFileSync(marker, JSON.stringify({ system_identifier: id }));
    }
    mkdirSync(this.walDir, { recursive: true, mode: 0o700 });
    mkdirSync(this.basesDir, { recursive: true, mode: 0o700 });
    await this.measureSkew();
    this.state = { state: "on" };
    this.spawnReceiver();
    this.timers.push(setInterval(() => void this.poll().catch(() => {}), 1000));
    this.timers.push(setInterval(() => void this.housekeeping().catch((e) => this.o.log.error("point-in-time archive housekeeping", e)), 60_000));
    for (const t of this.timers) t.unref?.();
    void this.housekeeping().catch((e) => this.o.log.error("point-in-time archive housekeeping", e));
  }

  private async prerequisites(): Promise<string | null> {
    try {
      this.tools = this.findTools();
    } catch (err) {
      return (err as Error).message;
    }
    const [r] = (await this.o.admin.unsafe(
      `select (select rolreplication or rolsuper from pg_roles where rolname = current_user) as repl,
              current_setting('wal_level') as wal_level, current_setting('max_wal_senders')::int as senders`,
    )) as unknown as [{ repl: boolean; wal_level: string; senders: number }];
    if (!r.repl)
      return `the role Kiln connects as (${decodeURIComponent(this.o.url.username)}) lacks REPLICATION: Kiln archives the server's WAL over the replication protocol (alter role ... replication)`;
    if (r.wal_level === "minimal") return "the server runs with wal_level = minimal, which cannot be archived (the default, replica, can)";
    if (r.senders < 3)
      return `the server allows ${r.senders} replication connection${r.senders === 1 ? "" : "s"} (max_wal_senders); Kiln needs 3: pg_receivewal, and pg_basebackup's two`;
    return null;
  }

  /**
   * pg_receivewal and pg_basebackup of the server's major version or newer, postgres and pg_ctl of
   * exactly it: from `KILN_PG_BIN` when set (only there), else Debian's /usr/lib/postgresql/<v>/bin.
   */
  private findTools(): Tools {
    const major = this.o.serverMajor;
    const has = (dir: string, names: string[]) => names.every((n) => existsSync(join(dir, n)));
    const only = process.env.KILN_PG_BIN;
    const dirs = only
      ? [only]
      : existsSync("/usr/lib/postgresql")
        ? readdirSync("/usr/lib/postgresql")
            .filter((v) => /^\d+$/.test(v) && Number(v) >= major)
            .sort((a, b) => Number(a) - Number(b))
            .map((v) => join("/usr/lib/postgresql", v, "bin"))
        : [];
    const client = dirs.find((d) => has(d, ["pg_receivewal", "pg_basebackup", "pg_dump"]));
    const server = only ? (has(only, ["postgres", "pg_ctl"]) ? only : undefined) : [join("/usr/lib/postgresql", String(major), "bin")].find((d) => has(d, ["postgres", "pg_ctl"]));
    const where = only ? `in KILN_PG_BIN (${only})` : "on this machine";
    if (!client) throw new Error(`point-in-time restore needs pg_receivewal, pg_basebackup and pg_dump ${major} or newer ${where} (apt-get install postgresql-client-${major})`);
    if (!server) throw new Error(`point-in-time restore needs the PostgreSQL ${major} server (postgres, pg_ctl) ${where} to recover a copy of the server into (apt-get install postgresql-${major})`);
    return {
      receivewal: join(client, "pg_receivewal"),
      basebackup: join(client, "pg_basebackup"),
      dump: join(client, "pg_dump"),
      postgres: join(server, "postgres"),
      pgCtl: join(server, "pg_ctl"),
    };
  }

  private async measureSkew(): Promise<void> {
    const t0 = Date.now();
    const [r] = (await this.o.admin.unsafe(`select (extract(epoch from clock_timestamp()) * 1000)::float8 as at`)) as unknown as [{ at: number }];
    const t1 = Date.now();
    this.skewMs = Number(r.at) - (t0 + t1) / 2;
  }

  // ---- the archive --------------------------------------------------------------------------------

  /** A pg_receivewal a killed Kiln left running would write the same archive: it goes first. */
  private endOrphan(): void {
    const file = join(this.o.dir, "receiver.pid");
    try {
      const pid = Number(readFileSync(file, "utf8"));
      if (pid > 0 && readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(this.walDir)) {
        process.kill(pid, "SIGTERM");
        for (let i = 0; i < 40 && existsSync(`/proc/${pid}`); i++) Bun.sleepSync(50);
      }
    } catch {
      // none, or gone
    }
  }

  private spawnReceiver(): void {
    if (this.stopped) return;
    this.endOrphan();
    const proc = Bun.spawn([this.tools!.receivewal, "-D", this.walDir, "--no-loop", "--no-password", "--status-interval=1"], {
      env: { ...this.o.env(), PGAPPNAME: this.appName },
      stdin: "ignore",
      stdout: "ignore",
      stderr: "pipe",
    });
    this.receiver = proc;
    writeFileSync(join(this.o.dir, "receiver.pid"), String(proc.pid));
    const stderr = new Response(proc.stderr as ReadableStream).text();
    void proc.exited.then(async (code) => {
      if (this.receiver === proc) this.receiver = null;
      if (this.stopped) return;
      const err = (await stderr).trim();
      // The server no longer has the WAL that follows the archive (Kiln was away too long): what the
      // archive holds can no longer lead to the present. It starts over, with a new base.
      if (/has already been removed|is not present in|not in the server's history/i.test(err)) {
        this.o.log.error(`point-in-time archive: the server no longer holds the WAL after the archive (${err.slice(0, 300)}); starting over with a new base backup`);
        this.wipe();
        mkdirSync(this.walDir, { recursive: true, mode: 0o700 });
        mkdirSync(this.basesDir, { recursive: true, mode: 0o700 });
        this.completeMs = null;
        this.polls = [];
        void this.housekeeping().catch(() => {});
      } else if (code !== 0) {
        this.o.log.error(`point-in-time archive: pg_receivewal exited (${code}): ${err.slice(0, 500)}`);
        this.receiverError = err.replace(/^pg_receivewal: (error: )?/, "").split("\n")[0]!.slice(0, 300) || `pg_receivewal exited with ${code}`;
      }
      this.restarts++;
      setTimeout(() => this.spawnReceiver(), Math.min(30_000, 500 * this.restarts)).unref?.();
    });
  }

  /** What pg_receivewal has written (it reports it every second), against the server's position. */
  private async poll(): Promise<void> {
    if (this.state.state !== "on") return;
    const at = Date.now();
    const [r] = (await this.o.admin.unsafe(
      `select pg_current_wal_insert_lsn()::text as cur, (select write_lsn::text from pg_stat_replication where application_name = $1 order by write_lsn desc nulls last limit 1) as w`,
      [this.appName],
    )) as unknown as [{ cur: string; w: string | null }];
    this.polls.push({ at, lsn: parseLsn(r.cur) });
    if (this.polls.length > 120) this.polls.shift();
    if (r.w === null) return;
    this.receiverError = null;
    const written = parseLsn(r.w);
    // The newest poll whose position the archive has reached: everything written before it is archived.
    for (let i = this.polls.length - 1; i >= 0; i--)
      if (this.polls[i]!.lsn <= written) {
        this.completeMs = Math.max(this.completeMs ?? 0, this.polls[i]!.at);
        if (this.restarts > 0 && i === this.polls.length - 1) this.restarts = 0;
        break;
      }
  }

  /** Waits until the archive holds the server's WAL up to `lsn`. */
  private async waitArchived(lsn: number, timeoutMs: number): Promise<void> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const [r] = (await this.o.admin.unsafe(
        `select (select write_lsn::text from pg_stat_replication where application_name = $1 order by write_lsn desc nulls last limit 1) as w`,
        [this.appName],
      )) as unknown as [{ w: string | null }];
      if (r.w !== null && parseLsn(r.w) >= lsn) return;
      if (Date.now() > end) throw new Error(`the WAL archive has not caught up with the server in ${timeoutMs / 1000} s (pg_receivewal ${this.receiver ? "runs" : "is not running"})`);
      await Bun.sleep(200);
    }
  }

  // ---- base backups -------------------------------------------------------------------------------

  private bases(): Base[] {
    if (!existsSync(this.basesDir)) return [];
    const out: Base[] = [];
    for (const id of readdirSync(this.basesDir)) {
      try {
        out.push(JSON.parse(readFileSync(join(this.basesDir, id, BASE_INFO), "utf8")) as Base);
      } catch {
        // a base still being taken, or a broken one
      }
    }
    return out.sort((a, b) => a.endMs - b.endMs);
  }

  /** Takes a base when there is none or the newest is older than the interval; drops what retention no longer needs. */
  private housekeeping(): Promise<void> {
    this.basing ??= (async () => {
      try {
        if (this.state.state !== "on") return;
        const newest = this.bases().pop();
        if (!newest || Date.now() - newest.endMs >= this.baseIntervalMs) {
          // The archive must already be receiving: the base's own WAL ends where the archive has to go on.
          for (let i = 0; i < 300 && this.completeMs === null; i++) await Bun.sleep(100);
          await this.takeBase();
        }
        this.prune();
      } finally {
        this.basing = null;
      }
    })();
    return this.basing;
  }

  private async takeBase(): Promise<void> {
    const id = `${new Date().toISOString().replace(/[-:.]/g, "")}`;
    const tmp = join(this.basesDir, `${id}.partial`);
    rmSync(tmp, { recursive: true, force: true });
    const proc = Bun.spawn([this.tools!.basebackup, "-D", tmp, "-Fp", "-X", "stream", "-c", "fast", "--no-password", "-l", `kiln ${id}`], {
      env: { ...this.o.env(), PGAPPNAME: `${this.appName}_base` },
      stdin: "ignore",
      stdout: "ignore",
      stderr: "pipe",
    });
    const [code, err] = await Promise.all([proc.exited, new Response(proc.stderr).text()]);
    if (code !== 0) {
      rmSync(tmp, { recursive: true, force: true });
      throw new Error(`pg_basebackup failed (${code}): ${err.trim().slice(0, 1000)}`);
    }
    const label = readFileSync(join(tmp, "backup_label"), "utf8");
    const start = /START WAL LOCATION: (\S+)/.exec(label);
    if (!start) throw new Error("pg_basebackup wrote no START WAL LOCATION");
    const base: Base = { id, startLsn: parseLsn(start[1]!), endMs: Date.now() };
    writeFileSync(join(tmp, BASE_INFO), JSON.stringify(base));
    renameSync(tmp, join(this.basesDir, id));
  }

  /** Bases past retention go (the newest of them stays), and the WAL older than the oldest kept base. */
  private prune(): void {
    const bases = this.bases();
    const cutoff = Date.now() - this.retentionMs;
    const old = bases.filter((b) => b.endMs < cutoff);
    for (const b of old.slice(0, -1)) rmSync(join(this.basesDir, b.id), { recursive: true, force: true });
    const kept = this.bases();
    if (kept.length === 0) return;
    const keepFrom = Math.min(...kept.map((b) => b.startLsn));
    for (const f of readdirSync(this.walDir)) {
      const name = f.replace(/\.partial$/, "");
      if (!SEGMENT.test(name) || f.endsWith(".partial")) continue;
      if (segmentEnd(name) <= keepFrom) rmSync(join(this.walDir, f), { force: true });
    }
  }

  private wipe(): void {
    rmSync(this.walDir, { recursive: true, force: true });
    rmSync(this.basesDir, { recursive: true, force: true });
  }

  // ---- what can be restored -----------------------------------------------------------------------

  range(): { earliestMs: number; latestMs: number } | null {
    if (this.state.state !== "on") return null;
    const [oldest] = this.bases();
    if (!oldest || this.completeMs === null || this.completeMs < oldest.endMs) return null;
    return { earliestMs: oldest.endMs, latestMs: this.completeMs };
  }

  /**
   * Recovers a throwaway copy of the server to real instant `atMs`, dumps `database` from it, and hands
   * the dump to `restoreDump` (the engine's in-place restore, which keeps what it replaces at `keepAt`).
   */
  async restoreTo(database: string, atMs: number, keepAt: string | undefined, restoreDump: (dumpPath: string, keepAt?: string) => Promise<number | null>): Promise<number | null> {
    const status = this.status();
    if (status.state !== "on") throw new RestoreNotStarted(`point-in-time restore is unavailable: ${status.reason}`);
    const base = this.bases()
      .filter((b) => b.endMs <= atMs)
      .pop();
    if (!base) throw new RestoreNotStarted("no base backup ends before that instant any more");
    const work = mkdtempSync(join(tmpdir(), "kiln-pitr-"));
    const data = join(work, "data");
    const runAs = runner();
    let started = false;
    try {
      // A commit after the instant, archived: recovery needs one to know where the instant ends (it
      // refuses to stop at the end of the WAL short of its target).
      const [m] = (await this.o.admin.begin(async (tx) => {
        await tx.unsafe(`select pg_current_xact_id()`);
        return tx.unsafe(`select pg_current_wal_insert_lsn()::text as lsn`);
      })) as unknown as [{ lsn: string }];
      await this.waitArchived(parseLsn(m.lsn), 60_000);
      // The base, and the archived WAL from its start (the segment being received under its own name).
      await run(["cp", "-R", "--reflink=auto", join(this.basesDir, base.id), data]);
      rmSync(join(data, BASE_INFO), { force: true });
      const startName = segmentOf(base.startLsn);
      for (const f of readdirSync(this.walDir)) {
        const name = f.replace(/\.partial$/, "");
        if (f.endsWith(".history")) copyFileSync(join(this.walDir, f), join(data, "pg_wal", f));
        else if (SEGMENT.test(name) && name.slice(8) >= startName) copyFileSync(join(this.walDir, f), join(data, "pg_wal", name));
      }
      for (const f of ["postmaster.pid", "standby.signal", "postgresql.auto.conf"]) rmSync(join(data, f), { force: true });
      // PostgreSQL's own form ('2026-01-02 03:04:05.678+00'): its check refuses ISO 8601's T and Z.
      const target = new Date(atMs + this.skewMs).toISOString().replace("T", " ").replace("Z", "+00");
      writeFileSync(
        join(data, "postgresql.conf"),
        [
          `listen_addresses = ''`,
          `port = 5432`,
          `unix_socket_directories = '${work}'`,
          `max_connections = 20`,
          `shared_buffers = 32MB`,
          `fsync = off`,
          `hot_standby = off`,
          `archive_mode = off`,
          `max_wal_senders = 0`,
          `shared_preload_libraries = ''`,
          `restore_command = 'false'`,
          `recovery_target_time = '${target}'`,
          `recovery_target_inclusive = on`,
          `recovery_target_timeline = 'latest'`,
          `recovery_target_action = 'promote'`,
          "",
        ].join("\n"),
      );
      writeFileSync(join(data, "postgresql.auto.conf"), "");
      writeFileSync(join(data, "pg_hba.conf"), "local all all trust\n");
      writeFileSync(join(data, "pg_ident.conf"), "");
      writeFileSync(join(data, "recovery.signal"), "");
      if (runAs) await run(["chown", "-R", `${runAs.uid}:${runAs.gid}`, work]);
      await run(["chmod", "700", data]);
      const failed = (why: string) => {
        let tail = "";
        try {
          tail = readFileSync(join(work, "server.log"), "utf8")
            .split("\n")
            .filter((l) => /FATAL|PANIC|ERROR|LOG: +(invalid|parameter|unrecognized|syntax)/.test(l))
            .slice(-4)
            .join(" | ");
        } catch {}
        return new Error(`recovering a copy of the server to ${target} failed: ${tail || why}`);
      };
      started = true;
      await run([...(runAs?.prefix ?? []), this.tools!.pgCtl, "start", "-D", data, "-l", join(work, "server.log"), "-W", "-s"], { cwd: work }).catch((err) => {
        throw failed((err as Error).message);
      });
      // With hot standby off it accepts connections once recovery reached the instant and promoted.
      await this.waitPromoted(work, data, failed);
      const dump = join(work, "dump");
      await run([this.tools!.dump, "--format=custom", "--compress=0", "--file", dump, "--host", work, "--port", "5432", "--username", decodeURIComponent(this.o.url.username), database], {
        env: { ...this.o.env(), PGHOST: work, PGPORT: "5432", PGPASSWORD: "" },
      }).catch((err) => {
        throw new Error(`the database did not exist at that instant, or could not be read from the recovered copy: ${(err as Error).message}`);
      });
      await this.stopServer(data, work, runAs);
      started = false;
      // The swap: as a restore from a backup (the database is untouched until it succeeds).
      return await restoreDump(dump, keepAt);
    } catch (err) {
      if (err instanceof RestoreNotStarted) throw err;
      throw new RestoreNotStarted((err as Error).message);
    } finally {
      if (started) await this.stopServer(data, work, runAs).catch(() => {});
      rmSync(work, { recursive: true, force: true });
    }
  }

  private async waitPromoted(work: string, data: string, failed: (why: string) => Error): Promise<void> {
    const end = Date.now() + 6 * 3_600_000;
    for (let i = 0; ; i++) {
      await Bun.sleep(Math.min(50 * (i + 1), 500));
      if (i > 5 && !existsSync(join(data, "postmaster.pid"))) throw failed("the recovering server stopped");
      const sql = postgresClient({ path: join(work, ".s.PGSQL.5432"), username: decodeURIComponent(this.o.url.username), database: "postgres", max: 1, onnotice: () => {}, connect_timeout: 5 });
      try {
        const [r] = (await sql.unsafe(`select pg_is_in_recovery() as r`)) as unknown as [{ r: boolean }];
        if (!r.r) return;
      } catch {
        // not accepting connections yet
      } finally {
        await sql.end({ timeout: 1 }).catch(() => {});
      }
      if (Date.now() > end) throw failed("recovery did not end within 6 hours");
    }
  }

  private async stopServer(data: string, work: string, runAs: ReturnType<typeof runner>): Promise<void> {
    if (!existsSync(join(data, "postmaster.pid"))) return;
    await run([...(runAs?.prefix ?? []), this.tools!.pgCtl, "stop", "-D", data, "-m", "immediate", "-w", "-s"], { cwd: work });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const t of this.timers) clearInterval(t);
    const p = this.receiver;
    if (p) {
      p.kill("SIGTERM");
      await Promise.race([p.exited, Bun.sleep(3000)]);
    }
  }
}

/** The WAL segment file name (timeline 1 left out: compared by its last 16 characters) holding an LSN. */
function segmentOf(lsn: number, segmentBytes = 16 * 1024 * 1024): string {
  const seg = Math.floor(lsn / segmentBytes);
  const perLog = 2 ** 32 / segmentBytes;
  return `${hex8(Math.floor(seg / perLog))}${hex8(seg % perLog)}`;
}

/** The LSN just past a segment file (16 MB segments, the default and what pg_receivewal names by). */
function segmentEnd(name: string, segmentBytes = 16 * 1024 * 1024): number {
  const log = parseInt(name.slice(8, 16), 16);
  const seg = parseInt(name.slice(16, 24), 16);
  return (log * (2 ** 32 / segmentBytes) + seg + 1) * segmentBytes;
}

function hex8(n: number): string {
  return n.toString(16).toUpperCase().padStart(8, "0");
}

/** PostgreSQL refuses to run as root: a root Kiln runs the throwaway server as `postgres` (or nobody). */
function runner(): { uid: number; gid: number; prefix: string[] } | null {
  if (process.getuid?.() !== 0) return null;
  let uid = 65534;
  let gid = 65534;
  try {
    const line = readFileSync("/etc/passwd", "utf8")
      .split("\n")
      .find((l) => l.startsWith("postgres:"));
    if (line) {
      const f = line.split(":");
      uid = Number(f[2]);
      gid = Number(f[3]);
    }
  } catch {}
  return { uid, gid, prefix: ["setpriv", `--reuid=${uid}`, `--regid=${gid}`, "--clear-groups", "--"] };
}

async function run(cmd: string[], opts: { cwd?: string; env?: Record<string, string> } = {}): Promise<void> {
  const proc = Bun.spawn(cmd, { cwd: opts.cwd, env: opts.env ?? (process.env as Record<string, string>), stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const [code, out, err] = await Promise.all([proc.exited, new Response(proc.stdout).text(), new Response(proc.stderr).text()]);
  if (code !== 0) throw new Error(`${cmd.find((c) => c.startsWith("/")) ?? cmd[0]} failed (${code}): ${(err || out).trim().slice(0, 1000)}`);
}
