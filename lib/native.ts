// The native core: the addon napi-rs builds, loaded through its generated loader.
import * as native from '../index.js';

/** An open world's handle in the core. */
export type NativeWorld = native.NativeWorld;

export { native };
