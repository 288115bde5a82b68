// The Vercel Workflow SDK's World: this package's (`@little-workflow/world/vercel`) against the
// SDK's own worlds, on the same machine in one run. On a local data directory against
// `@workflow/world-local`; given a PostgreSQL server (LITTLE_TEST_DATABASE_URL, as
// scripts/with-postgres.mjs sets it), on a PostgreSQL world against `@workflow/world-postgres`
// 4.3.7 (of the stable line), both on that server at `synchronous_commit=on` (durability `full`).
// Prints figures and ratios; asserts nothing.
//
//   node scripts/with-postgres.mjs 'node bench/vercel.mjs [rounds] [--suite]'   (default 3 rounds)
//
// The workload: 100 runs at once, each making 20 `events.create` calls in order (run created and
// started, five steps created, started and completed, a wait created and completed, the run
// completed), then `events.list` of every run. Each round runs it on both worlds, alternating
// which goes first, each in a fresh data directory; the medians are printed. With `--suite`, it
// also times the SDK's conformance suite (`__test__/vercel.test.ts`) against both worlds.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createWorld as littleWorld } from '@little-workflow/world/vercel';
import { postgresWorld } from '@little-workflow/world';
import { createWorld as localWorld, initDataDir } from '@workflow/world-local';
import { createWorld as sdkPostgresWorld } from '@workflow/world-postgres';
import pg from 'pg';
import { machine, median } from './lib.mjs';

const args = process.argv.slice(2);
const suite = args.includes('--suite');
const rounds = Number(args.find((a) => !a.startsWith('--')) ?? 3);
const RUNS = 100;
const bytes = (n) => new Uint8Array(64).fill(n % 251);

/** One run's 20 calls, in order. */
async function oneRun(world, i) {
  const created = await world.events.create(null, {
    eventType: 'run_created',
    eventData: { deploymentId: 'dpl_bench', workflowName: 'bench', input: bytes(i) },
  });
  const runId = created.run.runId;
  await world.events.create(runId, { eventType: 'run_started' });
  for (let s = 0; s < 5; s++) {
    const correlationId = `step_${String(i).padStart(3, '0')}_${s}`;
    await world.events.create(runId, { eventType: 'step_created', correlationId, eventData: { stepName: 'add', input: bytes(s) } });
    await world.events.create(runId, { eventType: 'step_started', correlationId });
    await world.events.create(runId, { eventType: 'step_completed', correlationId, eventData: { result: bytes(s + 1) } });
  }
  const wait = `wait_${String(i).padStart(3, '0')}`;
  await world.events.create(runId, { eventType: 'wait_created', correlationId: wait, eventData: { resumeAt: new Date(Date.now() + 1000) } });
  await world.events.create(runId, { eventType: 'wait_completed', correlationId: wait });
  await world.events.create(runId, { eventType: 'run_completed', eventData: { output: bytes(i + 1) } });
  return runId;
}

/** The workload on `world`: milliseconds for the creates, and for the listings. */
async function workload(world) {
  const t0 = performance.now();
  const runIds = await Promise.all(Array.from({ length: RUNS }, (_, i) => oneRun(world, i)));
  const t1 = performance.now();
  let events = 0;
  for (const runId of runIds) {
    let cursor;
    do {
      const page = await world.events.list({ runId, pagination: { sortOrder: 'asc', cursor, limit: 100 } });
      events += page.data.length;
      cursor = page.hasMore ? page.cursor : undefined;
    } while (cursor);
  }
  const t2 = performance.now();
  if (events !== RUNS * 20) throw new Error(`listed ${events} events, expected ${RUNS * 20}`);
  return { create: t1 - t0, list: t2 - t1 };
}

const databaseUrl = process.env.LITTLE_TEST_DATABASE_URL;
const root = fileURLToPath(new URL('..', import.meta.url));

/** The SDK PostgreSQL world's tables, made once by its own setup, emptied before each round. */
async function sdkPostgresTables() {
  const setup = spawnSync(process.execPath, [join(root, 'node_modules', '@workflow', 'world-postgres', 'bin', 'setup.js')], {
    env: { ...process.env, WORKFLOW_POSTGRES_URL: databaseUrl },
    encoding: 'utf8',
  });
  if (setup.status !== 0) throw new Error(`the SDK PostgreSQL world's setup failed:\n${setup.stdout}\n${setup.stderr}`);
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    const { rows } = await client.query("SELECT tablename FROM pg_tables WHERE schemaname = 'workflow'");
    return rows.map((r) => `workflow."${r.tablename}"`);
  } finally {
    await client.end();
  }
}

/** Each kind of World measured: how to open one on a fresh store, and how to let it go. */
const kinds = {
  'little-workflow': async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'little-bench-vercel-'));
    return { world: littleWorld({ dataDir }), done: () => rmSync(dataDir, { recursive: true, force: true }) };
  },
  'world-local': async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'little-bench-vercel-'));
    await initDataDir(dataDir);
    return { world: localWorld({ dataDir }), done: () => rmSync(dataDir, { recursive: true, force: true }) };
  },
};
const pairs = [['little-workflow', 'world-local', 'a local data directory']];
if (databaseUrl !== undefined) {
  const tables = await sdkPostgresTables();
  let n = 0;
  kinds['little-workflow (PostgreSQL)'] = async () => {
    const schema = `bench_vercel_${process.pid}_${n++}`;
    const store = postgresWorld({ connectionString: databaseUrl, schema, durability: 'full' });
    const drop = async () => {
      await store.close();
      const client = new pg.Client({ connectionString: databaseUrl });
      await client.connect();
      await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await client.end();
    };
    return { world: littleWorld({ world: store }), done: drop };
  };
  kinds['world-postgres 4.3.7'] = async () => {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    await client.query(`TRUNCATE ${tables.join(', ')}`);
    await client.end();
    return { world: sdkPostgresWorld({ connectionString: databaseUrl }), done: () => {} };
  };
  pairs.push(['little-workflow (PostgreSQL)', 'world-postgres 4.3.7', 'one PostgreSQL server, synchronous_commit=on']);
} else {
  console.log('SKIPPED: the PostgreSQL worlds, for want of a server: run through scripts/with-postgres.mjs, or set LITTLE_TEST_DATABASE_URL');
}

const results = Object.fromEntries(Object.keys(kinds).map((k) => [k, []]));
for (let r = 0; r < rounds; r++) {
  for (const [a, b] of pairs) {
    for (const kind of r % 2 === 0 ? [a, b] : [b, a]) {
      const { world, done } = await kinds[kind]();
      try {
        results[kind].push(await workload(world));
      } finally {
        await world.close?.();
        await done();
      }
    }
  }
}

const fmt = (ms) => `${ms.toFixed(0)} ms`;
console.log(machine());
console.log(`${RUNS} runs x 20 events.create at once, then events.list of every run; median of ${rounds} rounds`);
for (const [ours, theirs, where] of pairs) {
  console.log(`\nOn ${where}:`);
  console.log(`| measure | ${ours} | ${theirs} | ratio |`);
  console.log('| --- | ---: | ---: | ---: |');
  for (const [label, key] of [['events.create (2,000 calls)', 'create'], ['events.list (100 runs)', 'list']]) {
    const a = median(results[ours].map((x) => x[key]));
    const b = median(results[theirs].map((x) => x[key]));
    console.log(`| ${label} | ${fmt(a)} | ${fmt(b)} | ${(b / a).toFixed(2)}x |`);
  }
}

if (suite) {
  const timeSuite = (target) => {
    const t0 = performance.now();
    const run = spawnSync(process.execPath, [join(root, 'node_modules', 'vitest', 'vitest.mjs'), 'run', '__test__/vercel.test.ts'], {
      cwd: root,
      env: { ...process.env, LITTLE_VERCEL_SUITE_TARGET: target },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const seconds = (performance.now() - t0) / 1000;
    const tests = /^\s*Tests\s+(.*)$/m.exec(String(run.stdout).replace(/\x1b\[[0-9;]*m/g, ''))?.[1]?.trim() ?? `none ran (exit ${run.status})`;
    return { seconds, tests };
  };
  const ours = timeSuite('./vercel.mjs');
  const theirs = timeSuite('@workflow/world-local');
  console.log('\nThe SDK conformance suite (12 tests), wall time including its servers:');
  console.log('| world | time | tests |');
  console.log('| --- | ---: | --- |');
  console.log(`| little-workflow | ${ours.seconds.toFixed(1)} s | ${ours.tests} |`);
  console.log(`| world-local | ${theirs.seconds.toFixed(1)} s | ${theirs.tests} |`);
  console.log(`ratio (world-local time / little-workflow time): ${(theirs.seconds / ours.seconds).toFixed(2)}x`);
}
