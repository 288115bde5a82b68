// The package's errors in Jest, loaded through `import` (Jest's ES modules, under
// --experimental-vm-modules).
import * as lib from '@little-workflow/world';
import { WorldError, WorldPathError } from '@little-workflow/world';
import cases from './cases.cjs';

it('exports the same classes by name as in the namespace', () => {
  expect(WorldError).toBe(lib.WorldError);
  expect(WorldPathError).toBe(lib.WorldPathError);
});

cases.errors(lib);
