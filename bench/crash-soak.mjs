// Crash-safety soak: the SIGKILL test of __test__/crash.test.ts with many more kill cycles.
//
//   node bench/crash-soak.mjs [cycles]      (default 500)
//
// Each cycle starts a child that appends across several runs and writes artifacts, kills it with
// SIGKILL at a random moment, then checks that every append whose promise resolved is stored as
// reported, every run is dense, every reported artifact reads back, and verification is clean.
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cycles = Number(process.argv[2] ?? 500);
const started = Date.now();
const r = spawnSync(process.execPath, [join(root, 'node_modules', 'vitest', 'vitest.mjs'), 'run', '__test__/crash.test.ts'], {
  cwd: root,
  env: { ...process.env, CRASH_CYCLES: String(cycles) },
  stdio: 'inherit',
});
const seconds = (Date.now() - started) / 1000;
console.log(`${cycles} kill cycles: ${r.status === 0 ? 'clean' : 'FAILED'} in ${seconds.toFixed(0)} s (${(seconds / cycles).toFixed(2)} s per cycle)`);
process.exitCode = r.status ?? 1;
