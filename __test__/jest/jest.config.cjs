// Jest as a user of the package runs it: its node environment, each test file in a `vm` context
// of its own, the package found by its name (the package refers to itself). Run by
// scripts/jest.mjs: CommonJS and ES module files, in band and in worker processes.
const { join } = require('node:path');

module.exports = {
  rootDir: join(__dirname, '..', '..'),
  roots: ['<rootDir>/__test__/jest'],
  testMatch: ['**/*.test.cjs', '**/*.test.mjs'],
  testEnvironment: 'node',
  // The files are run as written: no Babel.
  transform: {},
  testTimeout: 30_000,
};
