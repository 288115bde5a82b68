// Event-log throughput of the native world. Prints figures; asserts nothing.
//
//   node bench/events.mjs [--quick]
//
// - appends/s for 1 run, each append awaited before the next;
// - appends/s for 64 runs appending at once (each run awaits its own appends, 64 in flight);
//   both at durability 'full' and 'normal';
// - listEvents over one run of 100,000 events.
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { appendEvent, listEvents, localWorld } from '@little-workflow/world';

const quick = process.argv.includes('--quick');
const payload = (i) => ({ stepPath: `step/${i % 97}`, note: 'x'.repeat(200), i, tags: ['alpha', 'beta'], ok: true });

async function withWorld(durability, f) {
  const dataDir = mkdtempSync(join(tmpdir(), 'little-bench-'));
  const world = localWorld({ dataDir, durability });
  try {
    return await f(world);
  } finally {
    await world.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

async function sequential(durability, n) {
  return withWorld(durability, async (world) => {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < n; i++) await appendEvent(world, 'run_seq', { type: 'StepStarted', payload: payload(i) });
    return n / (Number(process.hrtime.bigint() - t0) / 1e9);
  });
}

async function concurrent(durability, runs, perRun) {
  return withWorld(durability, async (world) => {
    const t0 = process.hrtime.bigint();
    await Promise.all(
      Array.from({ length: runs }, async (_, r) => {
        for (let i = 0; i < perRun; i++) await appendEvent(world, `run_c${r}`, { type: 'StepStarted', payload: payload(i) });
      }),
    );
    return (runs * perRun) / (Number(process.hrtime.bigint() - t0) / 1e9);
  });
}

async function listing(n) {
  return withWorld('normal', async (world) => {
    const batch = 1000;
    for (let i = 0; i < n; i += batch) {
      await Promise.all(Array.from({ length: batch }, (_, j) => appendEvent(world, 'run_list', { type: 'StepStarted', payload: payload(i + j) })));
    }
    const times = [];
    for (let k = 0; k < 5; k++) {
      const t0 = process.hrtime.bigint();
      const events = await listEvents(world, 'run_list');
      times.push(Number(process.hrtime.bigint() - t0) / 1e6);
      if (events.length !== n) throw new Error(`listed ${events.length}`);
    }
    times.sort((a, b) => a - b);
    return times[Math.floor(times.length / 2)];
  });
}

const fmt = (x) => Math.round(x).toLocaleString('en-US');
console.log(`machine: ${cpus().length} x ${cpus()[0]?.model ?? 'unknown cpu'}, node ${process.version}, ${process.platform}-${process.arch}`);
const seqN = quick ? 300 : 2000;
const perRun = quick ? 100 : 1000;
for (const durability of ['full', 'normal']) {
  console.log(`1 run, awaited one by one, durability ${durability}: ${fmt(await sequential(durability, seqN))} appends/s`);
  console.log(`64 runs at once (${perRun} each), durability ${durability}: ${fmt(await concurrent(durability, 64, perRun))} appends/s`);
}
const listN = quick ? 10_000 : 100_000;
const ms = await listing(listN);
console.log(`listEvents of ${fmt(listN)} events: ${ms.toFixed(1)} ms median of 5 (${fmt(listN / (ms / 1000))} events/s)`);
