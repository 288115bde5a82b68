// The package's errors in Jest, loaded through `require`.
const lib = require('@little-workflow/world');
require('./cases.cjs').errors(lib);
