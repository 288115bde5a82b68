// materializeRunState over a run of 100,000 events, against listEvents plus a fold written in
// plain TypeScript (bench/baseline/fold.ts), measured in the same run. Prints figures; asserts
// nothing. Build the TypeScript first: `npm run bench:build` (npm run bench does it).
//
//   node bench/materialize.mjs [--quick]
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { appendEvent, bundledPricing, canonicalize, listEvents, localWorld, materializeRunState } from '@little-workflow/world';
import fold from './dist/baseline/fold.js';
import { eventFor, machine, median } from './lib.mjs';

const quick = process.argv.includes('--quick');
const N = quick ? 10_000 : 100_000;
const sha256 = (s) => createHash('sha256').update(s).digest('hex');

const dataDir = mkdtempSync(join(tmpdir(), 'little-bench-mat-'));
const world = localWorld({ dataDir, durability: 'normal' });
const runId = 'run_materialize';
for (let i = 0; i < N; i += 1000) {
  await Promise.all(Array.from({ length: 1000 }, (_, j) => appendEvent(world, runId, eventFor(i + j))));
}
const table = fold.pricingTable(bundledPricing());
const nativeMs = [];
const tsMs = [];
let same = true;
for (let round = 0; round < 5; round++) {
  let t0 = performance.now();
  const a = await materializeRunState(world, runId);
  nativeMs.push(performance.now() - t0);
  t0 = performance.now();
  const events = await listEvents(world, runId);
  const b = fold.foldRun(runId, events, table, canonicalize, sha256);
  tsMs.push(performance.now() - t0);
  same &&= canonicalize(a) === canonicalize(b);
}
console.log(`machine: ${machine()}`);
console.log(`run of ${N.toLocaleString('en-US')} events (half of them priced model calls); median of 5 rounds`);
console.log(`materializeRunState (native fold over stored rows): ${median(nativeMs).toFixed(1)} ms`);
console.log(`listEvents + TypeScript fold:                       ${median(tsMs).toFixed(1)} ms`);
console.log(`ratio: native is ${(median(tsMs) / median(nativeMs)).toFixed(2)}x faster; same state: ${same}`);
await world.close();
rmSync(dataDir, { recursive: true, force: true });
