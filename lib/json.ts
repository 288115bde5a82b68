// Values in and out: a plain copy of an input read once, refused where JSON cannot carry it
// exactly; its JSON text; and deep-frozen values parsed from the core's text.
import { types } from 'node:util';
import { EventValidationError, WorldError, invalid, thrownName } from './errors.js';
import { native } from './native.js';

/** Deepest nesting of arrays and objects a payload may have. */
export const MAX_DEPTH = 1000;

/** Stands in a path for an object key that looks like a credential (see `toJsonText`). */
export const CREDENTIAL_KEY = '[<a key that looks like a credential>]';

export function renderPath(root: string, segs: readonly (string | number)[], screenKeys = false): string {
  let s = root;
  for (const seg of segs) {
    if (typeof seg === 'number') s += `[${seg}]`;
    else if (screenKeys && native.looksLikeCredential(seg)) s += CREDENTIAL_KEY;
    else if (/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(seg)) s += `.${seg}`;
    else s += `[${JSON.stringify(seg)}]`;
  }
  return s;
}

/**
 * Strings this long (in UTF-16 units) are sent to the core beside an append's JSON text: copying
 * one across costs a fraction of what `JSON.stringify` spends escaping it on this thread.
 */
export const BESIDE_MIN = 4096;

/** How {@link snapshotOf} reads a value. */
export interface Reading {
  /** The run the value belongs to, for errors. */
  runId?: string;
  /** Write no key that looks like a credential into a path (`CREDENTIAL_KEY` stands for it). */
  screenKeys?: boolean;
  /** Levels more allowed where the value wraps payloads: 1 for a list of run events, 2 for a list of envelopes. */
  around?: number;
  /** A key of the top-level object whose `undefined` value is kept, as `null`. */
  undefinedAsNull?: string;
}

/**
 * A plain copy of `value` as JSON would read it, reading every field, element and `toJSON` once:
 * the copy is what is validated and what is written, so a getter that answers differently on a
 * second read cannot make them differ. Refuses anything JSON cannot carry exactly: NaN and
 * ±Infinity, BigInt, functions, symbols, `undefined` inside an array or as the value itself, Map
 * and Set, lone surrogates, cycles, and nesting deeper than 1,000 levels. An `undefined` object
 * field is omitted and `toJSON` is honoured, as `JSON.stringify` does. Anything thrown while
 * reading (a getter, a Proxy's trap, a revoked Proxy, a `toJSON`) is an `EventValidationError`
 * naming the path, such as `payload.a[3].b`, with what was thrown as its `cause`. A `__proto__`
 * key stays a key of the copy.
 */
export function snapshotOf(value: unknown, root: string, r: Reading = {}): unknown {
  return read(value, root, r).copy;
}

/** {@link snapshotOf}, and whether the copy holds a string of at least `BESIDE_MIN` units. */
export function read(value: unknown, root: string, r: Reading): { copy: unknown; long: boolean } {
  let long = false;
  const segs: (string | number)[] = [];
  const ancestors = new Set<object>();
  const fail = (message: string, cause?: unknown): never => {
    const at = renderPath(root, segs, r.screenKeys);
    throw new EventValidationError('EVENT_VALIDATION', `${at}: ${message}`, { path: at, runId: r.runId }, cause === undefined ? undefined : { cause });
  };
  const walk = (v: unknown, key: string, depth: number, inArray: boolean): unknown => {
    if (v !== null && (typeof v === 'object' || typeof v === 'function' || typeof v === 'bigint')) {
      const toJSON = (v as { toJSON?: unknown }).toJSON;
      if (typeof toJSON === 'function') v = toJSON.call(v, key);
    }
    switch (typeof v) {
      case 'string':
        if (!v.isWellFormed()) fail('contains a lone surrogate, which JSON cannot carry exactly');
        if (v.length >= BESIDE_MIN) long = true;
        return v;
      case 'number':
        if (!Number.isFinite(v)) fail(`${v} cannot be stored in JSON`);
        return v;
      case 'boolean':
        return v;
      case 'bigint':
        return fail('a BigInt cannot be stored in JSON; convert it to a string or a safe number');
      case 'undefined':
        if (inArray) fail('undefined inside an array cannot be stored in JSON (it would become null)');
        if (depth === 1 - (r.around ?? 0)) fail('is undefined, which JSON cannot store');
        return undefined;
      case 'function':
      case 'symbol':
        return fail(`a ${typeof v} cannot be stored in JSON`);
    }
    if (v === null) return null;
    const obj = v as object;
    // util.types knows a Map, a Set or a boxed primitive of any realm; instanceof, a Proxy of one.
    const map = types.isMap(obj) || obj instanceof Map;
    if (map || types.isSet(obj) || obj instanceof Set) fail(`a ${map ? 'Map' : 'Set'} cannot be stored in JSON; convert it to an object or an array`);
    if (types.isNumberObject(obj) || types.isStringObject(obj) || types.isBooleanObject(obj) || obj instanceof Number || obj instanceof String || obj instanceof Boolean) {
      return walk((obj as Number).valueOf(), key, depth, inArray);
    }
    if (depth > MAX_DEPTH) fail(`is nested deeper than ${MAX_DEPTH} levels`);
    if (ancestors.has(obj)) fail('is a cycle: the value contains itself');
    ancestors.add(obj);
    let copy: unknown;
    if (Array.isArray(obj)) {
      const n = obj.length;
      const out = new Array<unknown>(n);
      for (let i = 0; i < n; i++) {
        segs.push(i);
        out[i] = walk(obj[i], String(i), depth + 1, true);
        segs.pop();
      }
      copy = out;
    } else {
      const out: Record<string, unknown> = {};
      const top = depth === 1 - (r.around ?? 0);
      for (const k of Object.keys(obj)) {
        segs.push(k);
        if (!k.isWellFormed()) fail('this key contains a lone surrogate, which JSON cannot carry exactly');
        let field = walk((obj as Record<string, unknown>)[k], k, depth + 1, false);
        if (field === undefined && top && k === r.undefinedAsNull) field = null;
        // Assigned, `__proto__` would set the copy's prototype instead of adding the key.
        if (field !== undefined && k === '__proto__') Object.defineProperty(out, k, { value: field, enumerable: true, writable: true, configurable: true });
        else if (field !== undefined) out[k] = field;
        segs.pop();
      }
      copy = out;
    }
    ancestors.delete(obj);
    return copy;
  };
  try {
    const copy = walk(value, '', 1 - (r.around ?? 0), false);
    return { copy, long };
  } catch (err) {
    if (err instanceof WorldError) throw err;
    return fail(`could not be read: reading it threw ${thrownName(err)}`, err);
  }
}

/**
 * JSON text of `value`, read once (see {@link snapshotOf}). Given `beside`, strings of at least
 * `BESIDE_MIN` units go there instead, each replaced by `"\u0000<index>"`; so that every string
 * value starting with U+0000 is a placeholder, such short strings go beside it too.
 */
export function toJsonText(value: unknown, root: string, r: Reading = {}, beside?: string[]): string {
  const { copy, long } = read(value, root, r);
  return jsonOf(copy, long ? beside : undefined);
}

/** JSON text of a {@link snapshotOf} copy; with `beside`, long strings go there (see {@link toJsonText}). */
export function jsonOf(copy: unknown, beside?: string[]): string {
  if (beside === undefined) return JSON.stringify(copy);
  return JSON.stringify(copy, (_key, v: unknown) => {
    if (typeof v !== 'string' || (v.length < BESIDE_MIN && v.charCodeAt(0) !== 0)) return v;
    beside.push(v);
    return `\u0000${beside.length - 1}`;
  });
}

/**
 * The fields `keys` of an input object, each read once. A value that is not an object is an
 * `EventValidationError` at `path` saying it `must be` what `what` says; anything thrown while
 * reading (a getter, a Proxy's trap, a revoked Proxy) is one naming the field (`prefix` + key),
 * with what was thrown as its `cause`.
 */
export function fieldsOf<K extends string>(value: unknown, path: string, prefix: string, keys: readonly K[], what: string, runId?: string): { [k in K]?: unknown } {
  let at = path;
  try {
    if (value === null || typeof value !== 'object' || Array.isArray(value)) invalid(path, what, runId);
    const out: { [k in K]?: unknown } = {};
    for (const k of keys) {
      at = `${prefix}${k}`;
      out[k] = (value as Record<K, unknown>)[k];
    }
    return out;
  } catch (err) {
    if (err instanceof WorldError) throw err;
    throw new EventValidationError('EVENT_VALIDATION', `${at}: could not be read: reading it threw ${thrownName(err)}`, { path: at, runId }, { cause: err });
  }
}

export function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const k of Object.keys(value)) deepFreeze((value as Record<string, unknown>)[k]);
  }
  return value;
}

/** Parse JSON text from the core and deep-freeze it. */
export function frozen<T>(text: string): T {
  return deepFreeze(JSON.parse(text) as T);
}

/** `v instanceof C`, false where asking throws (a revoked Proxy's prototype cannot be read). */
export function isInstance<T>(v: unknown, C: abstract new (...args: never[]) => T): v is T {
  try {
    return v instanceof C;
  } catch {
    return false;
  }
}

export function isPlainRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** The fields `keys` of an options object (none when it is `undefined`), each read once (see {@link fieldsOf}). */
export function options<T extends object, K extends keyof T & string>(value: T | undefined, name: string, keys: readonly K[]): Partial<Pick<T, K>> {
  if (value === undefined) return {};
  return fieldsOf(value, name, '', keys, 'must be an object') as Partial<Pick<T, K>>;
}
