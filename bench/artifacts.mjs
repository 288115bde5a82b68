// Artifact throughput of the native world. Prints figures; asserts nothing.
//
//   node bench/artifacts.mjs [--quick]
//
// Write and read MB/s for 1 KiB, 1 MiB and 64 MiB `bytes` artifacts (each read re-hashes), next
// to this machine's own sha256 throughput from `openssl speed -evp sha256`, which is the ceiling
// for a verified read. Also the longest event-loop gap (between 1 ms timer ticks) while a 64 MiB
// artifact is written, read and verified.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { localWorld, readArtifact, writeArtifact } from '@little-workflow/world';
import { machine, opensslSha256MBps } from './lib.mjs';

const quick = process.argv.includes('--quick');
const MiB = 1024 * 1024;

function maxGapDuring(promise) {
  let last = performance.now();
  let max = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    max = Math.max(max, now - last);
    last = now;
  }, 1);
  return promise.then((v) => {
    clearInterval(timer);
    max = Math.max(max, performance.now() - last);
    return [v, max];
  });
}

const dataDir = mkdtempSync(join(tmpdir(), 'little-bench-art-'));
const world = localWorld({ dataDir });
console.log(`machine: ${machine()}`);
const ceiling = opensslSha256MBps();
console.log(`sha256 ceiling (openssl speed -evp sha256, 16 KiB blocks): ${ceiling ? ceiling.toFixed(0) : 'n/a'} MB/s`);

const sizes = [
  ['1 KiB', 1024, quick ? 200 : 2000],
  ['1 MiB', MiB, quick ? 10 : 100],
  ['64 MiB', 64 * MiB, quick ? 1 : 4],
];
let n = 0;
for (const [label, size, count] of sizes) {
  const payloads = Array.from({ length: count }, () => {
    const b = Buffer.alloc(size, n & 0xff);
    b.writeUInt32LE(n++, 0);
    return b;
  });
  let t0 = performance.now();
  const manifests = [];
  for (const payload of payloads) {
    manifests.push(await writeArtifact(world, { runId: 'run_bench', stepPath: 'b', name: label, contentType: 'application/octet-stream', encoding: 'bytes', payload }));
  }
  const writeS = (performance.now() - t0) / 1000;
  t0 = performance.now();
  for (const m of manifests) await readArtifact(world, m.artifactRef);
  const readS = (performance.now() - t0) / 1000;
  const mb = (size * count) / MiB;
  const r = mb / readS;
  console.log(
    `${label.padEnd(6)} x ${String(count).padStart(4)}: write ${(mb / writeS).toFixed(1)} MB/s (${((count / writeS)).toFixed(0)}/s), ` +
      `verified read ${r.toFixed(1)} MB/s (${(count / readS).toFixed(0)}/s)` +
      (ceiling ? `, read/ceiling ${(r / ceiling).toFixed(2)}` : ''),
  );
}

const big = Buffer.alloc(64 * MiB, 7);
big.writeUInt32LE(0xfeed, 0);
const [, writeGap] = await maxGapDuring(
  writeArtifact(world, { runId: 'run_bench', stepPath: 'gap', name: 'big', contentType: 'application/octet-stream', encoding: 'bytes', payload: big }).then((m) =>
    readArtifact(world, m.artifactRef),
  ),
);
console.log(`longest event-loop gap while 64 MiB is written, read and verified: ${writeGap.toFixed(1)} ms`);
await world.close();
rmSync(dataDir, { recursive: true, force: true });
