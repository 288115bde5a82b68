// The Workflow SDK's conformance suite against the Vercel World on a PostgreSQL world, as a
// runtime on many hosts would use it: each server the suite spawns stores in a fresh schema.
import './vercel-setup.js';
import { createTestSuite } from '@workflow/world-testing';
import { it } from 'vitest';
import { needsPostgres } from './helpers';

if (needsPostgres()) createTestSuite('./__test__/fixtures/vercel-postgres.mjs');
else it.skip('the conformance suite on a PostgreSQL world', () => {});
