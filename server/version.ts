import pkg from "../package.json" with { type: "json" };

/** Kiln's own version; responses carry it as `X-Service-Version: local-<version>`. */
export const KILN_VERSION: string = pkg.version;
export const SERVICE_VERSION = `local-${KILN_VERSION}`;
