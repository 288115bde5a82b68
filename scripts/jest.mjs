// Run the Jest suite of __test__/jest/ four ways: its CommonJS files and its ES module files (under
// --experimental-vm-modules), each in band and in two worker processes. Each run tells its test
// files how it runs them (LITTLE_JEST_MODE, and this process's pid), and they check it.
//
//   node scripts/jest.mjs [extra Jest arguments]
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const jest = createRequire(import.meta.url).resolve('jest/bin/jest');
const config = join(root, '__test__', 'jest', 'jest.config.cjs');

const runs = [
  ['CommonJS, in band', '\\.test\\.cjs$', false, ['--runInBand']],
  // Jest runs fast files in band whatever --maxWorkers says; a worker memory limit makes it use workers.
  ['CommonJS, in workers', '\\.test\\.cjs$', false, ['--maxWorkers=2', '--workerIdleMemoryLimit=2GB']],
  ['ES modules, in band', '\\.test\\.mjs$', true, ['--runInBand']],
  ['ES modules, in workers', '\\.test\\.mjs$', true, ['--maxWorkers=2', '--workerIdleMemoryLimit=2GB']],
];

let failed = 0;
for (const [name, pattern, esm, flags] of runs) {
  const nodeOptions = [process.env.NODE_OPTIONS ?? '', esm ? '--experimental-vm-modules' : ''].join(' ').trim();
  const env = { ...process.env, NODE_OPTIONS: nodeOptions, LITTLE_JEST_MODE: flags.includes('--runInBand') ? 'in-band' : 'workers', LITTLE_JEST_SCRIPT_PID: String(process.pid) };
  console.log(`\n== Jest: ${name}`);
  const started = performance.now();
  const r = spawnSync(process.execPath, [jest, '--config', config, '--ci', ...flags, '--testPathPatterns', pattern, ...process.argv.slice(2)], { cwd: root, env, stdio: 'inherit' });
  console.log(`== Jest: ${name}: ${r.status === 0 ? 'passed' : 'FAILED'} in ${((performance.now() - started) / 1000).toFixed(1)} s`);
  if (r.status !== 0) failed++;
}
process.exit(failed === 0 ? 0 : 1);
