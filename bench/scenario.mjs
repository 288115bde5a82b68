// One measurement of one scenario on one world, run in a child process by bench/run.mjs so that
// every measurement starts from a fresh heap and reports its own peak RSS.
//
//   node bench/scenario.mjs <native|baseline> <scenario> <full|normal> <workDir>
//
// Prints one JSON line: { value, unit, stallP99Ms?, maxRssMB }.
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import * as native from '@little-workflow/world';
import baselineLib from './dist/baseline/world.js';
import { withStall } from './lib.mjs';

const [kind, scenario, durability, workDir] = process.argv.slice(2);
const { BaselineWorld } = baselineLib;
const payload300 = (i) => ({ stepPath: `step/${i % 97}`, attempt: 1, note: 'n'.repeat(220), i });
const big = 'x'.repeat(64 * 1024 - 40);

/** A world with the same small interface for both kinds. */
function open(dataDir) {
  if (kind === 'native') {
    const w = native.localWorld({ dataDir, durability });
    return {
      append: (runId, input) => native.appendEvent(w, runId, input),
      list: (runId) => native.listEvents(w, runId),
      materialize: (runId) => native.materializeRunState(w, runId),
      read: (ref) => native.readArtifact(w, ref),
      close: () => w.close(),
    };
  }
  const w = new BaselineWorld(dataDir, durability);
  return {
    append: (runId, input) => w.appendEvent(runId, input),
    list: (runId) => w.listEvents(runId),
    materialize: (runId) => w.materializeRunState(runId, native.bundledPricing()),
    read: (ref) => w.readArtifact(ref),
    close: () => w.close(),
  };
}

const seconds = (t0) => (performance.now() - t0) / 1000;
let out;
const scratch = mkdtempSync(join(workDir, `${kind}-${scenario}-`));
try {
  if (scenario === 'a' || scenario === 'b' || scenario === 'c') {
    const w = open(scratch);
    const t0 = performance.now();
    let n;
    if (scenario === 'a') {
      n = 10_000;
      for (let i = 0; i < n; i++) await w.append('run_a', { type: 'StepStarted', payload: payload300(i) });
      out = { value: n / seconds(t0), unit: 'appends/s' };
    } else if (scenario === 'b') {
      const runs = 64;
      const per = 1000;
      n = runs * per;
      const { p99 } = await withStall(() =>
        Promise.all(Array.from({ length: runs }, async (_, r) => {
          for (let i = 0; i < per; i++) await w.append(`run_b${r}`, { type: 'StepStarted', payload: payload300(i) });
        })),
      );
      out = { value: n / seconds(t0), unit: 'appends/s', stallP99Ms: p99 };
    } else {
      // 1,000 appends of 64 KiB issued at once (a throughput figure, like (b)): the baseline
      // serializes them on its per-run chain, the native world pipelines and groups them.
      n = 1000;
      await Promise.all(Array.from({ length: n }, (_, i) => w.append('run_c', { type: 'StepStarted', payload: { stepPath: `s${i}`, blob: big } })));
      out = { value: n / seconds(t0), unit: 'appends/s' };
    }
    await w.close();
    // Counting close() too, which finishes the WAL checkpointing either world left to do.
    out.withClose = n / seconds(t0);
  } else {
    // d, e, f read a dataset prepared once by bench/run.mjs.
    const w = open(join(workDir, `dataset-${kind}`));
    const t0 = performance.now();
    if (scenario === 'd') {
      const events = await w.list('run_big');
      if (events.length !== 100_000) throw new Error(`listed ${events.length}`);
      out = { value: (performance.now() - t0), unit: 'ms' };
    } else if (scenario === 'e') {
      const state = await w.materialize('run_big');
      if (state.eventCount !== 100_000) throw new Error(`folded ${state.eventCount}`);
      out = { value: (performance.now() - t0), unit: 'ms' };
    } else if (scenario === 'f') {
      const ref = (await import('node:fs')).readFileSync(join(workDir, `dataset-${kind}`, 'artifact-ref.txt'), 'utf8');
      let total = 0;
      for (let i = 0; i < 8; i++) total += (await w.read(ref)).payload.length;
      out = { value: total / (1024 * 1024) / seconds(t0), unit: 'MB/s' };
    }
    await w.close();
  }
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
out.maxRssMB = process.resourceUsage().maxRSS / 1024;
console.log(JSON.stringify(out));
