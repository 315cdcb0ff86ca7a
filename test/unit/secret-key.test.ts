import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { loadSecretKey, makeSecretKey, parseKey } from "../../server/secrets/secret-key";

const KEY = randomBytes(32);
const b64 = KEY.toString("base64");

describe("the instance secret key", () => {
  test("accepts 32 bytes as base64, base64url or hex, and refuses weaker keys with a clear message", () => {
    expect(parseKey(b64, "K").equals(KEY)).toBe(true);
    expect(parseKey(b64.replace(/=$/, ""), "K").equals(KEY)).toBe(true);
    expect(parseKey(KEY.toString("base64url"), "K").equals(KEY)).toBe(true);
    expect(parseKey(KEY.toString("hex"), "K").equals(KEY)).toBe(true);
    expect(() => parseKey(randomBytes(16).toString("base64"), "KILN_SECRET_KEY")).toThrow(/KILN_SECRET_KEY must be 32 random bytes.*got 24 characters/);
    expect(() => parseKey("hunter2", "KILN_SECRET_KEY")).toThrow(/must be 32 random bytes/);
    expect(() => parseKey("00".repeat(32), "KILN_SECRET_KEY")).toThrow(/does not look random/);
    expect(() => parseKey(Buffer.from("abcdabcdabcdabcdabcdabcdabcdabcd").toString("base64"), "K")).toThrow(/does not look random/);
  });

  test("derive is deterministic per key and purpose, and differs across keys and purposes", () => {
    const a = makeSecretKey(KEY);
    const b = makeSecretKey(Buffer.from(KEY));
    expect(a.derive("tenant-role:p1")).toBe(b.derive("tenant-role:p1"));
    expect(a.derive("tenant-role:p1")).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(a.derive("tenant-role:p1")).not.toBe(a.derive("tenant-role:p2"));
    expect(makeSecretKey(randomBytes(32)).derive("tenant-role:p1")).not.toBe(a.derive("tenant-role:p1"));
    expect(() => a.derive("\0kiln encryption v1")).toThrow(/NUL/);
  });

  test("encrypt uses a fresh nonce, names its key, and decrypt refuses another key and tampering", () => {
    const k = makeSecretKey(KEY);
    const c1 = k.encrypt("s3cret ✓");
    const c2 = k.encrypt("s3cret ✓");
    expect(c1).not.toBe(c2);
    expect(c1.startsWith(`kiln:v1:${k.id}:`)).toBe(true);
    expect(c1).not.toContain("s3cret");
    expect(k.decrypt(c1)).toBe("s3cret ✓");
    expect(k.keyIdOf(c1)).toBe(k.id);
    expect(k.keyIdOf("plain value")).toBeNull();
    expect(() => makeSecretKey(randomBytes(32)).decrypt(c1)).toThrow(/another secret key/);
    const body = Buffer.from(c1.split(":")[3]!, "base64url");
    body[body.length - 20]! ^= 1;
    expect(() => k.decrypt(`kiln:v1:${k.id}:${body.toString("base64url")}`)).toThrow();
    expect(() => k.decrypt("plain value")).toThrow(/not a Kiln ciphertext/);
  });

  test("a previous key decrypts what it wrote; new writes use the current key", () => {
    const old = makeSecretKey(KEY);
    const next = makeSecretKey(randomBytes(32), [KEY]);
    const c = old.encrypt("v");
    expect(next.previousIds).toEqual([old.id]);
    expect(next.decrypt(c)).toBe("v");
    expect(next.keyIdOf(next.encrypt("v"))).toBe(next.id);
    expect(() => makeSecretKey(KEY, [KEY])).toThrow(/holds the current key/);
  });

  test("sources: KILN_SECRET_KEY, KILN_SECRET_KEY_FILE, else a 0600 file in the data dir made once", () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-unit-secret-"));
    expect(loadSecretKey(dir, { KILN_SECRET_KEY: b64 }).id).toBe(makeSecretKey(KEY).id);
    const file = join(dir, "elsewhere.key");
    writeFileSync(file, `${KEY.toString("hex")}\n`);
    const fromFile = loadSecretKey(dir, { KILN_SECRET_KEY_FILE: file });
    expect(fromFile.source).toBe("KILN_SECRET_KEY_FILE");
    expect(fromFile.id).toBe(makeSecretKey(KEY).id);
    expect(() => loadSecretKey(dir, { KILN_SECRET_KEY: b64, KILN_SECRET_KEY_FILE: file })).toThrow(/not both/);
    expect(() => loadSecretKey(dir, { KILN_SECRET_KEY_FILE: join(dir, "missing") })).toThrow(/cannot be read/);

    const made = loadSecretKey(dir, {});
    expect(made.generated).toBe(true);
    expect(statSync(join(dir, "secret.key")).mode & 0o777).toBe(0o600);
    expect(readFileSync(join(dir, "secret.key"), "utf8").trim()).toMatch(/^[A-Za-z0-9+/]{43}=$/);
    const again = loadSecretKey(dir, {});
    expect(again.generated).toBe(false);
    expect(again.id).toBe(made.id);
    expect(again.derive("x")).toBe(made.derive("x"));
  });
});
