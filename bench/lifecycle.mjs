// `node bench/lifecycle.mjs [--runs N] [--list] [--prune] [--database-url URL]`: a local world (or,
// with --database-url, a new schema of a PostgreSQL world) of N finished runs (two events each,
// default 1,000,000) at durability `normal`:
// - the runs catalog: the first `queryRuns` page of 100 (newest first), the first page of one
//   status, a page deep in the listing (reached by its cursor), and, with `--list`, `listRuns` of
//   every run for comparison; medians of 5 (and the first call, which folds the page's runs for
//   their cost);
// - with `--prune`: `backupWorld` of the whole world (a local one), then `pruneRuns` of every run while another
//   caller appends to other runs one awaited append at a time: the prune's runs and events per
//   second, and those appends' latencies (p50, p99, max).
// Prints the peak RSS. Asserts nothing.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { appendEvent, backupWorld, listRuns, localWorld, postgresWorld, pruneRuns, queryRuns } from '@little-workflow/world';
import { machine, median } from './lib.mjs';

const { values } = parseArgs({
  options: {
    runs: { type: 'string', default: '1000000' },
    list: { type: 'boolean', default: false },
    prune: { type: 'boolean', default: false },
    'database-url': { type: 'string' },
  },
});
const runs = Number(values.runs);
const dataDir = mkdtempSync(join(tmpdir(), 'little-lifecycle-'));

async function timed(f, times = 5) {
  const ms = [];
  let out;
  for (let i = 0; i < times; i++) {
    const t = performance.now();
    out = await f();
    ms.push(performance.now() - t);
  }
  return [median(ms), out, ms[0]];
}

try {
  console.log(machine());
  const url = values['database-url'];
  const world = url ? postgresWorld({ connectionString: url, schema: `bench_lifecycle_${process.pid}`, durability: 'normal' }) : localWorld({ dataDir, durability: 'normal' });
  console.log(url ? 'a PostgreSQL world' : 'a local world');
  const t0 = performance.now();
  const BATCH = 2_000;
  for (let start = 0; start < runs; start += BATCH) {
    const batch = [];
    for (let i = start; i < Math.min(runs, start + BATCH); i++) {
      const runId = `run_${String(i).padStart(8, '0')}`;
      // One run in ten failed, the rest completed.
      const end = i % 10 === 0 ? { type: 'RunFailed', payload: { error: { message: 'x' } } } : { type: 'RunCompleted', payload: { output: i } };
      batch.push(appendEvent(world, runId, { type: 'RunStarted', payload: { input: i } }).then(() => appendEvent(world, runId, end)));
    }
    await Promise.all(batch);
  }
  const writeS = (performance.now() - t0) / 1000;
  console.log(`wrote ${runs.toLocaleString('en-US')} runs (${(2 * runs).toLocaleString('en-US')} events) in ${writeS.toFixed(1)} s`);

  const [first, page, cold] = await timed(() => queryRuns(world, { limit: 100 }));
  const [failed] = await timed(() => queryRuns(world, { limit: 100, status: ['failed'] }));
  // A cursor about half way down, reached by pages of 10,000.
  let cursor = page.cursor;
  for (let walked = 100; walked < runs / 2 && cursor !== null; walked += 10_000) {
    cursor = (await queryRuns(world, { limit: 10_000, cursor })).cursor;
  }
  const [deep] = cursor === null ? [NaN] : await timed(() => queryRuns(world, { limit: 100, cursor }));
  const rows = [
    ['queryRuns, first page of 100, first call', cold],
    ['queryRuns, first page of 100 (newest)', first],
    ['queryRuns, first page of 100 (status failed)', failed],
    ['queryRuns, a page of 100 half way down', deep],
  ];
  if (values.list) {
    const [all, listed] = await timed(() => listRuns(world), 1);
    rows.push([`listRuns, all ${listed.length.toLocaleString('en-US')} runs`, all]);
    console.log(`listRuns / first page: ${(all / first).toFixed(0)}x`);
  }
  for (const [name, ms] of rows) console.log(`${name.padEnd(48)} ${ms.toFixed(2).padStart(10)} ms`);
  if (values.prune) {
    let t = performance.now();
    if (!url) {
      const to = join(dataDir, '..', `${dataDir.split('/').at(-1)}-backup`);
      await backupWorld(world, to);
      console.log(`backupWorld of ${runs.toLocaleString('en-US')} runs: ${((performance.now() - t) / 1000).toFixed(2)} s`);
      rmSync(to, { recursive: true, force: true });
    }
    // Appends to other runs, one awaited at a time, for as long as the prune runs.
    let pruning = true;
    const latencies = [];
    const appender = (async () => {
      for (let i = 0; pruning; i++) {
        const a = performance.now();
        await appendEvent(world, `run_live_${i % 100}`, { type: 'StepStarted', payload: { stepPath: `s/${i}` } });
        latencies.push(performance.now() - a);
      }
    })();
    t = performance.now();
    const pruned = await pruneRuns(world, { endedBefore: new Date(Date.now() + 60_000) });
    const pruneS = (performance.now() - t) / 1000;
    pruning = false;
    await appender;
    latencies.sort((a, b) => a - b);
    const at = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))];
    console.log(
      `pruneRuns: ${pruned.runs.toLocaleString('en-US')} runs, ${pruned.events.toLocaleString('en-US')} events in ${pruneS.toFixed(1)} s: ` +
        `${Math.round(pruned.runs / pruneS).toLocaleString('en-US')} runs/s, ${Math.round(pruned.events / pruneS).toLocaleString('en-US')} events/s`,
    );
    console.log(
      `appends to other runs meanwhile: ${latencies.length.toLocaleString('en-US')}, p50 ${at(0.5).toFixed(2)} ms, p99 ${at(0.99).toFixed(2)} ms, max ${latencies.at(-1).toFixed(2)} ms`,
    );
  }
  console.log(`peak RSS ${(process.resourceUsage().maxRSS / 1024).toFixed(0)} MB`);
  await world.close();
} finally {
  rmSync(dataDir, { recursive: true, force: true });
}
