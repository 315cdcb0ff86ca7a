import { api, enc } from "./api";
import { button, confirmDialog, errorBox, field, form, h, select, slot, table, when } from "./dom";

const DAYS = ["", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const FINISHED = new Set(["completed", "failed", "exhausted"]);

const bytes = (n: number | undefined) => (n === undefined ? "—" : n < 1024 * 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1024 / 1024).toFixed(1)} MiB`);
const retention = (s: number) => (s % 86400 === 0 ? `${s / 86400} d` : `${Math.round(s / 3600)} h`);
const entryText = (e: any) => `${e.frequency} at ${String(e.hour).padStart(2, "0")}:00 UTC${e.frequency === "weekly" ? ` on ${DAYS[e.day] ?? e.day}` : e.frequency === "monthly" ? ` on day ${e.day}` : ""}`;

/**
 * A database's backups (take one, delete, restore from one), the point-in-time window (restore to
 * an instant), the backup schedule (view, add an entry, clear) and the restore history with the
 * API's states, followed until the newest restore finishes.
 */
export function backupsSection(base: string): HTMLElement {
  const backups = slot();
  const schedule = slot();
  const restores = slot();
  const status = h("div", { "aria-live": "polite" });
  let entries: any[] = [];
  let follow: ReturnType<typeof setTimeout> | null = null;
  let underWay = false;

  const loadRestores = () =>
    restores.run(async () => {
      const r = await api("GET", `${base}/restores`);
      const pending = r.data.some((x: any) => !FINISHED.has(x.status));
      // A finished restore kept the data it replaced as a pre-restore backup: show it.
      if (underWay && !pending) void loadBackups();
      underWay = pending;
      if (follow) clearTimeout(follow);
      // Followed while one is under way (and the page still shows it): the states as the API moves them.
      if (pending) follow = setTimeout(() => (restores.isConnected ? void loadRestores() : undefined), 1000);
      return table(
        ["Restore", "Kind", "From", "Status", "Created", "Completed", "Error"],
        r.data.map((x: any) => [x.id, x.kind, x.backup_name ?? when(x.restore_to), h("span", { class: `state ${x.status}` }, x.status), when(x.created_at), when(x.completed_at), x.error ?? ""]),
        "No restores yet.",
      );
    });

  const restore = async (body: Record<string, string>, what: string) => {
    status.replaceChildren();
    if (!(await confirmDialog(`Restore the database from ${what}? Its current data is replaced (and kept as a pre-restore backup).`, `Restore from ${what}`, () => api("POST", `${base}/restores`, { body })))) return;
    status.replaceChildren(h("div", { class: "notice" }, `Restore from ${what} requested.`));
    await loadRestores();
  };

  const loadBackups = () =>
    backups.run(async () => {
      const r = await api("GET", `${base}/backups`);
      const w = r.restore_window;
      return [
        w
          ? h(
              "div",
              {},
              h("p", {}, `Point-in-time restore: any instant from ${when(w.earliest_restore_at)} to ${when(w.latest_restore_at)}.`),
              form([field("Restore to (UTC, e.g. 2026-11-28T05:00:00Z)", "restore_to", { required: true })], "Restore to this instant", async (d) => restore({ restore_to: d.restore_to! }, d.restore_to!)),
            )
          : h("p", { class: "muted" }, "Point-in-time restore is not available here: restore from a backup."),
        table(
          ["Backup", "Source", "Size", "Created", "Expires", "", ""],
          r.data.map((b: any) => [
            b.name,
            b.source,
            bytes(b.size_bytes),
            when(b.created_at),
            b.expires_at ? when(b.expires_at) : "kept until deleted",
            button(`Restore from ${b.name}`, () => restore({ backup_name: b.name }, `backup ${b.name}`)),
            button(`Delete backup ${b.name}`, () => confirmDialog(`Delete backup ${b.name}?`, `Delete the backup ${b.name}`, () => api("DELETE", `${base}/backups/${enc(b.name)}`)).then((yes) => void (yes && loadBackups()))),
          ]),
          "No backups yet.",
        ),
      ];
    });

  const putSchedule = async (next: any[]) => {
    const r = await api("PUT", `${base}/backup-schedule`, { body: { entries: next } });
    entries = r.entries;
    await loadSchedule();
  };
  const loadSchedule = () =>
    schedule.run(async () => {
      const r = await api("GET", `${base}/backup-schedule`);
      entries = r.entries;
      return table(
        ["Schedule entry", "Retention", "Next run", ""],
        r.entries.map((e: any, i: number) => [
          entryText(e),
          retention(e.retention_seconds),
          when(e.next_run_at),
          button(`Remove ${entryText(e)}`, () =>
            putSchedule(entries.filter((_, j) => j !== i).map(({ frequency, hour, day, retention_seconds }) => ({ frequency, hour, ...(day !== undefined ? { day } : {}), retention_seconds }))).catch((err) =>
              status.replaceChildren(errorBox(err)),
            ),
          ),
        ]),
        "No automated backups (no schedule entries).",
      );
    });

  loadBackups();
  loadSchedule();
  loadRestores();
  return h(
    "div",
    { class: "backups" },
    h("h3", {}, "Backups"),
    form([field("Backup name", "name", { required: true, pattern: "[a-z0-9_\\-]{1,63}" })], "Take backup", async (d, _f, el) => {
      await api("POST", `${base}/backups`, { body: { name: d.name } });
      el.reset();
      await loadBackups();
    }),
    status,
    backups,
    h("h3", {}, "Backup schedule"),
    schedule,
    form(
      [
        select("Frequency", "frequency", ["daily", "weekly", "monthly"]),
        field("Hour (UTC)", "hour", { type: "number", min: 0, max: 23, value: "3", required: true }),
        field("Day (weekly 1–7 from Monday, monthly 1–28)", "day", { type: "number" }),
        field("Retention days (empty: the plan's)", "retention_days", { type: "number", min: 1 }),
      ],
      "Add schedule entry",
      async (d) => {
        const entry: Record<string, unknown> = { frequency: d.frequency, hour: Number(d.hour) };
        if (d.day) entry.day = Number(d.day);
        if (d.retention_days) entry.retention_seconds = Number(d.retention_days) * 86400;
        await putSchedule([...entries.map(({ frequency, hour, day, retention_seconds }) => ({ frequency, hour, ...(day !== undefined ? { day } : {}), retention_seconds })), entry]);
      },
    ),
    h("h3", {}, "Restores"),
    button("Refresh restores", () => loadRestores()),
    restores,
  );
}
