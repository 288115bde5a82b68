// How long an event appended by another process takes to reach a subscriber. Prints figures;
// asserts nothing.
//
//   node bench/subscribe.mjs [count]      (default 200)
//   node scripts/with-postgres.mjs 'node bench/subscribe.mjs --postgres [count]'
//
// A child process appends `count` events, each stamped with its wall-clock time, 20 ms apart;
// this process subscribes to the run on the same data directory (with --postgres: the same
// schema of LITTLE_TEST_DATABASE_URL's server) and records, for each event, the time from just
// before the child's append to its arrival here.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { listEvents, localWorld, postgresWorld, subscribe } from '@little-workflow/world';
import pg from 'pg';
import { machine } from './lib.mjs';

const args = process.argv.slice(2);
const postgres = args[0] === '--postgres';
const count = Number(args[postgres ? 1 : 0] ?? 200);
const dataDir = mkdtempSync(join(tmpdir(), 'little-bench-sub-'));
const url = process.env.LITTLE_TEST_DATABASE_URL;
if (postgres && !url) throw new Error("--postgres needs LITTLE_TEST_DATABASE_URL: run it through node scripts/with-postgres.mjs");
const schema = `bench_sub_${process.pid}`;
const options = postgres ? { connectionString: url, schema, durability: 'normal' } : { dataDir, durability: 'normal' };
const open = postgres ? postgresWorld : localWorld;
const child = join(dataDir, 'child.mjs');
writeFileSync(
  child,
  `import { ${postgres ? 'postgresWorld' : 'localWorld'} as open, appendEvent } from ${JSON.stringify(new URL('../world.mjs', import.meta.url).href)};
   const w = open(${JSON.stringify(options)});
   for (let i = 0; i < ${count}; i++) {
     await appendEvent(w, 'run_live', { type: 'Tick', payload: { i, sentAt: Date.now() } });
     await new Promise((r) => setTimeout(r, 20));
   }
   await w.close();`,
);
const world = open(options);
await listEvents(world, 'run_none'); // connects (and makes a PostgreSQL schema) before the child starts
const controller = new AbortController();
const delays = [];
const reading = (async () => {
  for await (const e of subscribe(world, 'run_live', { signal: controller.signal })) {
    delays.push(Date.now() - e.payload.sentAt);
    if (delays.length === count) controller.abort();
  }
})();
await new Promise((resolve, reject) => spawn(process.execPath, [child], { stdio: 'inherit' }).on('exit', (c) => (c === 0 ? resolve() : reject(new Error(`child exited ${c}`)))));
await reading;
await world.close();
rmSync(dataDir, { recursive: true, force: true });
if (postgres) {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  await c.query(`DROP SCHEMA "${schema}" CASCADE`);
  await c.end();
}
delays.sort((a, b) => a - b);
const at = (q) => delays[Math.min(delays.length - 1, Math.floor(delays.length * q))];
console.log(`machine: ${machine()}`);
console.log(`${count} events from another process: delivery p50 ${at(0.5)} ms, p99 ${at(0.99)} ms, max ${delays[delays.length - 1]} ms (${postgres ? 'woken by NOTIFY' : 'woken by changes to the log files'}, polling every 100 ms as a backstop)`);
