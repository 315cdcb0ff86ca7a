import type { FunctionRecord } from "./records";

/**
 * The regions a function is deployed to. Kiln serves every invocation from the first region it
 * simulates (`--regions`), so a deployed function is deployed there and nowhere else.
 */
export function deployedRegions(regions: readonly string[], fn: Pick<FunctionRecord, "active_deployment_id">): string[] {
  return fn.active_deployment_id ? [regions[0]!] : [];
}
