import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { newId } from "../ids";

/**
 * The data dir's id (kept in `<dir>/instance-id`): which instance runs a deployment (functions',
 * frontends'), across this data dir's restarts.
 */
export function dataDirId(dir: string): string {
  const file = join(dir, "instance-id");
  try {
    return readFileSync(file, "utf8").trim();
  } catch {
    const id = newId();
    mkdirSync(dir, { recursive: true });
    writeFileSync(file, id);
    return id;
  }
}
