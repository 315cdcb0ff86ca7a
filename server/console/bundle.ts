import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { COMPILED, embeddedFile } from "../embedded/embedded";

/** The console's sources (plain TypeScript, no framework) and where `npm run build:console` puts the bundle. */
// import.meta.url, not import.meta.dir: unit tests load the areas under vitest's transform.
const HERE = dirname(fileURLToPath(import.meta.url));
const APP = join(HERE, "app", "main.ts");
const STYLE = join(HERE, "app", "style.css");
export const BUNDLE_FILE = join(HERE, "dist", "console.html");
/** Its name among the binary's embedded files. */
export const EMBEDDED_NAME = "console/console.html";

/** Bundles the app with Bun's bundler into one self-contained HTML page (script and style inline: nothing fetched). */
export async function buildConsole(): Promise<string> {
  const out = await Bun.build({ entrypoints: [APP], target: "browser", minify: true, format: "esm" });
  if (!out.success) throw new Error(`console build failed: ${out.logs.map(String).join("\n")}`);
  const js = (await out.outputs[0]!.text()).replaceAll("</script", "<\\/script");
  const css = readFileSync(STYLE, "utf8");
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Kiln console</title><link rel="icon" href="data:,"><style>${css}</style></head><body><div id="app"></div><script type="module">${js}</script></body></html>`;
}

/**
 * The page served at /_console/: in the compiled binary, the one built into it (cmd/build-binary.ts);
 * from source, the file built at package time (postinstall, `npm run build:console`) when it is
 * there, else built once in memory from the sources (a checkout that skipped the script).
 */
let page: Promise<string> | null = null;
export function consolePage(): Promise<string> {
  if (COMPILED) return (page ??= Promise.resolve(readFileSync(embeddedFile(EMBEDDED_NAME)!, "utf8")));
  page ??= builtIsCurrent() ? Promise.resolve(readFileSync(BUNDLE_FILE, "utf8")) : buildConsole();
  page.catch(() => (page = null));
  return page;
}

/** The built page exists and no source changed after it (a checkout editing the console sees its edits). */
function builtIsCurrent(): boolean {
  if (!existsSync(BUNDLE_FILE)) return false;
  const built = statSync(BUNDLE_FILE).mtimeMs;
  const dir = dirname(APP);
  return readdirSync(dir).every((f) => statSync(join(dir, f)).mtimeMs <= built);
}

/** Builds the page into BUNDLE_FILE (`npm run build:console`, and the binary's build before it embeds it). */
export async function writeConsole(): Promise<string> {
  mkdirSync(dirname(BUNDLE_FILE), { recursive: true });
  writeFileSync(BUNDLE_FILE, await buildConsole());
  return BUNDLE_FILE;
}

if (import.meta.main) console.log(`console built: ${await writeConsole()}`);
