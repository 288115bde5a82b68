// `npm run bench`: every scenario on the native world and on the pure-TypeScript baseline
// (bench/baseline/world.ts), interleaved, in several rounds; prints medians, native/baseline
// ratios, the event-loop stall during (b) and peak RSS. Asserts nothing.
//
//   node bench/run.mjs [--rounds N] [--only a,b,...]
//
// (a) 1 run, 10,000 appends awaited one by one, 300-byte payloads
// (b) 64 runs x 1,000 appends at once          (c) 1,000 appends of 64 KiB payloads, issued at once
// (d) listEvents of a 100,000-event run        (e) materializeRunState of a 100,000-event run
// (f) readArtifact of 16 MiB
// Each at durability full and normal. Every measurement runs in a fresh child process.
//
//   node bench/run.mjs --compare <addon.node>
//
// measures this build against another build of the addon (an earlier commit's, say) instead of
// the baseline, interleaved in the same way: the ratio is how many times better this build is.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import * as nativeLib from '@little-workflow/world';
import baselineLib from './dist/baseline/world.js';
import { eventFor, machine, median, opensslSha256MBps } from './lib.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const { values } = parseArgs({
  options: { rounds: { type: 'string', default: '3' }, only: { type: 'string', default: 'a,b,c,d,e,f' }, compare: { type: 'string' } },
});
// The other side of each ratio: the TypeScript baseline, or another build of the addon.
const other = values.compare === undefined ? 'baseline' : 'compared';
const rounds = Number(values.rounds);
const scenarios = values.only.split(',');
const work = mkdtempSync(join(tmpdir(), 'little-bench-'));

const NAMES = {
  a: '(a) 1 run, 10k appends awaited',
  b: '(b) 64 runs x 1k appends at once',
  c: '(c) 1k appends of 64 KiB at once',
  d: '(d) listEvents, 100k events',
  e: '(e) materializeRunState, 100k events',
  f: '(f) readArtifact, 16 MiB',
};
const TARGET = {
  'a full': ['>=', 1], 'a normal': ['>=', 1],
  'b full': ['>=', 10], 'b normal': ['>=', 3],
  'c normal': ['>=', 3],
  'd full': ['>=', 3], 'd normal': ['>=', 3],
  'e full': ['>=', 5], 'e normal': ['>=', 5],
};

async function prepare() {
  const blob = Buffer.alloc(16 * 1024 * 1024);
  for (let i = 0; i < blob.length; i += 4096) blob.writeUInt32LE(i, i);
  const art = { runId: 'run_big', stepPath: 'f', name: 'blob', contentType: 'application/octet-stream', encoding: 'bytes', payload: blob };
  const nDir = join(work, 'dataset-native');
  const nw = nativeLib.localWorld({ dataDir: nDir, durability: 'normal' });
  for (let i = 0; i < 100_000; i += 1000) await Promise.all(Array.from({ length: 1000 }, (_, j) => nativeLib.appendEvent(nw, 'run_big', eventFor(i + j))));
  writeFileSync(join(nDir, 'artifact-ref.txt'), (await nativeLib.writeArtifact(nw, art)).artifactRef);
  await nw.close();
  if (other === 'compared') return;
  const bDir = join(work, 'dataset-baseline');
  const bw = new baselineLib.BaselineWorld(bDir, 'normal');
  for (let i = 0; i < 100_000; i += 1000) await Promise.all(Array.from({ length: 1000 }, (_, j) => bw.appendEvent('run_big', eventFor(i + j))));
  writeFileSync(join(bDir, 'artifact-ref.txt'), (await bw.writeArtifact(art)).artifactRef);
  bw.close();
}

function measure(kind, scenario, durability) {
  // Another build runs as native, on the native datasets, loaded in place of this one.
  const env = kind === 'compared' ? { ...process.env, NAPI_RS_NATIVE_LIBRARY_PATH: values.compare } : process.env;
  const as = kind === 'compared' ? 'native' : kind;
  const out = execFileSync(process.execPath, [join(here, 'scenario.mjs'), as, scenario, durability, work], { encoding: 'utf8', maxBuffer: 1 << 20, env });
  return JSON.parse(out.trim().split('\n').pop());
}

console.log(`machine: ${machine()}`);
// The sha256 ceiling moves with the machine's load as much as the reads do, so it is measured
// beside (f) in every round, and its median is the yardstick.
const ceilings = [];
// Also on blocks of the artifact's size, which do not stay in the caches: where hashing from memory
// is slower than from cache (as on CPUs with SHA extensions), this is what hashing the 16 MiB
// artifact alone can reach. Printed beside the target, which stays on the 16 KiB figure.
const bigCeilings = [];
process.stdout.write('preparing the 100,000-event datasets and the 16 MiB artifact... ');
await prepare();
console.log('done');

const results = new Map(); // "scenario durability kind" -> [measurements]
for (let round = 1; round <= rounds; round++) {
  for (const s of scenarios) {
    for (const durability of ['full', 'normal']) {
      if (s === 'f') {
        const c = opensslSha256MBps();
        if (c) ceilings.push(c);
        const big = opensslSha256MBps(16 * 1024 * 1024);
        if (big) bigCeilings.push(big);
      }
      const order = round % 2 ? ['native', other] : [other, 'native'];
      for (const kind of order) {
        const key = `${s} ${durability} ${kind}`;
        if (!results.has(key)) results.set(key, []);
        results.get(key).push(measure(kind, s, durability));
      }
    }
  }
  console.log(`round ${round}/${rounds} done`);
}

const ceiling = ceilings.length > 0 ? median(ceilings) : null;
if (ceiling) {
  console.log(`\nsha256 ceiling (openssl speed -evp sha256, 16 KiB blocks, beside (f) in each round): median ${ceiling.toFixed(0)} MB/s of ${ceilings.map((c) => c.toFixed(0)).join(', ')}`);
}
const bigCeiling = bigCeilings.length > 0 ? median(bigCeilings) : null;
if (bigCeiling) {
  console.log(`sha256 of 16 MiB blocks (the artifact's size), beside it: median ${bigCeiling.toFixed(0)} MB/s of ${bigCeilings.map((c) => c.toFixed(0)).join(', ')}`);
}
const fmt = (v, unit) => (unit === 'ms' ? `${v.toFixed(1)} ms` : unit === 'MB/s' ? `${v.toFixed(0)} MB/s` : `${Math.round(v).toLocaleString('en-US')}/s`);
console.log(`\nmedians of ${rounds} rounds (ratio: how many times better native is; higher is better)\n`);
if (other === 'compared') console.log(`native: this build; compared: ${values.compare}\n`);
console.log(`| scenario | durability | native | ${other} | ratio | target | peak RSS native / ${other} |`);
console.log('| --- | --- | --- | --- | --- | --- | --- |');
for (const s of scenarios) {
  for (const durability of ['full', 'normal']) {
    const n = results.get(`${s} ${durability} native`);
    const b = results.get(`${s} ${durability} ${other}`);
    const unit = n[0].unit;
    const nv = median(n.map((x) => x.value));
    const bv = median(b.map((x) => x.value));
    const ratio = unit === 'ms' ? bv / nv : nv / bv;
    let target = other === 'baseline' ? TARGET[`${s} ${durability}`] : undefined;
    let targetText = target ? `>= ${target[1]}x ${ratio >= target[1] ? 'met' : 'NOT met'}` : '';
    if (s === 'f' && ceiling && other === 'baseline') {
      const share = nv / ceiling;
      targetText = `native at ${(share * 100).toFixed(0)}% of sha256 ceiling (target >= 75%) ${share >= 0.75 ? 'met' : 'NOT met'}`;
      if (bigCeiling) targetText += `; ${((nv / bigCeiling) * 100).toFixed(0)}% of sha256 on 16 MiB blocks`;
    }
    const rss = `${median(n.map((x) => x.maxRssMB)).toFixed(0)} / ${median(b.map((x) => x.maxRssMB)).toFixed(0)} MB`;
    console.log(`| ${NAMES[s]} | ${durability} | ${fmt(nv, unit)} | ${fmt(bv, unit)} | ${ratio.toFixed(2)}x | ${targetText} | ${rss} |`);
  }
}
const closing = scenarios.filter((s) => ['a', 'b', 'c'].includes(s));
if (closing.length > 0) {
  console.log('\nthe same appends counted until close() returns, which finishes the WAL checkpointing each world left to do');
  for (const s of closing) {
    for (const durability of ['full', 'normal']) {
      const n = median(results.get(`${s} ${durability} native`).map((x) => x.withClose));
      const b = median(results.get(`${s} ${durability} ${other}`).map((x) => x.withClose));
      console.log(`  ${NAMES[s]}, ${durability}: native ${fmt(n, 'appends/s')}, ${other} ${fmt(b, 'appends/s')}, ${(n / b).toFixed(2)}x`);
    }
  }
}
if (scenarios.includes('b')) {
  console.log('\nevent-loop stall during (b): p99 gap between 1 ms timer ticks (target < 5 ms for native)');
  for (const durability of ['full', 'normal']) {
    const n = median(results.get(`b ${durability} native`).map((x) => x.stallP99Ms));
    const b = median(results.get(`b ${durability} ${other}`).map((x) => x.stallP99Ms));
    console.log(`  ${durability}: native ${n.toFixed(2)} ms, ${other} ${b.toFixed(2)} ms ${n < 5 ? '(met)' : '(NOT met)'}`);
  }
}
rmSync(work, { recursive: true, force: true });
