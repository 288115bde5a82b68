import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['__test__/**/*.test.ts'],
    // The addon is loaded once per process; child-process tests spawn their own.
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
