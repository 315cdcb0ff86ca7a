import postgres from "postgres";
import { newId } from "../ids";
import type { ControlStore } from "../store/store";
import type { StoredLine } from "../backends/logs/log-store";

/** The channel on which instances say which lines they wrote for projects tailed elsewhere. */
export const LINES_CHANNEL = "kiln_log_lines";
/** NOTIFY payloads must stay under PostgreSQL's 8000 bytes. */
const MAX_PAYLOAD_BYTES = 7_000;
/** A registration not refreshed for this long is another instance's that stopped without saying so. */
const TAIL_TTL_SECONDS = 60;
/** Registrations are refreshed this often (wall time: how instances meet, not a rule). */
const REFRESH_MS = 15_000;

/** One NOTIFY: segments of one project that one instance wrote. */
interface Announcement {
  /** The writing instance. */
  i: string;
  p: string;
  s: string[];
}

/**
 * Live tails across instances (production profile). Each instance publishes the lines it ingests
 * to its own tails at once; lines ingested by another instance reach them through PostgreSQL:
 *
 * - An instance with a tail open for a project registers it in `log_tails` (refreshed every 15 s,
 *   expiring after 60 s without refresh, removed when its last tail of the project ends) and
 *   LISTENs on `kiln_log_lines`. The registration is committed before the tail's response starts.
 * - An instance that wrote a batch of lines reads, after the write, which of the batch's projects
 *   other instances tail, and for those sends NOTIFYs naming the segments written (store.ts; a
 *   segment holds up to 64 lines). Reading after the write means a line printed after a tail was
 *   registered is always announced.
 * - The listening instance reads the segments' lines from the store and offers them to its tails.
 *
 * Lines from another instance therefore arrive once that instance has written them (its ingest
 * writes every second), not at once like local lines. Nothing is sent while no instance tails.
 */
export class LogFanout {
  readonly instanceId = newId();
  private listener: postgres.Sql | null = null;
  private listening: Promise<void> | null = null;
  /** Projects this instance has registered (it has tails of them). */
  private readonly registered = new Set<string>();
  /** Registry writes in order, so a registration and an unregistration of one project never cross. */
  private registry: Promise<unknown> = Promise.resolve();
  /** Announced lines are read and published in the order they were announced. */
  private reading: Promise<unknown> = Promise.resolve();
  private refresh: ReturnType<typeof setInterval> | null = null;
  private stopped = false;

  constructor(
    private readonly d: {
      url: string;
      db: () => Promise<ControlStore>;
      /** How many tails this instance has open for a project. */
      tails: (projectId: string) => number;
      /** The lines of a project's segments, oldest first. */
      read: (projectId: string, segs: readonly string[]) => Promise<StoredLine[]>;
      publish: (lines: StoredLine[]) => void;
      warn: (m: string) => void;
    },
  ) {}

  private inOrder<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.registry.then(fn, fn);
    this.registry = run.catch(() => {});
    return run;
  }

  private listen(): Promise<void> {
    this.listening ??= (async () => {
      const sql = postgres(this.d.url, { max: 1, onnotice: () => {}, connect_timeout: 10 });
      this.listener = sql;
      await sql.listen(LINES_CHANNEL, (payload) => this.heard(payload));
    })().catch((err) => {
      this.listening = null;
      const l = this.listener;
      this.listener = null;
      void l?.end({ timeout: 1 }).catch(() => {});
      throw err;
    });
    return this.listening;
  }

  /**
   * A tail of the project is about to start: this instance listens and is registered, so every line
   * another instance writes from now on is announced to it. Failures leave the tail local-only.
   */
  async tailOpened(projectId: string): Promise<void> {
    if (this.stopped) return;
    try {
      await this.listen();
      if (!this.registered.has(projectId)) {
        this.registered.add(projectId);
        await this.inOrder(() => this.register([projectId]));
      }
      if (!this.refresh) {
        this.refresh = setInterval(() => void this.inOrder(() => this.register([...this.registered])).catch((e) => this.d.warn(`log tails: ${(e as Error).message}`)), REFRESH_MS);
        this.refresh.unref?.();
      }
    } catch (err) {
      this.d.warn(`log tail of project ${projectId}: lines written by other instances will not reach it (${(err as Error).message})`);
    }
  }

  /** The last tail of the project on this instance ended. */
  tailsEnded(projectId: string): void {
    if (!this.registered.delete(projectId)) return;
    void this.inOrder(async () => {
      // A tail opened again meanwhile keeps the registration.
      if (this.registered.has(projectId)) return;
      await (await this.d.db()).query(`delete from log_tails where instance_id = $1 and project_id = $2`, [this.instanceId, projectId]);
    }).catch((e) => this.d.warn(`log tails: ${(e as Error).message}`));
  }

  private async register(projects: string[]): Promise<void> {
    if (!projects.length || this.stopped) return;
    await (await this.d.db()).query(
      `insert into log_tails (instance_id, project_id, expires_at)
         select $1, p, now() + make_interval(secs => $3) from jsonb_array_elements_text($2::text::jsonb) as p
       on conflict (instance_id, project_id) do update set expires_at = excluded.expires_at`,
      [this.instanceId, JSON.stringify(projects), TAIL_TTL_SECONDS],
    );
  }

  /** After a batch was written (its segments by project): those of projects other instances tail are announced. */
  async written(segments: Map<string, string[]>): Promise<void> {
    if (!segments.size || this.stopped) return;
    const db = await this.d.db();
    const tailed = await db.query<{ project_id: string }>(
      `select distinct project_id from log_tails
        where project_id in (select jsonb_array_elements_text($1::text::jsonb)) and instance_id <> $2 and expires_at > now()`,
      [JSON.stringify([...segments.keys()]), this.instanceId],
    );
    if (!tailed.length) return;
    const payloads: string[] = [];
    for (const { project_id } of tailed) {
      let chunk: string[] = [];
      let bytes = 100 + project_id.length;
      const flush = () => {
        if (chunk.length) payloads.push(JSON.stringify({ i: this.instanceId, p: project_id, s: chunk } satisfies Announcement));
        chunk = [];
        bytes = 100 + project_id.length;
      };
      for (const seg of segments.get(project_id) ?? []) {
        if (bytes + seg.length + 3 > MAX_PAYLOAD_BYTES) flush();
        chunk.push(seg);
        bytes += seg.length + 3;
      }
      flush();
    }
    await db.query(`select pg_notify($1, x) from jsonb_array_elements_text($2::text::jsonb) as x`, [LINES_CHANNEL, JSON.stringify(payloads)]);
  }

  private heard(payload: string): void {
    let m: Announcement;
    try {
      m = JSON.parse(payload) as Announcement;
    } catch {
      return;
    }
    if (m.i === this.instanceId || !Array.isArray(m.s) || !m.s.length || this.d.tails(m.p) === 0) return;
    const run = this.reading.then(async () => {
      if (this.d.tails(m.p) === 0) return;
      const lines = await this.d.read(m.p, m.s);
      if (lines.length) this.d.publish(lines);
    });
    this.reading = run.catch((e) => this.d.warn(`log tails: lines announced by another instance could not be read (${(e as Error).message})`));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.refresh) clearInterval(this.refresh);
    this.refresh = null;
    const had = this.registered.size > 0 || this.listening !== null;
    this.registered.clear();
    if (had)
      await this.inOrder(async () => (await this.d.db()).query(`delete from log_tails where instance_id = $1`, [this.instanceId])).catch((e) =>
        this.d.warn(`log tails: ${(e as Error).message}`),
      );
    await this.reading;
    const l = this.listener;
    this.listener = null;
    await l?.end({ timeout: 2 }).catch(() => {});
  }
}
