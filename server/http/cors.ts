/** A CORS preflight answer allowing the caller's origin and headers for the given methods. */
export function preflight(request: Request, methods: string[]): Response {
  return new Response(null, {
    status: 204,
    headers: {
      "Access-Control-Allow-Origin": request.headers.get("origin") ?? "*",
      "Access-Control-Allow-Methods": [...methods, "OPTIONS"].join(", "),
      "Access-Control-Allow-Headers": request.headers.get("access-control-request-headers") ?? "authorization, content-type",
      "Access-Control-Max-Age": "600",
      Vary: "Origin",
    },
  });
}
