// Where the event loop stalls during scenario (b) of `npm run bench` (64 runs x 1,000 appends at
// once, durability normal): the longest gaps between 1 ms timer ticks, each with when it began
// and how many appends settled within it, and the garbage collector's pauses.
//
//   node bench/stall.mjs [full|normal]
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PerformanceObserver } from 'node:perf_hooks';
import * as native from '@little-workflow/world';

const durability = process.argv[2] ?? 'normal';
const dir = mkdtempSync(join(tmpdir(), 'little-stall-'));
const w = native.localWorld({ dataDir: dir, durability });
const gcs = [];
const observer = new PerformanceObserver((list) => {
  for (const e of list.getEntries()) gcs.push(e.duration);
});
observer.observe({ entryTypes: ['gc'] });
const payload300 = (i) => ({ stepPath: `step/${i % 97}`, attempt: 1, note: 'n'.repeat(220), i });

const gaps = [];
let settled = 0;
let settledAtLastTick = 0;
const t0 = performance.now();
let last = t0;
const tick = () => {
  const now = performance.now();
  gaps.push({ ms: now - last, at: last - t0, settled: settled - settledAtLastTick });
  settledAtLastTick = settled;
  last = now;
};
const timer = setInterval(tick, 1);
await Promise.all(
  Array.from({ length: 64 }, async (_, r) => {
    for (let i = 0; i < 1000; i++) {
      await native.appendEvent(w, `run_b${r}`, { type: 'StepStarted', payload: payload300(i) });
      settled++;
    }
  }),
);
clearInterval(timer);
tick();
const total = performance.now() - t0;
observer.disconnect();
await w.close();
rmSync(dir, { recursive: true, force: true });

gaps.sort((a, b) => b.ms - a.ms);
const p99 = gaps[Math.floor(gaps.length / 100)].ms;
console.log(`durability ${durability}: ${(64_000 / (total / 1000)).toFixed(0)} appends/s, ${gaps.length} gaps, p99 ${p99.toFixed(2)} ms`);
console.log('longest gaps (ms @ ms since start, appends settled within):');
console.log('  ' + gaps.slice(0, 12).map((g) => `${g.ms.toFixed(1)} @${g.at.toFixed(0)} (${g.settled})`).join(', '));
gcs.sort((a, b) => b - a);
console.log(`gc: ${gcs.length} pauses, ${gcs.reduce((s, d) => s + d, 0).toFixed(1)} ms in all, longest ${(gcs[0] ?? 0).toFixed(1)} ms`);
