import { randomBytes, timingSafeEqual } from "node:crypto";

/** How long the sign-in code printed at start stays usable (on Kiln's clock). */
export const SIGN_IN_CODE_TTL_MS = 15 * 60_000;

/**
 * The one-time code of the console link Kiln prints at start (`/_console/#code=...`): the page
 * trades it once for a new platform token of the instance's default account, so the link itself
 * never carries a lasting credential. Used or expired, it is gone; a new start prints a new one.
 */
export class ConsoleSignIn {
  private code: string | null;
  private readonly expiresAt: number;

  constructor(private readonly now: () => number) {
    this.code = `cc${randomBytes(18).toString("base64url")}`;
    this.expiresAt = now() + SIGN_IN_CODE_TTL_MS;
  }

  /** The code to print, or null once used. */
  current(): string | null {
    return this.code;
  }

  /** True once for the right code within its lifetime. */
  redeem(code: string): boolean {
    if (!this.code || this.now() > this.expiresAt) return false;
    const [a, b] = [Buffer.from(code), Buffer.from(this.code)];
    if (a.length !== b.length || !timingSafeEqual(a, b)) return false;
    this.code = null;
    return true;
  }
}
