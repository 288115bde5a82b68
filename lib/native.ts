// The native core: the addon napi-rs builds, loaded through its generated loader, which looks for
// this platform's package (@little-workflow/world-<platform>) and then for a .node file beside it.
import type * as Native from '../index.js';

/** The platform as the per-platform packages name it (linux-x64-gnu, darwin-arm64, ...). */
function platformName(): string {
  if (process.platform === 'win32') return `win32-${process.arch}-msvc`;
  if (process.platform !== 'linux') return `${process.platform}-${process.arch}`;
  const glibc = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header?.glibcVersionRuntime;
  return `linux-${process.arch}-${glibc ? 'gnu' : 'musl'}`;
}

function load(): typeof Native {
  try {
    return require('../index.js') as typeof Native;
  } catch (err) {
    const platform = platformName();
    throw new Error(
      `@little-workflow/world has no native addon for this platform (${platform}): no package ` +
        `@little-workflow/world-${platform} is installed, and no little-workflow-world.${platform}.node is beside it. ` +
        'Build the addon from source (a Rust toolchain and a C compiler): clone the repository, run `npm install` in it, ' +
        `and set NAPI_RS_NATIVE_LIBRARY_PATH to the little-workflow-world.${platform}.node it builds.`,
      { cause: err },
    );
  }
}

/** The addon's exports. */
export const native = load();

/** An open world's handle in the core. */
export type NativeWorld = Native.NativeWorld;
