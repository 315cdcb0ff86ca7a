import { defineArea } from "../area";
import type { Platform } from "../platform";
import { ACCOUNTS_MIGRATIONS } from "./migrations";
import { accountRoutes } from "./routes";
import { AccountsService } from "./service";

export const accountsArea = defineArea({
  name: "accounts",
  migrations: ACCOUNTS_MIGRATIONS,
  start: ({ store, clock }: Pick<Platform, "store" | "clock">) => ({ accounts: new AccountsService(store, () => clock.now()) }),
  routes: accountRoutes,
});
