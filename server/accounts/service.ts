import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Principal } from "../auth/principal";
import type { Config, PlanName } from "../config";
import { hashSecret, newId, newSecret, secretPrefix } from "../ids";
import type { ControlStore, Sql } from "../store/store";

export interface CreatedAccount {
  id: string;
  plan: PlanName;
  platform_token: string;
}

export class AccountsService {
  constructor(
    private readonly store: ControlStore,
    private readonly now: () => Date,
  ) {}

  async create(plan: PlanName, opts: { isDefault?: boolean; token?: string } = {}, tx: Sql = this.store): Promise<CreatedAccount> {
    const id = newId();
    const token = opts.token ?? newSecret("pk");
    const at = this.now().toISOString();
    await tx.query(`insert into accounts (id, plan, is_default, created_at) values ($1, $2, $3, $4)`, [id, plan, !!opts.isDefault, at]);
    await this.addToken(id, token, tx);
    return { id, plan, platform_token: token };
  }

  /**
   * The plan of the account that owns a project. A platform token already carries it; a project
   * token acts for the owning account, whose plan is read.
   */
  async ownerPlan(principal: Principal | null, accountId: string): Promise<PlanName> {
    return principal?.kind === "platform" ? principal.plan : this.planOf(accountId);
  }

  async planOf(accountId: string): Promise<PlanName> {
    const [r] = await this.store.query<{ plan: PlanName }>(`select plan from accounts where id = $1`, [accountId]);
    if (!r) throw new Error(`account ${accountId} not found`);
    return r.plan;
  }

  /** Whether this is the instance's own account (made at first start), not one made via /admin/accounts. */
  async isDefault(accountId: string): Promise<boolean> {
    const [r] = await this.store.query<{ is_default: boolean }>(`select is_default from accounts where id = $1`, [accountId]);
    return r?.is_default === true;
  }

  /** A new platform token of the instance's default account (the console's one-time sign-in). */
  async issueDefaultToken(): Promise<string> {
    const [account] = await this.store.query<{ id: string }>(`select id from accounts where is_default`);
    if (!account) throw new Error("the default account does not exist yet");
    const token = newSecret("pk");
    await this.addToken(account.id, token, this.store);
    return token;
  }

  private async addToken(accountId: string, token: string, tx: Sql): Promise<void> {
    await tx.query(
      `insert into platform_tokens (id, account_id, token_hash, token_prefix, created_at) values ($1, $2, $3, $4, $5)
       on conflict (token_hash) do nothing`,
      [newId(), accountId, hashSecret(token), secretPrefix(token), this.now().toISOString()],
    );
  }

  /**
   * The default account of this instance, made on first start. Its token comes from
   * `KILN_PLATFORM_TOKEN` or is generated, printed once, and saved to `<data-dir>/credentials.json`.
   * The configured plan is applied at every start (it is a flag of the instance).
   */
  async ensureDefault(config: Config, print: (line: string) => void): Promise<{ accountId: string }> {
    return this.store.transaction(async (tx) => {
      const [existing] = await tx.query<{ id: string; plan: string }>(`select id, plan from accounts where is_default`);
      if (existing) {
        // Written only when it changed: a start that writes nothing commits without a WAL flush.
        if (existing.plan !== config.plan) await tx.query(`update accounts set plan = $2 where id = $1`, [existing.id, config.plan]);
        if (config.platformToken) await this.addToken(existing.id, config.platformToken, tx);
        return { accountId: existing.id };
      }
      const created = await this.create(config.plan, { isDefault: true, token: config.platformToken }, tx);
      if (!config.platformToken) {
        const file = saveCredentials(config.dataDir, created.platform_token);
        print(`Platform token (shown once, saved to ${file}): ${created.platform_token}`);
      }
      return { accountId: created.id };
    });
  }
}

export function credentialsFile(dataDir: string): string {
  return join(dataDir, "credentials.json");
}

function saveCredentials(dataDir: string, token: string): string {
  mkdirSync(dataDir, { recursive: true });
  const file = credentialsFile(dataDir);
  writeFileSync(file, JSON.stringify({ platform_token: token }, null, 2) + "\n", { mode: 0o600 });
  chmodSync(file, 0o600);
  return file;
}

export function readSavedToken(dataDir: string): string | null {
  const file = credentialsFile(dataDir);
  if (!existsSync(file)) return null;
  try {
    return JSON.parse(readFileSync(file, "utf8")).platform_token ?? null;
  } catch {
    return null;
  }
}
