// The documents that describe the tree stay true to it.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const root = join(__dirname, '..');

describe('docs/architecture.md', () => {
  it('maps every source file with its line count and what it owns', () => {
    let failure = '';
    try {
      execFileSync(process.execPath, [join(root, 'scripts', 'file-map.mjs'), '--check'], { cwd: root, encoding: 'utf8', stdio: 'pipe' });
    } catch (e) {
      failure = String((e as { stderr?: string }).stderr ?? e);
    }
    expect(failure).toBe('');
  });
});
