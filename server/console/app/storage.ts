import { api, enc, request, serviceKey } from "./api";
import { button, errorBox, field, form, h, slot, table, when } from "./dom";
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
          button(`Delete bucket ${b.name}`, () => (confirm(`Delete bucket ${b.name}?`) ? api("DELETE", `/projects/${projectId}/storage/buckets/${enc(b.name)}`).then(load) : undefined)),
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
            button(`Delete ${o.name}`, () =>
              request("DELETE", objectUrl(bucket, o.name), { bearer: key })
                .then(load)
                .catch((e) => status.replaceChildren(errorBox(e))),
            ),
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
  );
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
