// The README's durable function: each step's result is journaled, so a retry or a crash replays the
// finished steps instead of running them again (docs/durable-functions.md).
exports.handler = async (event, step) => {
  const reserved = await step.run("reserve", () => ({ order: event.order, items: 1 }));
  const charged = await step.run("charge", () => ({ order: reserved.order, paid: true }));
  return step.run("ship", () => ({ order: charged.order, shipped: true }));
};
