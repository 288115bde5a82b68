// Shared test helpers: a temporary directory per test, the kinds of world every conformance test
// runs against, the check for a system component a test needs, and the test PostgreSQL server.
import { execFile, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import Database from 'better-sqlite3';
import { afterEach } from 'vitest';
import pg from 'pg';
import type { AddressInfo } from 'node:net';
import * as lib from '@little-workflow/world';
import { localWorld, postgresWorld, virtualWorld, type PricingRegistry, type World, type WorldError } from '@little-workflow/world';
import { createServer } from '../server/serve.js';

const dirs: string[] = [];
const worlds: World[] = [];
const schemas: string[] = [];
let postgresChecked: boolean | undefined;

afterEach(async () => {
  await Promise.all(worlds.splice(0).map((w) => w.close()));
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  const dropped = schemas.splice(0);
  if (dropped.length > 0) await withPg((c) => c.query(dropped.map((s) => `DROP SCHEMA IF EXISTS "${s}" CASCADE`).join('; ')));
});

/** A schema name no other test uses, dropped after the test. */
export function freshSchema(): string {
  const s = `t_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
  schemas.push(s);
  return s;
}

/** Run `body` with a node-postgres client on the test server, closed afterwards. */
export async function withPg<T>(body: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: postgresUrl() });
  await c.connect();
  try {
    return await body(c);
  } finally {
    await c.end();
  }
}

/** A fresh temporary directory, removed after the test. */
export function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'little-world-test-'));
  dirs.push(d);
  return d;
}

/** Remember a world so it is closed after the test. */
export function track<W extends World>(w: W): W {
  worlds.push(w);
  return w;
}

/**
 * The kinds of world the contract is checked against, opened with `pricing` if given. The
 * PostgreSQL world, in a fresh schema per world, is among them when the test server is there
 * (see `needsPostgres()`).
 */
export function worldKindsWith(opts: { pricing?: PricingRegistry } = {}): ReadonlyArray<readonly [string, () => World]> {
  const url = needsPostgres() ? postgresUrl() : undefined;
  return [
    ['localWorld', () => track(localWorld({ ...opts, dataDir: tempDir() }))],
    ['localWorld (durability normal)', () => track(localWorld({ ...opts, dataDir: tempDir(), durability: 'normal' }))],
    ['virtualWorld', () => track(virtualWorld(opts))],
    ...(url === undefined ? [] : ([['postgresWorld', () => track(postgresWorld({ ...opts, connectionString: url, schema: freshSchema() }))]] as const)),
  ];
}

/** The kinds of world the contract is checked against. */
export const worldKinds = worldKindsWith();

/** The error a promise rejects with; fails the test if it resolves. */
export async function rejection(p: Promise<unknown>): Promise<WorldError> {
  try {
    await p;
  } catch (e) {
    return e as WorldError;
  }
  throw new Error('expected a rejection');
}

/**
 * Whether a system component that some tests need (`what`, such as Chromium or PostgreSQL) is
 * `present`. When it is not, outside CI this says so in a line starting `SKIPPED:` with
 * `howToEnable`, and returns false: a fresh machine passes `npm test` with those tests skipped.
 * Under `CI=true` it throws instead, so that CI never passes without running them.
 */
export function needs(what: string, present: boolean, howToEnable: string): boolean {
  if (present) return true;
  if (process.env.CI === 'true') throw new Error(`${what} is missing, and under CI=true the tests that need it must run: ${howToEnable}`);
  console.warn(`SKIPPED: tests that need ${what}, which is missing: ${howToEnable}`);
  return false;
}

/**
 * The PostgreSQL server the tests may use: `LITTLE_TEST_DATABASE_URL`, which
 * `scripts/with-postgres.mjs` (and so `npm test`) sets to a throwaway cluster of its own.
 */
export function postgresUrl(): string | undefined {
  return process.env.LITTLE_TEST_DATABASE_URL || undefined;
}

/**
 * Whether the PostgreSQL tests can run, by `needs()`: without a server this says so once per
 * test file in a `SKIPPED:` line and returns false, and under `CI=true` it throws.
 */
export function needsPostgres(): boolean {
  postgresChecked ??= needs(
    'PostgreSQL (LITTLE_TEST_DATABASE_URL)',
    postgresUrl() !== undefined,
    "run the tests through `npm test` or `node scripts/with-postgres.mjs <command>` with Debian's postgresql installed (apt-get install postgresql), or set LITTLE_TEST_DATABASE_URL to a server the tests may use",
  );
  return postgresChecked;
}

/** Control of the test cluster's server, for fault tests. */
export interface PgControl {
  /** Restart the server: `immediate` (the default) kills it without a shutdown checkpoint, as a crash would. */
  restart(mode?: 'immediate' | 'fast'): Promise<void>;
  /** Stop the server (fast shutdown) and wait until it is down. */
  stop(): Promise<void>;
  /** Start the server again and wait until it accepts connections. */
  start(): Promise<void>;
}

/**
 * Control of the test cluster's server, from `LITTLE_TEST_PG_CTL` as `scripts/with-postgres.mjs`
 * sets it; undefined when the server is not one it started.
 */
export function pgControl(raw = process.env.LITTLE_TEST_PG_CTL): PgControl | undefined {
  if (!raw) return undefined;
  const ctl = JSON.parse(raw) as { bin: string; data: string; runAs: string | null; log: string };
  const pgCtl = async (...args: string[]): Promise<void> => {
    const [file, argv] = ctl.runAs ? ['runuser', ['-u', ctl.runAs, '--', ctl.bin, ...args]] : [ctl.bin, args];
    try {
      // The log file keeps the server's output off pg_ctl's pipes, which would otherwise stay open.
      await promisify(execFile)(file, argv, { cwd: dirname(ctl.data), encoding: 'utf8' });
    } catch (e) {
      const { stdout, stderr } = e as { stdout?: string; stderr?: string };
      throw new Error(`pg_ctl ${args.join(' ')} failed: ${stdout ?? ''}${stderr ?? ''}`, { cause: e });
    }
  };
  return {
    restart: (mode = 'immediate') => pgCtl('-D', ctl.data, '-l', ctl.log, '-w', '-t', '30', '-m', mode, 'restart'),
    stop: () => pgCtl('-D', ctl.data, '-w', '-t', '30', '-m', 'fast', 'stop'),
    start: () => pgCtl('-D', ctl.data, '-l', ctl.log, '-w', '-t', '30', 'start'),
  };
}

/** The root of the package, for spawning scripts. */
export const packageRoot = join(__dirname, '..');

/** A PostgreSQL server of a test's own, for faults that would disturb other tests' server. */
export interface OwnCluster {
  url: string;
  control: PgControl;
  /** Stop the server and remove it. */
  stop(): Promise<void>;
}

/**
 * Start a PostgreSQL server for one test, by `scripts/with-postgres.mjs`; undefined when the test
 * server is not one that script started (so there may be no binaries to start another with).
 */
export async function ownCluster(): Promise<OwnCluster | undefined> {
  if (!process.env.LITTLE_TEST_PG_CTL) return undefined;
  const env = { ...process.env };
  delete env.LITTLE_TEST_DATABASE_URL;
  delete env.LITTLE_TEST_PG_CTL;
  const child = spawn(process.execPath, [join(packageRoot, 'scripts', 'with-postgres.mjs'), `"${process.execPath}" "${join(__dirname, 'fixtures', 'hold-cluster.cjs')}"`], { cwd: packageRoot, env, stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const line = await new Promise<string>((resolve, reject) => {
    child.stdout.on('data', (d) => {
      out += d;
      if (out.includes('\n')) resolve(out.slice(0, out.indexOf('\n')));
    });
    child.once('exit', (code) => reject(new Error(`the test's own PostgreSQL server did not start (exit ${code}): ${err}`)));
  });
  const { url, ctl } = JSON.parse(line) as { url: string; ctl: string };
  return {
    url,
    control: pgControl(ctl)!,
    stop: async () => {
      child.stdin.end();
      await exited;
    },
  };
}

/** Take the world at `dataDir` back to schema 2, as the version before budget estimates left it. */
export function downgradeToSchema2(dataDir: string): void {
  const db = new Database(join(dataDir, 'events', 'events.db'));
  db.exec('DROP TRIGGER events_writer; DROP TABLE estimates; DROP TABLE usage_totals; DROP TABLE index_entries; DROP TABLE runs');
  db.pragma('user_version = 2');
  db.close();
}

/** The schema version this build writes. */
export const SCHEMA_VERSION = 7;

/**
 * Make a better-sqlite3 connection a writer of this schema, as the world's writer is: since
 * schema 4 an insert into `events` from any other connection is refused.
 */
export function asWriter(db: Database.Database): Database.Database {
  db.function('little_world_writer', (schema: unknown) => (schema === SCHEMA_VERSION ? 1 : 0));
  return db;
}

/** The schema version of the world at `dataDir`, read without opening it as a world. */
export function schemaVersion(dataDir: string): number {
  const db = new Database(join(dataDir, 'events', 'events.db'), { readonly: true });
  try {
    return db.pragma('user_version', { simple: true }) as number;
  } finally {
    db.close();
  }
}

/**
 * Whether `a` and `b` are the same value, key by key: own enumerable keys only (an own `__proto__`
 * key among them), each object's prototype Object's or none, bytes and dates by content.
 */
export function sameValue(a: unknown, b: unknown): boolean {
  if (a === null || b === null || typeof a !== 'object' || typeof b !== 'object') return a === b; // -0 as 0, as JSON has it
  if (a instanceof Uint8Array || b instanceof Uint8Array) {
    return a instanceof Uint8Array && b instanceof Uint8Array && Buffer.from(a).equals(Buffer.from(b));
  }
  if (a instanceof Date || b instanceof Date) return a instanceof Date && b instanceof Date && a.getTime() === b.getTime();
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((v, i) => sameValue(v, b[i]));
  }
  const plain = (o: object) => [Object.prototype, null].includes(Object.getPrototypeOf(o));
  if (!plain(a) || !plain(b)) return false;
  const ka = Object.keys(a).sort();
  const kb = Object.keys(b).sort();
  const own = (o: object, k: string) => Object.getOwnPropertyDescriptor(o, k)?.value;
  return ka.length === kb.length && ka.every((k, i) => k === kb[i] && sameValue(own(a, k), own(b, k)));
}

/**
 * A `little serve` server of `world` on a free loopback port (with `using` as the package it
 * serves through), and a close that ends its event streams first.
 */
export async function serveWorld(world: World, opts: Parameters<typeof createServer>[2] = {}, using: typeof lib = lib) {
  const server = createServer(using, world, opts);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    base,
    server,
    async close() {
      for (const c of server.openStreams) c.abort();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}

/**
 * Run `node __test__/fixtures/<fixture> ...args`, wait until it prints `ready`, and SIGKILL it
 * `afterMs` later (unless it has ended by then): whether it printed `done` first. What it wrote
 * to standard error fails the test.
 */
export async function killedChild(fixture: string, args: string[], ready: string, afterMs: number): Promise<boolean> {
  const child = spawn(process.execPath, [join(__dirname, 'fixtures', fixture), ...args], { cwd: packageRoot, env: process.env });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const started = Date.now();
  while (!out.includes(ready) && Date.now() - started < 20_000 && child.exitCode === null) await new Promise((r) => setTimeout(r, 2));
  await new Promise((r) => setTimeout(r, afterMs));
  child.kill('SIGKILL');
  await exited;
  if (err) throw new Error(`${fixture} failed: ${err}`);
  return out.includes('done');
}

/**
 * The world kinds that outlive a process, for a child to write and be killed: `where` is what the
 * fixtures' `openWorld` takes (a data directory, or `pg:<schema>`), `open` opens it here.
 */
export function durableKinds(): Array<[string, () => { where: string; open: () => World }]> {
  const kinds: Array<[string, () => { where: string; open: () => World }]> = [
    [
      'localWorld',
      () => {
        const dataDir = tempDir();
        return { where: dataDir, open: () => localWorld({ dataDir }) };
      },
    ],
  ];
  if (needsPostgres()) {
    kinds.push([
      'postgresWorld',
      () => {
        const schema = freshSchema();
        return { where: `pg:${schema}`, open: () => postgresWorld({ connectionString: postgresUrl()!, schema }) };
      },
    ]);
  }
  return kinds;
}

/**
 * Run the `little` command as a user does, from the package's folder, with `input` on its
 * standard input: its exit code, its output as text (and as bytes, `raw`), and its errors.
 */
export function runLittle(args: string[], input?: string | Buffer) {
  const r = spawnSync(process.execPath, [join(packageRoot, 'bin', 'little.js'), ...args], { cwd: packageRoot, input, maxBuffer: 1 << 28 });
  return { status: r.status, stdout: r.stdout.toString('utf8'), stderr: r.stderr.toString('utf8'), raw: r.stdout };
}
