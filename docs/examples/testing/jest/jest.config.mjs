// Plain ESM, no transform: Jest runs the .mjs test as Node does (with --experimental-vm-modules).
export default {
  testEnvironment: "node",
  testMatch: ["**/*.test.mjs"],
  transform: {},
  testTimeout: 30_000,
};
