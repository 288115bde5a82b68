// The PostgreSQL benchmark: the native `postgresWorld` against the pure-TypeScript world on
// node-postgres (bench/baseline/pg-world.ts), both at synchronous_commit=on (native durability
// 'full'), interleaved, in several rounds; prints medians, native/baseline ratios, the event-loop
// stall during (b) and peak RSS. Asserts nothing. Build the TypeScript first (`npm run bench:build`).
//
//   node scripts/with-postgres.mjs 'node bench/postgres.mjs [--rounds N] [--only a,b,b2,d,e,e0] [--quick]'
//
// (a) 1 run, 10,000 appends awaited one by one, 300-byte payloads
// (b) 64 runs x 1,000 appends at once          (b2) the same split across 2 processes at once
// (d) listEvents of a 100,000-event run        (e) materializeRunState of a 100,000-event run
// (e0) (e) with the run's fold snapshots removed, so the native fold reads the whole log
// Every measurement runs in a fresh child process (bench/pg-scenario.mjs) on a fresh schema, dropped
// after; (d) and (e) read a run prepared once per world, (e0) a second one whose snapshots are
// deleted after it is prepared. The server is LITTLE_TEST_DATABASE_URL's.
// --quick: a tenth of the events everywhere, for trying it out. --only-baseline: the baseline alone
// (no ratios), for a build without postgresWorld.
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import * as nativeLib from '@little-workflow/world';
import pg from 'pg';
import { machine, median } from './lib.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '3' },
    only: { type: 'string', default: 'a,b,b2,d,e,e0' },
    quick: { type: 'boolean', default: false },
    'only-baseline': { type: 'boolean', default: false },
  },
});
const rounds = Number(values.rounds);
const scenarios = values.only.split(',');
const kinds = values['only-baseline'] ? ['baseline'] : ['native', 'baseline'];
const url = process.env.LITTLE_TEST_DATABASE_URL;
if (!url) {
  console.error(`LITTLE_TEST_DATABASE_URL is not set. Either run the benchmark on a throwaway cluster:
  node scripts/with-postgres.mjs 'node bench/postgres.mjs'
or point it at a PostgreSQL server you may create and drop schemas on:
  LITTLE_TEST_DATABASE_URL=postgres://user@host:5432/db node bench/postgres.mjs`);
  process.exit(1);
}
if (kinds.includes('native') && typeof nativeLib.postgresWorld !== 'function') {
  console.error('this build of @little-workflow/world has no postgresWorld; --only-baseline measures the baseline alone');
  process.exit(1);
}

const q = values.quick ? 10 : 1;
const N = { a: 10_000 / q, runs: 64, per: 1000 / q, big: 100_000 / q };
const NAMES = {
  a: `(a) 1 run, ${N.a / 1000}k appends awaited`,
  b: `(b) ${N.runs} runs x ${N.per / 1000}k appends at once`,
  b2: `(b) split across 2 processes, combined`,
  d: `(d) listEvents, ${N.big / 1000}k events`,
  e: `(e) materializeRunState, ${N.big / 1000}k events`,
  e0: `(e) without a fold snapshot`,
};
const TARGET = { a: 1, b: 5, d: 2, e: 5 };
const unknown = scenarios.filter((s) => !(s in NAMES));
if (unknown.length > 0) {
  console.error(`unknown scenario ${unknown.join(', ')}: --only takes ${Object.keys(NAMES).join(',')}`);
  process.exit(1);
}

const prefix = `bench_${randomBytes(4).toString('hex')}`;
const admin = new pg.Client({ connectionString: url });
await admin.connect();
const created = new Set();
async function drop(schema) {
  await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  created.delete(schema);
}
async function cleanUp() {
  for (const s of [...created]) await drop(s).catch((e) => console.error(`could not drop schema ${s}: ${e.message}`));
  await admin.end().catch(() => undefined);
}
process.once('SIGINT', () => cleanUp().finally(() => process.exit(130)));

const scenarioScript = join(here, 'pg-scenario.mjs');
function child(kind, schema, args) {
  created.add(schema);
  const out = execFileSync(process.execPath, [scenarioScript, kind, schema, ...args], { encoding: 'utf8', maxBuffer: 1 << 20 });
  return JSON.parse(out.trim().split('\n').pop());
}

/** (b) in two processes on one schema, started together once both have connected. */
async function split(kind, schema) {
  child(kind, schema, ['init']); // so that the two do not race to create the tables
  const procs = [0, 1].map((p) => {
    const c = spawn(process.execPath, [scenarioScript, kind, schema, 'b', String(N.runs / 2), String(N.per), `p${p}_`, '--barrier'], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    let text = '';
    const ready = new Promise((resolve) => {
      c.stdout.on('data', (d) => {
        text += d;
        if (text.startsWith('ready\n')) resolve();
      });
    });
    const done = new Promise((resolve, reject) =>
      c.on('close', (code) => (code === 0 ? resolve(JSON.parse(text.trim().split('\n').pop())) : reject(new Error(`${kind} (b) process exited with ${code}`)))),
    );
    return { c, ready, done };
  });
  let x, y;
  try {
    await Promise.race([Promise.all(procs.map((p) => p.ready)), Promise.all(procs.map((p) => p.done))]);
    for (const p of procs) p.c.stdin.end('go\n');
    [x, y] = await Promise.all(procs.map((p) => p.done));
  } catch (e) {
    for (const p of procs) if (p.c.exitCode === null) p.c.kill();
    await Promise.allSettled(procs.map((p) => p.done));
    throw e;
  }
  const ms = Math.max(x.t1, y.t1) - Math.min(x.t0, y.t0);
  return { value: (N.runs * N.per) / (ms / 1000), unit: 'appends/s', stallP99Ms: Math.max(x.stallP99Ms, y.stallP99Ms), maxRssMB: Math.max(x.maxRssMB, y.maxRssMB) };
}

function measure(kind, s, round) {
  if (s === 'd' || s === 'e') return Promise.resolve(child(kind, `${prefix}_ds_${kind}`, [s, String(N.big)]));
  // The baseline keeps no snapshots: its (e0) is its (e), on the same run.
  if (s === 'e0') return Promise.resolve(child(kind, `${prefix}_${kind === 'native' ? 'ds0' : 'ds'}_${kind}`, ['e', String(N.big)]));
  const schema = `${prefix}_${s}_${kind}_${round}`;
  const run = s === 'b2' ? split(kind, schema) : Promise.resolve(child(kind, schema, s === 'a' ? ['a', String(N.a)] : ['b', String(N.runs), String(N.per), 'b']));
  return run.finally(() => drop(schema));
}

const results = new Map(); // "scenario kind" -> [measurements]
try {
  const settings = await admin.query(
    "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'fsync', 'synchronous_commit', 'wal_sync_method', 'max_connections', 'shared_buffers')",
  );
  console.log(`machine: ${machine()}`);
  console.log(`server: ${settings.rows.map((r) => `${r.name}=${r.setting}`).join(', ')}`);
  const sets = [
    ...(['d', 'e', 'e0'].some((x) => scenarios.includes(x)) ? ['ds'] : []),
    ...(scenarios.includes('e0') && kinds.includes('native') ? ['ds0'] : []),
  ];
  if (sets.length > 0) {
    process.stdout.write(`preparing the ${N.big.toLocaleString('en-US')}-event runs... `);
    for (const set of sets) {
      for (const kind of set === 'ds0' ? ['native'] : kinds) {
        const t0 = performance.now();
        const schema = `${prefix}_${set}_${kind}`;
        child(kind, schema, ['prepare', String(N.big)]);
        if (set === 'ds0' && kind === 'native') await admin.query(`DELETE FROM "${schema}".fold_snapshots`);
        process.stdout.write(`${set} ${kind} ${((performance.now() - t0) / 1000).toFixed(0)} s `);
      }
    }
    console.log('done');
  }
  for (let round = 1; round <= rounds; round++) {
    for (const s of scenarios) {
      const order = round % 2 ? kinds : [...kinds].reverse();
      for (const kind of order) {
        const key = `${s} ${kind}`;
        if (!results.has(key)) results.set(key, []);
        results.get(key).push(await measure(kind, s, round));
      }
    }
    console.log(`round ${round}/${rounds} done`);
  }
} finally {
  await cleanUp();
}

const fmt = (v, unit) => (unit === 'ms' ? `${v.toFixed(1)} ms` : `${Math.round(v).toLocaleString('en-US')}/s`);
const rss = (xs) => `${median(xs.map((x) => x.maxRssMB)).toFixed(0)} MB`;
if (kinds.length === 1) {
  console.log(`\nbaseline alone, synchronous_commit=on: medians of ${rounds} rounds${values.quick ? ' (--quick)' : ''}\n`);
  console.log('| scenario | baseline | peak RSS |');
  console.log('| --- | --- | --- |');
  for (const s of scenarios) {
    const b = results.get(`${s} baseline`);
    console.log(`| ${NAMES[s]} | ${fmt(median(b.map((x) => x.value)), b[0].unit)} | ${rss(b)} |`);
  }
} else {
  console.log(`\nsynchronous_commit=on (native durability 'full'): medians of ${rounds} rounds${values.quick ? ' (--quick)' : ''}`);
  console.log('(ratio: how many times better native is; higher is better)\n');
  console.log('| scenario | native | baseline | ratio | target | peak RSS native / baseline |');
  console.log('| --- | --- | --- | --- | --- | --- |');
  for (const s of scenarios) {
    const n = results.get(`${s} native`);
    const b = results.get(`${s} baseline`);
    const unit = n[0].unit;
    const nv = median(n.map((x) => x.value));
    const bv = median(b.map((x) => x.value));
    const ratio = unit === 'ms' ? bv / nv : nv / bv;
    const target = TARGET[s];
    const targetText = target ? `>= ${target}x ${ratio >= target ? 'met' : 'NOT met'}` : '';
    console.log(`| ${NAMES[s]} | ${fmt(nv, unit)} | ${fmt(bv, unit)} | ${ratio.toFixed(2)}x | ${targetText} | ${rss(n)} / ${rss(b)} |`);
  }
}
const stalled = ['b', 'b2'].filter((x) => scenarios.includes(x));
if (stalled.length > 0) console.log('\nevent-loop stall: p99 gap between 1 ms timer ticks (of the worse process in the split)');
for (const s of stalled) {
  const stall = kinds.map((kind) => `${kind} ${median(results.get(`${s} ${kind}`).map((x) => x.stallP99Ms)).toFixed(2)} ms`);
  console.log(`  ${NAMES[s]}: ${stall.join(', ')}`);
}
