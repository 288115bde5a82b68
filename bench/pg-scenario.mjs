// One measurement of one scenario on one PostgreSQL world, run in a child process by
// bench/postgres.mjs so that every measurement starts from a fresh heap and its own connections,
// and reports its own peak RSS. The server is LITTLE_TEST_DATABASE_URL's.
//
//   node bench/pg-scenario.mjs <native|baseline> <schema> a <n>
//   node bench/pg-scenario.mjs <native|baseline> <schema> b <runs> <per run> <run prefix> [--barrier]
//   node bench/pg-scenario.mjs <native|baseline> <schema> <d|e> <n>     (reads run_big, prepared)
//   node bench/pg-scenario.mjs <native|baseline> <schema> prepare <n>   (writes run_big)
//   node bench/pg-scenario.mjs <native|baseline> <schema> init          (creates the world's tables)
//
// Measurements run at durability 'full' (the baseline: synchronous_commit=on); `prepare` at
// 'normal'. With --barrier, (b) opens the world, prints "ready" and starts on a line on stdin, so
// that two processes start together. Prints one JSON line: { value, unit, stallP99Ms?, t0?, t1?,
// maxRssMB } (t0, t1: when the appends started and ended, in ms since the epoch).
import * as native from '@little-workflow/world';
import pgBaselineLib from './dist/baseline/pg-world.js';
import { eventFor, withStall } from './lib.mjs';

const [kind, schema, scenario, ...rest] = process.argv.slice(2).filter((a) => a !== '--barrier');
const barrier = process.argv.includes('--barrier');
const connectionString = process.env.LITTLE_TEST_DATABASE_URL;
// The 300-byte payload of bench/scenario.mjs's (a) and (b).
const payload300 = (i) => ({ stepPath: `step/${i % 97}`, attempt: 1, note: 'n'.repeat(220), i });

/** A world with the same small interface for both kinds. */
function open(durability) {
  if (kind === 'native') {
    if (typeof native.postgresWorld !== 'function') throw new Error('this build of @little-workflow/world has no postgresWorld');
    const w = native.postgresWorld({ connectionString, schema, durability });
    return {
      append: (runId, input) => native.appendEvent(w, runId, input),
      list: (runId) => native.listEvents(w, runId),
      materialize: (runId) => native.materializeRunState(w, runId),
      close: () => w.close(),
    };
  }
  const w = new pgBaselineLib.PgBaselineWorld(connectionString, schema, durability);
  return {
    append: (runId, input) => w.appendEvent(runId, input),
    list: (runId) => w.listEvents(runId),
    materialize: (runId) => w.materializeRunState(runId, native.bundledPricing()),
    close: () => w.close(),
  };
}

const nextLine = () => new Promise((resolve) => process.stdin.once('data', resolve));
const epochMs = () => performance.timeOrigin + performance.now();
const seconds = (t0) => (performance.now() - t0) / 1000;

const w = open(scenario === 'prepare' ? 'normal' : 'full');
// Outside the measurement: the first connection, and the tables of a fresh schema. A world may
// refuse to list a run it has never seen; either way it has connected.
await w.list('run_warmup').catch(() => undefined);
let out = {};
if (scenario === 'prepare') {
  const n = Number(rest[0]);
  for (let i = 0; i < n; i += 1000) {
    await Promise.all(Array.from({ length: Math.min(1000, n - i) }, (_, j) => w.append('run_big', eventFor(i + j))));
  }
} else if (scenario === 'a') {
  const n = Number(rest[0]);
  const t0 = performance.now();
  for (let i = 0; i < n; i++) await w.append('run_a', { type: 'StepStarted', payload: payload300(i) });
  out = { value: n / seconds(t0), unit: 'appends/s' };
} else if (scenario === 'b') {
  const [runs, per] = rest.slice(0, 2).map(Number);
  const prefix = rest[2];
  if (barrier) {
    process.stdout.write('ready\n');
    await nextLine();
    process.stdin.pause();
  }
  const start = epochMs();
  const t0 = performance.now();
  const { p99 } = await withStall(() =>
    Promise.all(Array.from({ length: runs }, async (_, r) => {
      for (let i = 0; i < per; i++) await w.append(`run_${prefix}${r}`, { type: 'StepStarted', payload: payload300(i) });
    })),
  );
  out = { value: (runs * per) / seconds(t0), unit: 'appends/s', stallP99Ms: p99, t0: start, t1: epochMs() };
} else if (scenario === 'd' || scenario === 'e') {
  const n = Number(rest[0]);
  const t0 = performance.now();
  if (scenario === 'd') {
    const events = await w.list('run_big');
    if (events.length !== n) throw new Error(`listed ${events.length}`);
  } else {
    const state = await w.materialize('run_big');
    if (state.eventCount !== n) throw new Error(`folded ${state.eventCount}`);
  }
  out = { value: performance.now() - t0, unit: 'ms' };
} else if (scenario !== 'init') {
  throw new Error(`unknown scenario ${scenario}`);
}
await w.close();
out.maxRssMB = process.resourceUsage().maxRSS / 1024;
console.log(JSON.stringify(out));
