// Headless Chromium for browser tests: Debian's /usr/bin/chromium (test/support/system-deps.sh installs
// it), driven by playwright-core, which never downloads a browser of its own.
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type Browser, type BrowserContext, type Page } from "playwright-core";
import { afterAll } from "vitest";
import { removeDir } from "./dirs";

export const CHROMIUM = process.env.KILN_TEST_CHROMIUM ?? "/usr/bin/chromium";

/**
 * The flags that make Chromium work on these machines (as root, no GPU, a closed network): without
 * the background-networking ones it keeps opening connections that the network refuses, and it looks
 * up Google's hosts at every start.
 */
const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

export interface TestBrowser {
  browser: BrowserContext;
  /** A new page (tab) of the browser's one profile; cookies are shared between pages. */
  page(): Promise<Page>;
  close(): Promise<void>;
}

/**
 * Starts Chromium headless with a new, empty profile (--user-data-dir in a temporary folder, removed
 * at close). A persistent context: `--user-data-dir` is how Chromium is given its profile.
 */
export async function launchBrowser(): Promise<TestBrowser> {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install chromium (test/support/system-deps.sh installs it)`);
  const profile = mkdtempSync(join(tmpdir(), "kiln-chromium-"));
  const context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: FLAGS, timeout: 60_000 });
  let closed = false;
  return {
    browser: context,
    page: () => context.newPage(),
    async close() {
      if (closed) return;
      closed = true;
      await context.close().catch(() => {});
      removeDir(profile);
    },
  };
}

/** One browser per test file, closed after its tests. */
export function useBrowser(): { get(): Promise<TestBrowser> } {
  let started: Promise<TestBrowser> | null = null;
  afterAll(async () => {
    if (started) await (await started.catch(() => null))?.close();
  }, 60_000);
  return {
    get() {
      started ??= launchBrowser();
      return started;
    },
  };
}

export type { Browser, Page };
