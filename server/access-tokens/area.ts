import { defineArea } from "../area";
import type { Platform } from "../platform";
import type { ProjectsService } from "../projects/service";
import { ACCESS_TOKENS_MIGRATIONS } from "./migrations";
import { accessTokenRoutes } from "./routes";
import { AccessTokensService } from "./service";
import { TokenUsage } from "./usage";

export const accessTokensArea = defineArea({
  name: "access-tokens",
  migrations: ACCESS_TOKENS_MIGRATIONS,
  start: ({ store, config, clock, log, principals }: Pick<Platform, "store" | "config" | "clock" | "log" | "principals"> & { projects: ProjectsService }) => {
    const now = () => clock.now();
    const tokenUsage = new TokenUsage(store, now, log);
    const tokens = new AccessTokensService(store, config, now, tokenUsage, (id) => principals.evict((p) => "tokenId" in p && p.tokenId === id));
    return { tokens, tokenUsage };
  },
  routes: accessTokenRoutes,
  resume: async ({ tokenUsage }) => tokenUsage.start(),
  // Counts of requests since the snapshot are written (and so put back with the rest); the flush loop keeps running.
  reset: { flush: ({ tokenUsage }) => tokenUsage.flush(), resume: () => {} },
  stop: ({ tokenUsage, log }) => tokenUsage.stop().catch((e) => log.error("final usage flush failed", e)),
});
