import { api, enc, request, serviceKey } from "./api";
import { button, confirmDialog, errorBox, field, form, h, slot, table, when } from "./dom";
import { projectPath } from "./projects";

const objectUrl = (bucket: string, name: string) => `/storage/${enc(bucket)}/${name.split("/").map(enc).join("/")}`;

export function storagePage(projectId: string, params: URLSearchParams): HTMLElement {
  const bucket = params.get("bucket");
  return bucket ? bucketPage(projectId, bucket, params) : bucketsPage(projectId);
}

function bucketsPage(projectId: string): HTMLElement {
  const list = slot();
  const load = () =>
    list.run(async () => {
      const r = await api("GET", `/projects/${projectId}/storage/buckets`);
      return table(
        ["Bucket", "Allowed types", "Size limit", "Created", ""],
        r.buckets.map((b: any) => [
          h("a", { href: projectPath(projectId, `/storage?bucket=${enc(b.name)}`) }, b.name),
          (b.allowed_mime_types ?? []).join(", ") || "any",
          b.file_size_limit ?? "—",
          when(b.created_at),
          button(`Delete bucket ${b.name}`, () => confirmDialog(`Delete bucket ${b.name}?`, `Delete the bucket ${b.name}`, () => api("DELETE", `/projects/${projectId}/storage/buckets/${enc(b.name)}`)).then((yes) => void (yes && load()))),
        ]),
        "No buckets yet.",
      );
    });
  load();
  return h(
    "section",
    {},
    h("h1", {}, "Storage"),
    form([field("Name", "name", { required: true }), field("Allowed MIME types (comma-separated, optional)", "types")], "Create bucket", async (d, _f, el) => {
      const types = (d.types ?? "").split(",").map((t) => t.trim()).filter(Boolean);
      await api("POST", `/projects/${projectId}/storage/buckets`, { body: { name: d.name, ...(types.length ? { allowed_mime_types: types } : {}) } });
      el.reset();
      await load();
    }),
    list,
  );
}

function bucketPage(projectId: string, bucket: string, params: URLSearchParams): HTMLElement {
  const prefix = params.get("prefix") ?? "";
  const cursor = params.get("cursor");
  const list = slot();
  const status = h("div", { "aria-live": "polite" });
  const here = (extra: Record<string, string>) => projectPath(projectId, `/storage?${new URLSearchParams({ bucket, ...(prefix ? { prefix } : {}), ...extra })}`);
  const load = () =>
    list.run(async () => {
      const key = await serviceKey(projectId);
      const q = new URLSearchParams({ limit: "100", ...(prefix ? { prefix } : {}), ...(cursor ? { cursor } : {}) });
      const r = await api("GET", `/storage/${enc(bucket)}?${q}`, { bearer: key });
      return [
        table(
          ["Object", "Size", "Type", "Updated", "", ""],
          r.objects.map((o: any) => [
            o.name,
            o.size,
            o.mime_type,
            when(o.updated_at),
            button(`Download ${o.name}`, () => download(projectId, bucket, o.name).catch((e) => status.replaceChildren(errorBox(e)))),
            button(`Delete ${o.name}`, () => confirmDialog(`Delete object ${o.name}?`, `Delete object ${o.name}`, () => request("DELETE", objectUrl(bucket, o.name), { bearer: key })).then((yes) => void (yes && load()))),
          ]),
          "No objects here.",
        ),
        h("nav", { "aria-label": "pages" }, cursor ? h("a", { href: here({}) }, "First page") : null, " ", r.next_cursor ? h("a", { href: here({ cursor: r.next_cursor }) }, "Next →") : null),
      ];
    });
  const upload = async (file: File, name: string) => {
    const body = new FormData();
    body.set("file", file, file.name);
    await request("POST", objectUrl(bucket, name), { bearer: await serviceKey(projectId), raw: body, headers: { "x-upsert": "true" } });
    status.replaceChildren(h("div", { class: "notice" }, `Uploaded ${name}`));
    await load();
  };
  const drop = h("div", { class: "route", tabindex: "0", "aria-label": "drop files here to upload them" }, "Drop files here to upload them under the prefix.");
  drop.addEventListener("dragover", (e) => e.preventDefault());
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    for (const f of e.dataTransfer?.files ?? []) upload(f, prefix + f.name).catch((err) => status.replaceChildren(errorBox(err)));
  });
  load();
  return h(
    "section",
    {},
    h("h1", {}, `Bucket ${bucket}`),
    h("p", {}, h("a", { href: projectPath(projectId, "/storage") }, "← All buckets")),
    form([field("Prefix", "prefix", { value: prefix })], "Filter", async (d) => {
      location.hash = projectPath(projectId, `/storage?${new URLSearchParams({ bucket, prefix: d.prefix ?? "" })}`);
    }),
    form([field("File", "file", { type: "file", required: true }), field("Object name (empty: prefix + file name)", "name")], "Upload", async (d, files, el) => {
      const file = files.file;
      if (!file) throw new Error("choose a file");
      await upload(file, d.name || prefix + file.name);
      el.reset();
    }),
    drop,
    status,
    list,
    policiesSection(projectId, bucket),
  );
}

const OPERATIONS = ["SELECT", "INSERT", "UPDATE", "DELETE"];

/**
 * A bucket's policies (they decide what anon keys and end users may do; service keys bypass them):
 * listed, created, deleted, and edited. The API has no update, so an edit creates the new version
 * after deleting the old one, and puts the old one back if the API refuses the new one (its
 * validation error is shown): a refused edit leaves the bucket as it was.
 */
function policiesSection(projectId: string, bucket: string): HTMLElement {
  const list = slot();
  const status = h("div", { "aria-live": "polite" });
  let bucketId = "";
  let editing: any = null;
  const heading = h("h3", {}, "New policy");
  const name = h("input", { name: "name", required: true });
  const operation = h("select", { name: "operation" }, OPERATIONS.map((o) => h("option", { value: o }, o)));
  const definition = h("textarea", { name: "definition", spellcheck: false, placeholder: "auth.uid()::text = (storage.foldername(name))[1]" });
  const cancel = button("Cancel edit", () => stopEditing(), { hidden: true });
  const stopEditing = () => {
    editing = null;
    heading.textContent = "New policy";
    cancel.hidden = true;
    editor.reset();
  };
  const base = async () => {
    if (!bucketId) {
      const r = await api("GET", `/projects/${projectId}/storage/buckets`);
      const b = r.buckets.find((x: any) => x.name === bucket);
      if (!b) throw new Error(`no bucket named ${bucket}`);
      bucketId = b.id;
    }
    return `/storage/buckets/${enc(bucketId)}/policies`;
  };
  const load = () =>
    list.run(async () => {
      const key = await serviceKey(projectId);
      const path = await base();
      const r = await api("GET", path, { bearer: key });
      return table(
        ["Policy", "Operation", "Definition", "Created", "", ""],
        r.policies.map((p: any) => [
          p.name,
          p.operation,
          h("code", {}, p.definition),
          when(p.created_at),
          button(`Edit policy ${p.name}`, () => {
            editing = p;
            heading.textContent = `Edit policy ${p.name}`;
            name.value = p.name;
            operation.value = p.operation;
            definition.value = p.definition;
            cancel.hidden = false;
            definition.focus();
          }),
          button(`Delete policy ${p.name}`, () => confirmDialog(`Delete policy ${p.name}?`, `Delete the policy ${p.name}`, () => api("DELETE", `${path}/${enc(p.id)}`, { bearer: key })).then((yes) => void (yes && load()))),
        ]),
        "No policies: only service keys reach this bucket's objects.",
      );
    });
  const editor = form(
    [h("label", {}, "Policy name", name), h("label", {}, "Operation", operation), h("label", { class: "wide" }, "Definition (a SQL boolean expression)", definition)],
    "Save policy",
    async (d) => {
      const key = await serviceKey(projectId);
      const path = await base();
      const body = { name: d.name, operation: d.operation, definition: d.definition ?? "" };
      const old = editing;
      if (old) await api("DELETE", `${path}/${enc(old.id)}`, { bearer: key });
      try {
        await api("POST", path, { bearer: key, body });
      } catch (err) {
        if (old) await api("POST", path, { bearer: key, body: { name: old.name, operation: old.operation, definition: old.definition } }).then((p) => (editing = p), () => undefined);
        await load();
        throw err;
      }
      status.replaceChildren(h("div", { class: "notice" }, `Saved policy ${d.name}`));
      stopEditing();
      await load();
    },
    { class: "policy", "aria-label": "policy" },
  );
  load();
  return h("div", {}, h("h2", {}, "Policies"), h("p", { class: "muted" }, "What anon keys and end users may do with this bucket's objects (service keys bypass policies)."), status, list, heading, editor, cancel);
}

/** Fetched with the key (a link cannot carry it), then saved through an object URL. */
async function download(projectId: string, bucket: string, name: string): Promise<void> {
  const res = await request("GET", objectUrl(bucket, name), { bearer: await serviceKey(projectId) });
  const url = URL.createObjectURL(await res.blob());
  const a = h("a", { href: url, download: name.split("/").pop() ?? name });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
