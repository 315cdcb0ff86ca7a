import { defineArea } from "../area";
import type { Platform } from "../platform";
import { ACCOUNTS_MIGRATIONS } from "./migrations";
import { accountRoutes } from "./routes";
import { AccountsService } from "./service";

export const accountsArea = defineArea({
  name: "accounts",
  migrations: ACCOUNTS_MIGRATIONS,
  start: ({ store, clock }: Pick<Platform, "store" | "clock" | "config" | "log">) => ({ accounts: new AccountsService(store, () => clock.now()) }),
  routes: accountRoutes,
  // Nothing of its rows in memory (resolved tokens are in the principal cache, which a restore empties).
  // Rows put back may predate this process (a snapshot taken by an earlier one): the default account
  // gets this start's token and plan again, as at start.
  reset: {
    resume: async ({ accounts, config, log }, changed) => {
      if (changed.tables.size) await accounts.ensureDefault(config, (line) => log.info(line));
    },
  },
});
