// The package loads from CommonJS and from ES modules, with the same exports.
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { packageRoot } from './helpers';

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
});
