import type { AccessTokensService } from "./access-tokens/service";
import type { TokenUsage } from "./access-tokens/usage";
import type { AccountsService } from "./accounts/service";
import type { Credentials } from "./auth/credentials";
import type { Guard } from "./auth/guard";
import type { clock } from "./clock";
import type { Config } from "./config";
import type { KeysService } from "./keys/service";
import type { Logger } from "./log";
import type { ProjectsService } from "./projects/service";
import type { ControlStore } from "./store/store";
import type { VariablesService } from "./variables/service";
import type { AuthConfigService } from "./end-users/config";
import type { AuthRateLimits } from "./end-users/rate-limits";
import type { EndUsersService } from "./end-users/service";
import type { SigningKeys } from "./end-users/signing-keys";
import type { MailCatcher } from "../emulators/mail/catcher";
import type { DatabasesService } from "./databases/service";
import type { FunctionsService } from "./functions/service";
import type { FunctionLogs } from "./functions/invoke";
import type { WorkerPool } from "../runtime-sandbox/worker-pool";
import type { Mailer } from "../emulators/mail/mailer";

/** Everything a route handler can reach: configuration, the store and the domain services. */
export interface Kiln {
  config: Config;
  clock: typeof clock;
  log: Logger;
  store: ControlStore;
  credentials: Credentials;
  guard: Guard;
  usage: TokenUsage;
  accounts: AccountsService;
  projects: ProjectsService;
  tokens: AccessTokensService;
  keys: KeysService;
  variables: VariablesService;
  authConfig: AuthConfigService;
  authLimits: AuthRateLimits;
  signingKeys: SigningKeys;
  endUsers: EndUsersService;
  databases: DatabasesService;
  functions: FunctionsService;
  /** The sandboxed worker pool, made on first use. */
  functionPool: () => Promise<WorkerPool>;
  functionLogs: FunctionLogs;
  /** Where Kiln's email goes: the local catcher's SMTP port, or KILN_SMTP_URL. */
  mailer: Mailer;
  /** The local catcher, when Kiln is not configured to send real mail. */
  mailCatcher: MailCatcher | null;
  /** The address links in emails point at (`KILN_PUBLIC_URL`, else the listening address). */
  publicUrl: string;
  /** The port Kiln's HTTP server listens on (function addresses carry it). */
  httpPort: number;
  http: { renderError(err: unknown, request: Request): Response };
}
