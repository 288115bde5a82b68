// The Workflow SDK's conformance suite, run against `@little-workflow/world/vercel`: each test
// spawns the SDK's test server with WORKFLOW_TARGET_WORLD=./vercel.mjs on a fresh data directory.
// `bench/vercel.mjs --suite` times it against another World by LITTLE_VERCEL_SUITE_TARGET.
import './vercel-setup.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createTestSuite } from '@workflow/world-testing';
import { afterAll, beforeEach } from 'vitest';

const root = mkdtempSync(join(tmpdir(), 'little-vercel-'));
let n = 0;

beforeEach(() => {
  process.env.WORKFLOW_LITTLE_DATA_DIR = join(root, `world-${++n}`);
  process.env.WORKFLOW_LOCAL_DATA_DIR = process.env.WORKFLOW_LITTLE_DATA_DIR;
});

afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

createTestSuite(process.env.LITTLE_VERCEL_SUITE_TARGET ?? './vercel.mjs');
