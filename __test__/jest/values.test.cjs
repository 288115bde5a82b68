// What the package returns in Jest, loaded through `require`.
const lib = require('@little-workflow/world');
require('./cases.cjs').values(lib);
