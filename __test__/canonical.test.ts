// RFC 8785 canonical JSON: the published vectors, number formatting against Node itself, and key
// order by UTF-16 code units.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { canonicalize, EventValidationError } from '@little-workflow/world';

const vectors = join(__dirname, 'fixtures', 'jcs');

describe('canonical JSON', () => {
  it('passes every RFC 8785 test vector', () => {
    const names = readdirSync(join(vectors, 'input'));
    expect(names.length).toBeGreaterThanOrEqual(6);
    for (const name of names) {
      const input = JSON.parse(readFileSync(join(vectors, 'input', name), 'utf8'));
      const expected = readFileSync(join(vectors, 'output', name), 'utf8');
      expect(canonicalize(input), name).toBe(expected);
    }
  });

  it('writes 100,000 random doubles exactly as String(x) does', () => {
    const buf = new DataView(new ArrayBuffer(8));
    const values: number[] = [];
    let seed = 0x9e3779b9;
    const next32 = () => {
      // xorshift32: reproducible across runs
      seed ^= seed << 13;
      seed ^= seed >>> 17;
      seed ^= seed << 5;
      return seed >>> 0;
    };
    while (values.length < 100_000) {
      buf.setUint32(0, next32());
      buf.setUint32(4, next32());
      const bits = buf.getFloat64(0);
      if (Number.isFinite(bits)) values.push(bits);
      // also doubles of ordinary magnitudes, where most real payload numbers live
      values.push((next32() / 2 ** 32 - 0.5) * 10 ** ((next32() % 40) - 20));
    }
    const out = canonicalize(values);
    expect(out).toBe(`[${values.map((v) => String(v)).join(',')}]`);
  });

  it('writes the edge cases of number formatting as Node does', () => {
    const edges = [
      0, -0, 1, -1, Number.MIN_VALUE, -Number.MIN_VALUE, Number.MAX_VALUE, Number.EPSILON,
      Number.MAX_SAFE_INTEGER, Number.MIN_SAFE_INTEGER, 2 ** 53 + 2, 2 ** 64, 1e21, 1e21 - 65536, 999999999999999900000,
      1e-6, 1e-7, 1.5e-7, 123e-20, 0.1, 0.2, 0.1 + 0.2, 1 / 3, 5e-324, 2.2250738585072014e-308, 2.225073858507201e-308,
      4.35, 0.000001234, 1e300, 123456789012345680000, 9.007199254740993e15,
    ];
    for (const x of edges) expect(canonicalize([x]), String(x)).toBe(`[${String(x)}]`);
    expect(canonicalize(-0)).toBe('0');
  });

  it('sorts keys by UTF-16 code units, not code points', () => {
    // '\u{1F600}' is the surrogate pair D83D DE00: below U+E000 in UTF-16 order, above it in code points.
    const obj = { '\uE000': 'private use', '\u{1F600}': 'emoji', z: 1, '\uFFFF': 'last' };
    expect(canonicalize(obj)).toBe('{"z":1,"\u{1F600}":"emoji","\uE000":"private use","\uFFFF":"last"}');
    const keys = Object.keys(obj).sort(); // JavaScript's own sort is by UTF-16 code units
    expect(JSON.parse(canonicalize(obj)) && Object.keys(JSON.parse(canonicalize(obj)))).toEqual(
      Object.keys(JSON.parse(JSON.stringify(obj, keys))),
    );
  });

  it('refuses what JSON cannot carry, naming the path', () => {
    const bad: Array<[unknown, string]> = [
      [{ a: [1, NaN] }, 'value.a[1]'],
      [{ a: { b: Infinity } }, 'value.a.b'],
      [{ 'x y': 10n }, 'value["x y"]'],
      [[undefined], 'value[0]'],
      [{ f: () => 1 }, 'value.f'],
      [{ s: Symbol('s') }, 'value.s'],
      [{ s: '\ud800' }, 'value.s'],
      [{ m: new Map([[1, 2]]) }, 'value.m'],
    ];
    for (const [value, path] of bad) {
      let caught: unknown;
      try {
        canonicalize(value);
      } catch (e) {
        caught = e;
      }
      expect(caught, path).toBeInstanceOf(EventValidationError);
      expect((caught as EventValidationError).code).toBe('EVENT_VALIDATION');
      expect((caught as EventValidationError).path).toBe(path);
    }
  });
});
