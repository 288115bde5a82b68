import { defineConfig } from 'vitest/config';

// Vitest's `vmThreads` pool, which runs each test file in a `vm` context of its own, as Jest does:
// the package's errors and values must be of that context's realm. Run by `npm run test:vm`.
export default defineConfig({
  test: {
    include: ['__test__/**/*.vmtest.ts'],
    pool: 'vmThreads',
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
