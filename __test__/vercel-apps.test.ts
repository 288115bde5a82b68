// Real apps on the Workflow SDK lines users install, built with each line's own `wf build`: the
// app in fixtures/vercel-app (a step, two parallel steps, a sleep, a hook resumed from outside, a
// stream written and read back) on a local world and on a PostgreSQL world of this package. The
// app is SIGKILLed in the middle of the workflow, and the workflow completes after a restart with
// every step, the sleep, the hook and the stream kept.
//
// Each line is installed into its folder under fixtures/vercel-app/lines by the first run (from
// the npm registry, with the committed lock file) and built again only when the app changes.
// Without the registry and without an install these tests are skipped with a `SKIPPED:` line;
// under CI=true they must run.
import './vercel-setup.js';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { cpSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { freshSchema, needs, needsPostgres, packageRoot, tempDir } from './helpers';

const app = join(__dirname, 'fixtures', 'vercel-app');

/** The lines served, each with the `@workflow/world` it installs and the spec version its runs get. */
const LINES = [
  { name: 'stable', world: '4.5.0', specVersion: 3, slotIds: false },
  { name: 'beta', world: '5.0.0-beta.37', specVersion: 7, slotIds: true },
] as const;

const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

/** The version of `pkg` installed in `dir`, or undefined. */
function installed(dir: string, pkg: string): string | undefined {
  const file = join(dir, 'node_modules', pkg, 'package.json');
  return existsSync(file) ? (JSON.parse(readFileSync(file, 'utf8')) as { version: string }).version : undefined;
}

/** Whether the line's folder has what its package.json asks for. */
function isInstalled(line: (typeof LINES)[number]): boolean {
  const dir = join(app, 'lines', line.name);
  const wanted = (JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { dependencies: { workflow: string } }).dependencies.workflow;
  return installed(dir, 'workflow') === wanted && installed(dir, '@workflow/world') === line.world;
}

/** Whether the npm registry answers (asked once, only when a line still has to be installed). */
function registryAnswers(): boolean {
  const r = spawnSync(npm, ['view', 'workflow@latest', 'version'], { encoding: 'utf8', timeout: 30_000 });
  return r.status === 0 && /^\d/.test(r.stdout.trim());
}

const runnable = needs(
  'the Workflow SDK apps (installed from the npm registry)',
  LINES.every(isInstalled) || registryAnswers(),
  'let the tests reach the npm registry once: they install each SDK line into __test__/fixtures/vercel-app/lines/<line> and reuse it after',
);

/** Install the line (when needed) and build the app with its `wf build` (when the app changed). */
function prepare(line: (typeof LINES)[number]): string {
  const dir = join(app, 'lines', line.name);
  if (!isInstalled(line)) {
    // `npm install` keeps to the committed lock file; `npm ci` refuses it, as npm 11 writes no
    // entries for optional platform packages of a package whose install script it skipped.
    const r = spawnSync(npm, ['install', '--no-audit', '--no-fund', '--ignore-scripts'], { cwd: dir, encoding: 'utf8', timeout: 540_000 });
    if (r.status !== 0) throw new Error(`installing the ${line.name} line failed:\n${r.stdout}\n${r.stderr}`);
  }
  const sources = ['workflows/demo.js', 'server.mjs'];
  const stamp = createHash('sha256');
  for (const f of [...sources.map((s) => join(app, s)), join(dir, 'package.json')]) stamp.update(readFileSync(f));
  const digest = stamp.digest('hex');
  const built = join(dir, '.built');
  if (!existsSync(built) || readFileSync(built, 'utf8') !== digest) {
    cpSync(join(app, 'workflows'), join(dir, 'workflows'), { recursive: true });
    cpSync(join(app, 'server.mjs'), join(dir, 'server.mjs'));
    const r = spawnSync(process.execPath, [join(dir, 'node_modules', 'workflow', 'bin', 'run.js'), 'build'], { cwd: dir, encoding: 'utf8', timeout: 180_000 });
    if (r.status !== 0) throw new Error(`wf build failed on the ${line.name} line:\n${r.stdout}\n${r.stderr}`);
    writeFileSync(built, digest);
  }
  return dir;
}

/** A port nothing listens on now. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

interface App {
  child: ChildProcess;
  url: string;
  exited: Promise<void>;
  output: () => string;
}

const apps: App[] = [];

afterEach(async () => {
  for (const a of apps.splice(0)) await kill(a);
});

/** Start the app in `dir` with `env`; resolves once it listens. */
async function startApp(dir: string, env: Record<string, string>): Promise<App> {
  const port = await freePort();
  const child = spawn(process.execPath, ['server.mjs'], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env, PORT: String(port) } });
  let out = '';
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (d) => {
      out += d;
      if (out.includes(`listening ${port}`)) resolve();
    });
    child.stderr!.on('data', (d) => (out += d));
    child.once('exit', (code) => reject(new Error(`the app exited (${code}) before it listened:\n${out}`)));
  });
  const a = { child, url: `http://127.0.0.1:${port}`, exited, output: () => out };
  apps.push(a);
  return a;
}

async function kill(a: App): Promise<void> {
  a.child.kill('SIGKILL');
  await a.exited;
  const i = apps.indexOf(a);
  if (i >= 0) apps.splice(i, 1);
}

async function call<T>(a: App, path: string, body?: unknown): Promise<T> {
  const res = await fetch(a.url + path, body === undefined ? undefined : { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await res.text();
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status} ${text}\n${a.output()}`);
  return JSON.parse(text) as T;
}

type SdkEvent = { eventId: string; eventType: string; correlationId?: string };

/** Poll until `ready` holds, for at most `ms`. */
async function until(what: string, a: App, ready: () => Promise<boolean>, ms = 60_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await ready())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}\n${a.output()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe.skipIf(!runnable).each(LINES)('an app built with the $name line (@workflow/world $world)', (line) => {
  let dir: string;
  beforeAll(() => {
    dir = prepare(line);
  }, 600_000);

  const worlds: [string, () => Record<string, string>][] = [['local', () => ({ WORKFLOW_TARGET_WORLD: join(packageRoot, 'vercel.js'), WORKFLOW_LITTLE_DATA_DIR: tempDir() })]];
  if (needsPostgres()) worlds.push(['PostgreSQL', () => ({ WORKFLOW_TARGET_WORLD: join(app, 'pg-world.mjs'), LITTLE_APP_SCHEMA: freshSchema() })]);

  it.each(worlds)('runs to completion on a %s world, through a SIGKILL in the middle and a restart', async (_kind, worldEnv) => {
    const env = worldEnv();
    let a = await startApp(dir, env);
    const token = `tok_${randomBytes(8).toString('hex')}`;
    const { runId } = await call<{ runId: string }>(a, '/start', { token, start: 1 });
    const events = (x: App) => call<SdkEvent[]>(x, `/runs/${runId}/events`);
    // Killed while the run sleeps: its steps are done, its sleep's wake-up is a queued message.
    await until('the sleep', a, async () => (await events(a)).some((e) => e.eventType === 'wait_created'));
    await kill(a);

    a = await startApp(dir, env);
    await until('the hook', a, async () => (await events(a)).some((e) => e.eventType === 'hook_created'));
    await call(a, `/hooks/${token}`, { word: 'hello' });
    await until('the end of the run', a, async () => (await call<{ status: string }>(a, `/runs/${runId}`)).status === 'completed');

    const run = await call<{ status: string; specVersion: number; result: unknown }>(a, `/runs/${runId}`);
    expect(run.result).toEqual({ a: 2, b: 12, c: 102, word: 'hello' });
    expect(run.specVersion).toBe(line.specVersion);
    expect(await call(a, `/runs/${runId}/stream`)).toEqual(['hello']);

    const log = await events(a);
    const count = (type: string) => log.filter((e) => e.eventType === type).length;
    expect([count('step_completed'), count('wait_completed'), count('hook_received'), count('run_completed')]).toEqual([5, 1, 1, 1]);
    // Each step completed once: no step ran to completion twice across the kill.
    const completed = log.filter((e) => e.eventType === 'step_completed').map((e) => e.correlationId);
    expect(new Set(completed).size).toBe(5);
    const ids = log.map((e) => e.eventId);
    expect(new Set(ids).size).toBe(ids.length);
    expect([...ids].sort()).toEqual(ids);
    if (line.slotIds) expect(ids).toEqual(ids.map((_, i) => `evnt_${String(i + 1).padStart(26, '0')}`));
  }, 180_000);
});
