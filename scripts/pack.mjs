// Packs the package as it is published: the main package, with every platform package of
// `napi.targets` as an exact-version optional dependency, and this machine's platform package
// (npm/<platform>/) holding the addon built here (`npm install` or `npm run build` first).
//
//   node scripts/pack.mjs [--out DIR]     (default: ./dist-packages)
//
// Prints one JSON line per tarball: {"name", "file", "bytes"}. Runs no build: the main package is
// packed with --ignore-scripts, and the optional dependencies are written into package.json only
// while it is packed (a checkout keeps them out, as `npm ci` would look for them in its lock file).
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { values } = parseArgs({ options: { out: { type: 'string', default: join(root, 'dist-packages') } } });
const out = resolve(values.out);
mkdirSync(out, { recursive: true });

const manifestPath = join(root, 'package.json');
const manifestText = readFileSync(manifestPath, 'utf8');
const manifest = JSON.parse(manifestText);
const binary = manifest.napi.binaryName;

/** The npm/<dir> name napi-rs gives a Rust target triple (x86_64-unknown-linux-gnu: linux-x64-gnu). */
function platformDir(triple) {
  const cpu = triple.startsWith('aarch64-') ? 'arm64' : 'x64';
  if (triple.includes('-apple-')) return `darwin-${cpu}`;
  if (triple.includes('-windows-')) return `win32-${cpu}-msvc`;
  return `linux-${cpu}-${triple.split('-').at(-1)}`;
}

function pack(dir, args = []) {
  const [info] = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', out, ...args], { cwd: dir, encoding: 'utf8' }));
  const file = join(out, info.filename);
  const line = { name: info.name, file, bytes: statSync(file).size };
  console.log(JSON.stringify(line));
  return line;
}

const dirs = manifest.napi.targets.map(platformDir);
const here = `${process.platform}-${process.arch}${process.platform === 'linux' ? '-gnu' : process.platform === 'win32' ? '-msvc' : ''}`;
if (!dirs.includes(here)) throw new Error(`this machine (${here}) is not one of napi.targets`);
const built = join(root, `${binary}.${here}.node`);
if (!existsSync(built)) throw new Error(`${built} is missing: build the addon first (npm install, or npm run build)`);
copyFileSync(built, join(root, 'npm', here, `${binary}.${here}.node`));
pack(join(root, 'npm', here));

const published = { ...manifest, optionalDependencies: Object.fromEntries(dirs.map((d) => [`${manifest.name}-${d}`, manifest.version])) };
writeFileSync(manifestPath, `${JSON.stringify(published, null, 2)}\n`);
try {
  pack(root, ['--ignore-scripts']);
} finally {
  writeFileSync(manifestPath, manifestText);
}
