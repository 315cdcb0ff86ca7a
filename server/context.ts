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
  http: { renderError(err: unknown, request: Request): Response };
}
