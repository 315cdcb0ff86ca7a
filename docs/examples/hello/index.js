// The README's first function: `npx kiln functions deploy ./docs/examples/hello --name hello --runtime nodejs22.x --wait`.
exports.handler = async (event) => {
  const name = event?.name ?? "world";
  console.log(`hello ${name}`);
  return { hello: name };
};
