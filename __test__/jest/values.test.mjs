// What the package returns in Jest, loaded through `import` (Jest's ES modules, under
// --experimental-vm-modules).
import * as lib from '@little-workflow/world';
import cases from './cases.cjs';

cases.values(lib);
