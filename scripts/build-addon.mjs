// Builds the native addon from source in a checkout of the package: `npm install` runs it as
// the `prepare` script (npm runs `prepare` for a plain install in the package's own folder, never
// when the package is installed from a registry or a tarball, so users of the published package
// run no build). It builds the addon in release mode with `napi build` (cargo rebuilds only what
// changed), then the TypeScript front (`scripts/build-ts.mjs`).
//
// Needs a Rust toolchain (stable cargo) and a C compiler, and the dev dependencies.
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);

function run(cmd, args) {
  console.log(`[@little-workflow/world] ${cmd} ${args.join(' ')}`);
  execFileSync(cmd, args, { cwd: root, stdio: 'inherit' });
}

let cli;
try {
  // The package exports only its API; its command line sits beside the API's entry file.
  cli = join(dirname(require.resolve('@napi-rs/cli', { paths: [root] })), 'cli.js');
} catch {
  console.error('[@little-workflow/world] @napi-rs/cli is missing: run `npm install` with dev dependencies.');
  process.exit(1);
}
run(process.execPath, [cli, 'build', '--platform', '--release', '--js', 'index.js', '--dts', 'index.d.ts']);
run(process.execPath, [join(root, 'scripts', 'build-ts.mjs')]);
