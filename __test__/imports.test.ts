// The package loads from CommonJS and from ES modules, with the same exports.
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot, tempDir } from './helpers';

function run(args: string[]): string {
  return execFileSync(process.execPath, args, { cwd: packageRoot, encoding: 'utf8' });
}

describe('package entry points', () => {
  it('loads from CommonJS and from ES modules', () => {
    const cjs = run(['-e', "const w = require('@little-workflow/world'); console.log(Object.keys(w).sort().join(','))"]);
    const esm = run([
      '--input-type=module',
      '-e',
      "import * as w from '@little-workflow/world'; console.log(Object.keys(w).filter(k => k !== 'default').sort().join(','))",
    ]);
    expect(esm).toBe(cjs);
    expect(cjs).toContain('appendEvent');
    expect(cjs).toContain('localWorld');
  });

  it('appends from an ES module script', () => {
    const out = run([
      '--input-type=module',
      '-e',
      `import { virtualWorld, appendEvent } from '@little-workflow/world';
       const w = virtualWorld();
       const e = await appendEvent(w, 'run_esm', { type: 'RunStarted', payload: {} });
       await w.close();
       console.log(e.sequence, Object.isFrozen(e));`,
    ]);
    expect(out.trim()).toBe('1 true');
  });

  // An ES module importing CommonJS makes Node lex the whole file to guess its named exports; for
  // world.js the lexer grew hot enough that V8 compiled it on a worker thread (about 50 ms of CPU)
  // while a program's first operations wanted the cores. The ES entry loads world.js by require.
  it('loads world.js from its ES module entry without Node lexing it, as the same module require gives', () => {
    const dir = tempDir();
    // A loader hook sees each module the ES module loader loads; CommonJS ones it lexes.
    writeFileSync(
      join(dir, 'hooks.mjs'),
      "export async function load(url, context, next) { const r = await next(url, context); if (r.format === 'commonjs') console.log('lexed', url); return r; }",
    );
    writeFileSync(join(dir, 'register.mjs'), "import { register } from 'node:module'; register('./hooks.mjs', import.meta.url);");
    const out = run([
      '--import',
      join(dir, 'register.mjs'),
      '--input-type=module',
      '-e',
      `import { appendEvent } from '@little-workflow/world';
       import { createRequire } from 'node:module';
       const required = createRequire(process.cwd() + '/')('@little-workflow/world');
       console.log('same', appendEvent === required.appendEvent);`,
    ]);
    expect(out).not.toMatch(/lexed .*world\.js/);
    expect(out).toContain('same true');
  });
});
