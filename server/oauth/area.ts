import { defineArea } from "../area";
import type { AuthConfigService } from "../end-users/config";
import type { EndUsersService } from "../end-users/service";
import type { KeysService } from "../keys/service";
import type { Platform } from "../platform";
import { OAuthConfigsService } from "./configs";
import { DeviceFlowService } from "./device";
import { deviceRoutes, hostedPageRoutes } from "./device-routes";
import { oauthEndUserRoutes } from "./end-user-routes";
import { OAuthFlowService } from "./flow";
import { OAUTH_MIGRATIONS } from "./migrations";
import { ProviderClient } from "./provider-client";
import { oauthAdminRoutes } from "./routes";

type Needs = Pick<Platform, "store" | "clock" | "log" | "config" | "secretKey" | "address"> & { endUsers: EndUsersService; authConfig: AuthConfigService; keys: KeysService };

/** Kiln's own pages a sign-in may return to besides the project's allowed redirect URLs. */
export const MANAGED_PAGES = ["/auth/device", "/auth/oauth/hosted"];

/** End-user sign-in through OAuth providers: provider configs, the redirect flow, linking, the device flow. */
export const oauthArea = defineArea({
  name: "oauth",
  migrations: OAUTH_MIGRATIONS,
  // Provider client secrets (written encrypted, decrypted only for the token request).
  secrets: [{ table: "oauth_configs", key: "id", column: "client_secret" }],
  start: ({ store, clock, config, secretKey, address, endUsers, authConfig }: Needs) => {
    const now = () => clock.now();
    // Where Kiln serves the provider emulators (the embedded profile by default; KILN_OAUTH_EMULATORS),
    // a config without an issuer signs in against them; elsewhere against the real provider.
    const oauthConfigs = new OAuthConfigsService(store, now, secretKey, config.oauthEmulators);
    const client = new ProviderClient(
      () => address.publicUrl(),
      (cfg) => oauthConfigs.usesEmulator(cfg.provider, cfg.issuer),
    );
    const isManagedPage = (url: string) => {
      try {
        const u = new URL(url);
        return u.origin === new URL(address.publicUrl()).origin && MANAGED_PAGES.includes(u.pathname);
      } catch {
        return false;
      }
    };
    const oauthFlow = new OAuthFlowService({ store, now, configs: oauthConfigs, authConfig, endUsers, client, isManagedPage });
    const deviceFlow = new DeviceFlowService({ store, now, configs: oauthConfigs, authConfig, endUsers, managedPage: () => `${address.publicUrl()}/auth/device` });
    return { oauthConfigs, oauthFlow, deviceFlow };
  },
  routes: (r) => {
    oauthAdminRoutes(r);
    oauthEndUserRoutes(r);
    deviceRoutes(r);
    hostedPageRoutes(r);
  },
  project: {
    cleanup: async (projectId, { oauthConfigs, oauthFlow }) => {
      await oauthFlow.removeAll(projectId);
      await oauthConfigs.removeAll(projectId);
    },
  },
});
