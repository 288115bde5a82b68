// The package as users install it: the main tarball and this platform's tarball, packed by
// scripts/pack.mjs, installed into a fresh project whose PATH holds no cargo and no C compiler.
// The install runs no build: the tools a build would call are on that PATH as stand-ins that
// record being called and fail. The project then imports the package from ES modules and
// CommonJS, appends and lists events, and runs `npx little runs`; without its platform's package,
// importing names the platform and says how to build the addon.
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, readdirSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot, tempDir } from './helpers';

/** A PATH of node and npm alone, with stand-ins for every build tool that write to `calls`. */
function bareBin(dir: string, calls: string): string {
  const bin = join(dir, 'bin');
  mkdirSync(bin);
  symlinkSync(realpathSync(process.execPath), join(bin, 'node'));
  const npmCli = join(dirname(realpathSync(process.execPath)), '..', 'lib', 'node_modules', 'npm', 'bin');
  for (const tool of ['npm', 'npx']) {
    writeFileSync(join(bin, tool), `#!/bin/sh\nexec "${join(bin, 'node')}" "${join(npmCli, `${tool}-cli.js`)}" "$@"\n`);
    chmodSync(join(bin, tool), 0o755);
  }
  for (const tool of ['cargo', 'rustc', 'cc', 'gcc', 'c++', 'g++', 'clang', 'make', 'node-gyp']) {
    writeFileSync(join(bin, tool), `#!/bin/sh\necho "${tool} $*" >> "${calls}"\nexit 127\n`);
    chmodSync(join(bin, tool), 0o755);
  }
  // The shell npm runs lifecycle scripts with, should any run.
  symlinkSync('/bin/sh', join(bin, 'sh'));
  return bin;
}

describe('the published package', () => {
  it('installs from its tarballs with no Rust toolchain or C compiler, runs no build, and works from ESM, CommonJS and npx', () => {
    const dir = tempDir();
    const packed = execFileSync(process.execPath, [join(packageRoot, 'scripts', 'pack.mjs'), '--out', join(dir, 'packages')], { cwd: packageRoot, encoding: 'utf8' })
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { name: string; file: string; bytes: number });
    expect(packed.map((p) => p.name).sort()).toEqual(['@little-workflow/world', `@little-workflow/world-${process.platform}-${process.arch}-gnu`]);
    const main = packed.find((p) => p.name === '@little-workflow/world')!;

    // What the main tarball holds: the JavaScript, the types, the CLI, the server and the
    // inspector; no Rust sources, no addon, no install script, and every platform package.
    const listed = execFileSync('tar', ['-tzf', main.file], { encoding: 'utf8' }).split('\n');
    expect(listed).toContain('package/world.js');
    expect(listed).toContain('package/bin/little.js');
    expect(listed).toContain('package/inspector/index.html');
    expect(listed.filter((f) => /\.(rs|node)$|Cargo\.toml|\/target\//.test(f))).toEqual([]);
    const manifest = JSON.parse(execFileSync('tar', ['-xzOf', main.file, 'package/package.json'], { encoding: 'utf8' }));
    expect(Object.keys(manifest.scripts ?? {}).filter((s) => ['preinstall', 'install', 'postinstall'].includes(s))).toEqual([]);
    expect(Object.keys(manifest.optionalDependencies).sort()).toEqual(
      ['darwin-arm64', 'darwin-x64', 'linux-arm64-gnu', 'linux-x64-gnu', 'linux-x64-musl', 'win32-x64-msvc'].map((p) => `@little-workflow/world-${p}`),
    );
    expect(new Set(Object.values(manifest.optionalDependencies))).toEqual(new Set([manifest.version]));

    const project = join(dir, 'project');
    mkdirSync(project);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'a-user', version: '1.0.0', private: true }));
    const calls = join(dir, 'build-tool-calls.txt');
    const env = { HOME: dir, PATH: bareBin(dir, calls), npm_config_cache: join(dir, 'npm-cache'), npm_config_update_notifier: 'false' };
    const install = spawnSync('npm', ['install', '--no-audit', '--no-fund', ...packed.map((p) => p.file)], { cwd: project, env, encoding: 'utf8' });
    expect(install.status, `${install.stdout}${install.stderr}`).toBe(0);
    expect(existsSync(calls) ? readFileSync(calls, 'utf8') : '').toBe('');
    const installed = join(project, 'node_modules', '@little-workflow');
    expect(readdirSync(installed).sort()).toEqual(['world', `world-${process.platform}-${process.arch}-gnu`]);
    expect(readdirSync(join(installed, 'world')).filter((f) => f.endsWith('.node') || f === 'target')).toEqual([]);

    writeFileSync(
      join(project, 'esm.mjs'),
      `import { localWorld, appendEvent, listEvents } from '@little-workflow/world';
       const world = localWorld();
       await appendEvent(world, 'run_installed', { type: 'RunStarted', payload: { from: 'esm' } });
       console.log((await listEvents(world, 'run_installed')).length);
       await world.close();`,
    );
    writeFileSync(
      join(project, 'cjs.cjs'),
      `const { localWorld, appendEvent, listEvents } = require('@little-workflow/world');
       (async () => {
         const world = localWorld();
         await appendEvent(world, 'run_installed', { type: 'StepStarted', payload: { stepPath: 'cjs' } });
         console.log((await listEvents(world, 'run_installed')).map((e) => e.sequence).join(','));
         await world.close();
       })();`,
    );
    const node = (file: string) => execFileSync(join(env.PATH, 'node'), [file], { cwd: project, env, encoding: 'utf8' }).trim();
    expect(node('esm.mjs')).toBe('1');
    expect(node('cjs.cjs')).toBe('1,2');
    const runs = spawnSync('npx', ['--no-install', 'little', 'runs'], { cwd: project, env, encoding: 'utf8' });
    expect(runs.status, runs.stderr).toBe(0);
    expect(JSON.parse(runs.stdout)).toMatchObject({ runId: 'run_installed', eventCount: 2 });
    expect(existsSync(calls) ? readFileSync(calls, 'utf8') : '').toBe('');

    // Without a package for its platform, importing says which platform and how to build one.
    rmSync(join(installed, `world-${process.platform}-${process.arch}-gnu`), { recursive: true });
    const missing = spawnSync(join(env.PATH, 'node'), ['esm.mjs'], { cwd: project, env, encoding: 'utf8' });
    expect(missing.status).not.toBe(0);
    expect(missing.stderr).toContain(`no native addon for this platform (${process.platform}-${process.arch}-gnu)`);
    expect(missing.stderr).toContain('NAPI_RS_NATIVE_LIBRARY_PATH');
  }, 180_000);
});
