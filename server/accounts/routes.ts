import * as z from "zod";
import { errorSchema } from "../http/common-schemas";
import { reply, type AreaRouter } from "../http/route";
import type { AccountsService } from "./service";

export const createAccountBody = z.object({ plan: z.enum(["hobby", "superagent"]) });
export const createdAccountSchema = z.object({
  id: z.string(),
  plan: z.enum(["hobby", "superagent"]),
  platform_token: z.string().describe("pk-...; shown only here"),
});

/** What the account routes use. */
export interface AccountRouteDeps {
  accounts: AccountsService;
}

export function accountRoutes(r: AreaRouter<AccountRouteDeps>): void {
  r.add({
    method: "POST",
    path: "/admin/accounts",
    tag: "Admin",
    summary: "Create an account with its platform token (needs KILN_ADMIN_TOKEN; 404 when unset)",
    auth: { kind: "admin" },
    body: createAccountBody,
    responses: { 201: { description: "created", schema: createdAccountSchema }, 400: errorSchema, 401: errorSchema, 404: errorSchema },
    handler: async ({ deps, body }) => reply.created(await deps.accounts.create(body.plan)),
  });
}
