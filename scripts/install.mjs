// `npm install` hook: make sure a native addon that fits this machine is in place.
//
// In a source checkout the addon is always built from source with `napi build --release`; cargo
// only rebuilds what changed. In an installed package, a prebuilt binary that loads is used as
// is, and only when none fits is it built from source with cargo. An installed package carries
// the Rust sources too (for that build), so a checkout is told by world.ts, which is not published.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
const isSourceCheckout = existsSync(join(root, 'world.ts')) && existsSync(join(root, 'Cargo.toml'));

function run(cmd, args) {
  console.log(`[@little-workflow/world] ${cmd} ${args.join(' ')}`);
  execFileSync(cmd, args, { cwd: root, stdio: 'inherit' });
}

function prebuiltLoads() {
  if (!existsSync(join(root, 'index.js'))) return false;
  try {
    require(join(root, 'index.js'));
    return true;
  } catch {
    return false;
  }
}

function napiCli() {
  try {
    // The package exports only its API; its command line sits beside the API's entry file.
    return join(dirname(require.resolve('@napi-rs/cli', { paths: [root] })), 'cli.js');
  } catch {
    return null;
  }
}

if (isSourceCheckout) {
  const cli = napiCli();
  if (!cli) {
    console.error('[@little-workflow/world] @napi-rs/cli is missing: run `npm install` with dev dependencies.');
    process.exit(1);
  }
  run(process.execPath, [cli, 'build', '--platform', '--release', '--js', 'index.js', '--dts', 'index.d.ts']);
  run(process.execPath, [join(root, 'scripts', 'build-ts.mjs')]);
} else if (!prebuiltLoads()) {
  // No prebuilt binary fits: build the cdylib with cargo and put it where index.js looks.
  run('cargo', ['build', '--release', '--locked']);
  const lib = readdirSync(join(root, 'target', 'release')).find((f) => /^(lib)?little_workflow_world\.(so|dylib|dll)$/.test(f));
  if (!lib) throw new Error('cargo built no little_workflow_world library');
  const { copyFileSync } = await import('node:fs');
  const triple = `${process.platform}-${process.arch}${process.platform === 'linux' ? '-gnu' : process.platform === 'win32' ? '-msvc' : ''}`;
  copyFileSync(join(root, 'target', 'release', lib), join(root, `little-workflow-world.${triple}.node`));
}
