// Run the generated-input properties of __test__/properties.test.ts for a given time instead of
// the few seconds `npm test` gives them.
//
//   node scripts/property-soak.mjs --duration 10m     (s, m or h; default 5m)
//
// The time is shared among the properties (each runs on every kind of world); each stops once
// its share is spent, and a failure prints its counterexample and exits non-zero.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { values } = parseArgs({ options: { duration: { type: 'string', default: '5m' } } });
const m = /^(\d+(?:\.\d+)?)(s|m|h)$/.exec(values.duration);
if (!m) {
  console.error('usage: node scripts/property-soak.mjs --duration <number>(s|m|h)');
  process.exit(2);
}
const seconds = Number(m[1]) * { s: 1, m: 60, h: 3600 }[m[2]];
// One property per `it(` in the file, run once per kind of world.
const file = join(root, '__test__', 'properties.test.ts');
const properties = (readFileSync(file, 'utf8').match(/^\s+it\(/gm) ?? []).length;
const helpers = readFileSync(join(root, '__test__', 'helpers.ts'), 'utf8');
const kinds = (helpers.match(/^\s+\['[^']+', \(\) =>/gm) ?? []).length || 1;
const each = Math.max(1, Math.floor(seconds / (properties * kinds)));
console.log(`${properties} properties x ${kinds} kinds of world, ${each} s each`);
const r = spawnSync(process.execPath, [join(root, 'node_modules', 'vitest', 'vitest.mjs'), 'run', file], {
  cwd: root,
  stdio: 'inherit',
  env: { ...process.env, LITTLE_PROPERTY_SECONDS: String(each) },
});
process.exit(r.status ?? 1);
