// materializeRunState over a run of 100,000 events, against listEvents plus a fold written in
// plain TypeScript (bench/baseline/fold.ts), measured in the same run. Prints figures; asserts
// nothing. Build the TypeScript first: `npm run bench:build` (npm run bench does it).
//
//   node bench/materialize.mjs [--quick]
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { appendEvent, bundledPricing, canonicalize, listEvents, localWorld, materializeRunState } from '@little-workflow/world';
import fold from './dist/baseline/fold.js';

const quick = process.argv.includes('--quick');
const N = quick ? 10_000 : 100_000;
const sha256 = (s) => createHash('sha256').update(s).digest('hex');
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

function eventFor(i) {
  const step = `step/${i % 50}`;
  switch (i % 4) {
    case 0:
      return { type: 'StepStarted', payload: { stepPath: step, stepKind: 'ai.generate' } };
    case 1:
    case 2:
      return {
        type: 'harness.model.responded',
        appendIdempotencyKey: `call-${i}`,
        payload: {
          turn: 1, callId: `c${i}`, stepPath: step,
          model: i % 3 ? { provider: 'openai', modelId: 'gpt-5' } : { provider: 'anthropic', modelId: 'claude-sonnet-4-5' },
          response: { text: 'a short answer', usage: { inputTokens: 1000 + (i % 97), outputTokens: 200 + (i % 13), cachedInputTokens: 100 } },
        },
      };
    default:
      return { type: 'StepCompleted', payload: { stepPath: step, output: { ok: true, n: i } } };
  }
}

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
console.log(`machine: ${cpus().length} x ${cpus()[0]?.model ?? 'unknown cpu'}, node ${process.version}`);
console.log(`run of ${N.toLocaleString('en-US')} events (half of them priced model calls); median of 5 rounds`);
console.log(`materializeRunState (native fold over stored rows): ${median(nativeMs).toFixed(1)} ms`);
console.log(`listEvents + TypeScript fold:                       ${median(tsMs).toFixed(1)} ms`);
console.log(`ratio: native is ${(median(tsMs) / median(nativeMs)).toFixed(2)}x faster; same state: ${same}`);
await world.close();
rmSync(dataDir, { recursive: true, force: true });
