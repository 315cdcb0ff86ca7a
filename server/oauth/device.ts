import type { AuthConfigService } from "../end-users/config";
import type { EndUsersService, TokenResponse } from "../end-users/service";
import { badRequest, HttpError, notFound } from "../http/errors";
import { hashSecret } from "../ids";
import type { ControlStore, Row } from "../store/store";
import type { OAuthConfigsService } from "./configs";
import { randomToken } from "./flow";

/** How long a device code and its user code live. */
export const DEVICE_CODE_TTL_S = 600;
/** The polling interval a device is told; each slow_down adds 5 seconds (RFC 8628 §3.5). */
export const DEVICE_INTERVAL_S = 5;
export const DEVICE_GRANT_TYPE = "urn:ietf:params:oauth:grant-type:device_code";

// RFC 8628 §6.1: consonants only (no words, no vowels to misread), case-insensitive, 20^8 codes.
const USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ";

function userCode(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return Array.from(bytes, (b) => USER_CODE_ALPHABET[b % USER_CODE_ALPHABET.length]).join("");
}

/** "bcdf-ghjk", "BCDFGHJK" and "BCDF GHJK" are the same code. */
export function normalizeUserCode(s: string): string {
  return s.toUpperCase().replace(/[^A-Z]/g, "");
}
export const displayUserCode = (c: string) => `${c.slice(0, 4)}-${c.slice(4)}`;

/** The token endpoint's RFC 8628 / RFC 6749 errors: 400 with `{error: <code>}`. */
const grantError = (code: string, description: string) => new HttpError(400, Object.assign({ error: code }, { error_description: description }));

export interface DeviceAuthorization {
  device_code: string;
  user_code: string;
  verification_uri: string;
  verification_uri_complete: string;
  expires_in: number;
  interval: number;
}

export interface PendingDevice {
  projectId: string;
  clientId: string;
  userCode: string;
  status: string;
  expired: boolean;
}

/**
 * The device authorization grant (RFC 8628): a device with no browser (a TV, a CLI) gets a device
 * code and a short user code; the person opens the verification page elsewhere, signs in and
 * approves; the device polls until it receives the same auth token response as any sign-in.
 */
export class DeviceFlowService {
  constructor(
    private readonly d: {
      store: ControlStore;
      now: () => Date;
      configs: OAuthConfigsService;
      authConfig: AuthConfigService;
      endUsers: EndUsersService;
      /** The managed device page. */
      managedPage: () => string;
    },
  ) {}

  async start(projectId: string, clientId: string, scope?: string): Promise<DeviceAuthorization> {
    const client = await this.d.configs.deviceClient(projectId, clientId);
    if (!client) throw notFound(`no device client with client_id '${clientId}' is configured for this project`);
    if (!client.enabled) throw badRequest(`device client '${clientId}' is disabled for this project`);
    const now = this.d.now();
    const deviceCode = randomToken();
    const cfg = await this.d.authConfig.get(projectId);
    const page = cfg.device_verification_url ?? this.d.managedPage();
    await this.d.store.query(`delete from oauth_device_codes where expires_at < $1::timestamptz`, [now.toISOString()]);
    for (let attempt = 0; ; attempt++) {
      const code = userCode();
      const rows = await this.d.store.query(
        `insert into oauth_device_codes (device_code_hash, project_id, client_id, user_code, scope, status, interval_seconds, expires_at, created_at)
         values ($1, $2, $3, $4, $5, 'pending', $6, $7, $8) on conflict (user_code) do nothing returning user_code`,
        [hashSecret(deviceCode), projectId, clientId, code, scope ?? null, DEVICE_INTERVAL_S, new Date(now.getTime() + DEVICE_CODE_TTL_S * 1000).toISOString(), now.toISOString()],
      );
      if (rows.length) {
        const shown = displayUserCode(code);
        const complete = new URL(page);
        complete.searchParams.set("user_code", shown);
        return { device_code: deviceCode, user_code: shown, verification_uri: page, verification_uri_complete: complete.toString(), expires_in: DEVICE_CODE_TTL_S, interval: DEVICE_INTERVAL_S };
      }
      if (attempt > 5) throw new Error("could not find a free user code");
    }
  }

  /** One poll of the device: tokens once approved, else the RFC's error. */
  async poll(projectId: string, clientId: string, deviceCode: string): Promise<TokenResponse> {
    const hash = hashSecret(deviceCode);
    const [row] = await this.d.store.query(`select * from oauth_device_codes where device_code_hash = $1`, [hash]);
    if (!row || row.project_id !== projectId || row.client_id !== clientId) throw grantError("invalid_grant", "unknown device_code for this client");
    const now = this.d.now();
    if (new Date(row.expires_at).getTime() <= now.getTime()) throw grantError("expired_token", "the device code has expired; start again");
    if (row.status === "denied") throw grantError("access_denied", "the user denied the device");
    if (row.status === "used") throw grantError("invalid_grant", "the device code has been used already");
    if (row.status === "approved") {
      const spent = await this.d.store.query(`update oauth_device_codes set status = 'used', last_polled_at = $2 where device_code_hash = $1 and status = 'approved' returning user_id`, [
        hash,
        now.toISOString(),
      ]);
      if (!spent.length) throw grantError("invalid_grant", "the device code has been used already");
      return this.d.endUsers.startSessionFor(projectId, spent[0]!.user_id);
    }
    const last = row.last_polled_at ? new Date(row.last_polled_at).getTime() : null;
    if (last !== null && now.getTime() - last < row.interval_seconds * 1000) {
      const interval = row.interval_seconds + 5;
      await this.d.store.query(`update oauth_device_codes set interval_seconds = $2, last_polled_at = $3 where device_code_hash = $1`, [hash, interval, now.toISOString()]);
      throw grantError("slow_down", `poll at most every ${interval} seconds`);
    }
    await this.d.store.query(`update oauth_device_codes set last_polled_at = $2 where device_code_hash = $1`, [hash, now.toISOString()]);
    throw grantError("authorization_pending", "the user has not approved the device yet");
  }

  /** The device waiting behind a user code (the verification page shows it). */
  async pending(code: string): Promise<PendingDevice | null> {
    const [row] = await this.d.store.query(`select * from oauth_device_codes where user_code = $1`, [normalizeUserCode(code)]);
    if (!row) return null;
    return { projectId: row.project_id, clientId: row.client_id, userCode: displayUserCode(row.user_code), status: row.status, expired: new Date(row.expires_at).getTime() <= this.d.now().getTime() };
  }

  /** The signed-in user approves or denies the device behind a user code of their project. */
  async decide(projectId: string, userId: string, code: string, approve: boolean): Promise<{ user_code: string; status: "approved" | "denied" }> {
    const row: Row | undefined = (
      await this.d.store.query(
        `update oauth_device_codes set status = $4, user_id = $5
          where user_code = $1 and project_id = $2 and status = 'pending' and expires_at > $3::timestamptz returning user_code`,
        [normalizeUserCode(code), projectId, this.d.now().toISOString(), approve ? "approved" : "denied", userId],
      )
    )[0];
    if (!row) throw notFound("no device is waiting for this user code (unknown, expired or already answered)");
    return { user_code: displayUserCode(row.user_code), status: approve ? "approved" : "denied" };
  }
}
