// The Vercel Workflow SDK's World: this package's (`@little-workflow/world/vercel`) against the
// SDK's own local world (`@workflow/world-local`), on the same machine in one run. Prints figures
// and ratios; asserts nothing.
//
//   node bench/vercel.mjs [rounds] [--suite]      (default 3 rounds)
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
import { createWorld as localWorld, initDataDir } from '@workflow/world-local';
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

const kinds = {
  'little-workflow': async (dataDir) => littleWorld({ dataDir }),
  'world-local': async (dataDir) => {
    await initDataDir(dataDir);
    return localWorld({ dataDir });
  },
};

const results = { 'little-workflow': [], 'world-local': [] };
for (let r = 0; r < rounds; r++) {
  const order = r % 2 === 0 ? ['little-workflow', 'world-local'] : ['world-local', 'little-workflow'];
  for (const kind of order) {
    const dataDir = mkdtempSync(join(tmpdir(), 'little-bench-vercel-'));
    const world = await kinds[kind](dataDir);
    try {
      results[kind].push(await workload(world));
    } finally {
      await world.close?.();
      rmSync(dataDir, { recursive: true, force: true });
    }
  }
}

const fmt = (ms) => `${ms.toFixed(0)} ms`;
console.log(machine());
console.log(`${RUNS} runs x 20 events.create at once, then events.list of every run; median of ${rounds} rounds`);
console.log('| measure | little-workflow | world-local | ratio |');
console.log('| --- | ---: | ---: | ---: |');
for (const [label, key] of [['events.create (2,000 calls)', 'create'], ['events.list (100 runs)', 'list']]) {
  const ours = median(results['little-workflow'].map((x) => x[key]));
  const theirs = median(results['world-local'].map((x) => x[key]));
  console.log(`| ${label} | ${fmt(ours)} | ${fmt(theirs)} | ${(theirs / ours).toFixed(2)}x |`);
}

if (suite) {
  const root = fileURLToPath(new URL('..', import.meta.url));
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
