// The app's copy of the SDK's World package (`@workflow/world`), whose line decides the interface
// this World serves. It is resolved from the app's directory (the working directory, where the
// SDK's runtime resolves the World module itself), else from this package, and loaded
// synchronously: the runtime creates its World synchronously and reads `specVersion` at once.
// `@workflow/world` is an ES module, which `require` loads on Node 20.19+ and 22.12+.
const { createRequire } = require('node:module');
const { dirname, join } = require('node:path');
const { readFileSync } = require('node:fs');

/** `specifier` resolved from the file `from`, or undefined when it is not installed there. */
function resolveFrom(from, specifier) {
  try {
    return createRequire(from).resolve(specifier);
  } catch {
    return undefined;
  }
}

/**
 * Where the app's `@workflow/world` entry is: the app's own, else the one its `@workflow/core`
 * uses (when the package manager did not hoist it), else this package's; undefined when none is.
 */
function resolveSdkWorld() {
  const app = join(process.cwd(), 'index.js');
  const core = resolveFrom(app, '@workflow/core');
  return resolveFrom(app, '@workflow/world') ?? (core && resolveFrom(core, '@workflow/world')) ?? resolveFrom(__filename, '@workflow/world');
}

/** The version in the package.json of the package whose entry is `entry`. */
function versionOf(entry) {
  for (let dir = dirname(entry); dir !== dirname(dir); dir = dirname(dir)) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
      if (pkg.name === '@workflow/world') return pkg.version;
    } catch {
      // No package.json here: look further up.
    }
  }
  return undefined;
}

let loaded;

/** The app's `@workflow/world`: its module, its version and where it is. */
function sdkWorld() {
  if (loaded !== undefined) return loaded;
  const entry = resolveSdkWorld();
  if (entry === undefined) {
    throw new Error('@little-workflow/world/vercel needs the Workflow SDK: @workflow/world was found neither in the app (the working directory) nor beside this package');
  }
  let module;
  try {
    module = require(entry);
  } catch (err) {
    if (err && (err.code === 'ERR_REQUIRE_ESM' || err.code === 'ERR_REQUIRE_ASYNC_MODULE')) {
      throw new Error(`@little-workflow/world/vercel loads @workflow/world (${entry}) with require, which needs Node 20.19+ or 22.12+; this is Node ${process.versions.node}`, { cause: err });
    }
    throw err;
  }
  loaded = { module, version: versionOf(entry), entry };
  return loaded;
}

module.exports = { sdkWorld };
