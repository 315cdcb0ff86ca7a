import { defineArea } from "../area";
import type { Platform } from "../platform";
import { OAuthConfigsService } from "./configs";
import { OAUTH_MIGRATIONS } from "./migrations";
import { oauthAdminRoutes } from "./routes";

type Needs = Pick<Platform, "store" | "clock" | "log" | "config" | "secretKey" | "address">;

/** End-user sign-in through OAuth providers: provider configs, the redirect flow, linking, the device flow. */
export const oauthArea = defineArea({
  name: "oauth",
  migrations: OAUTH_MIGRATIONS,
  // Provider client secrets (written encrypted, decrypted only for the token request).
  secrets: [{ table: "oauth_configs", key: "id", column: "client_secret" }],
  start: ({ store, clock, config, secretKey }: Needs) => {
    const production = Boolean(config.databaseUrl || config.postgresUrl);
    return { oauthConfigs: new OAuthConfigsService(store, () => clock.now(), secretKey, !production) };
  },
  routes: (r) => {
    oauthAdminRoutes(r);
  },
  project: {
    cleanup: async (projectId, { oauthConfigs }) => oauthConfigs.removeAll(projectId),
  },
});
