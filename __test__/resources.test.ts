// What a world holds of the process's resources (file descriptors, threads), and what it does when
// the process runs short of them.
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { copyFileSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { appendEvent, listEvents, localWorld, materializeRunState, subscribe, WorldIoError, type World, type WorldError } from '@little-workflow/world';
import * as lib from '@little-workflow/world';
import { packageRoot, tempDir, track } from './helpers';

const onLinux = process.platform === 'linux';
const openFds = () => readdirSync('/proc/self/fd').length;

describe.runIf(onLinux)('file descriptors', () => {
  it('are let go of at close, with reads done and a subscription paused between two events', async () => {
    const dir = tempDir();
    // Kept reachable, so that nothing is let go of by the garbage collector instead of close().
    const closed: World[] = [];
    const cycle = async () => {
      const w = localWorld({ dataDir: dir });
      await appendEvent(w, 'run_fd', { type: 'StepStarted', payload: { stepPath: 's' } });
      await listEvents(w, 'run_fd');
      await materializeRunState(w, 'run_fd');
      const live = subscribe(w, 'run_fd');
      await live.next(); // paused at its first event, watching for other writers
      await w.close();
      closed.push(w);
    };
    await cycle(); // what the process starts once (threads, the addon) is not counted
    const before = openFds();
    for (let i = 0; i < 25; i++) await cycle();
    expect(openFds() - before).toBeLessThanOrEqual(2);
    expect(closed).toHaveLength(26);
  });
});

/** A pids cgroup this test may create and move a process into (cgroup v1 or v2, as root), or undefined. */
function pidsCgroupRoot(): string | undefined {
  if (!onLinux || process.getuid?.() !== 0) return undefined;
  for (const root of ['/sys/fs/cgroup/pids', '/sys/fs/cgroup']) {
    try {
      if (readdirSync(root).includes('cgroup.procs') && (root.endsWith('pids') || readFileSync(join(root, 'cgroup.subtree_control'), 'utf8').includes('pids'))) return root;
    } catch {
      // not this layout
    }
  }
  return undefined;
}

const CHILD = `
const lw = require(process.argv[1]);
const { once } = require('node:events');
const lines = require('node:readline').createInterface({ input: process.stdin });
const next = () => once(lines, 'line');
const outcome = (p) => p.then(() => 'ok', (e) => e.code ?? String(e));
(async () => {
  const [dir, dirB] = process.argv.slice(2);
  const a = lw.localWorld({ dataDir: dir });
  await lw.appendEvent(a, 'run_t', { type: 'StepStarted', payload: { stepPath: 's' } });
  await lw.listEvents(a, 'run_t');
  const art = await lw.writeArtifact(a, { runId: 'run_t', stepPath: 's', name: 'big', contentType: 'application/octet-stream', encoding: 'bytes', payload: Buffer.alloc(6 << 20, 7) });
  console.log('ready');
  await next(); // the parent has put this process at its thread limit
  const out = {};
  out.open = await outcome((async () => lw.localWorld({ dataDir: dirB }))());
  out.read = await outcome(lw.readArtifact(a, art.artifactRef).then((r) => { if (r.payload.length !== 6 << 20) throw new Error('short'); }));
  out.lock = await outcome(lw.acquireRunLock(a, 'run_t'));
  out.append = await outcome(lw.appendEvent(a, 'run_t', { type: 'StepStarted', payload: { stepPath: 's2' } }));
  out.close = await outcome(a.close());
  console.log(JSON.stringify(out));
  await next(); // the limit is lifted
  const b = lw.localWorld({ dataDir: dirB });
  out.after = (await lw.appendEvent(b, 'run_t', { type: 'StepStarted', payload: { stepPath: 's' } })).sequence;
  await b.close();
  console.log(JSON.stringify(out));
  process.exit(0);
})().catch((e) => { console.log('failed ' + e.stack); process.exit(3); });
`;

describe.runIf(pidsCgroupRoot() !== undefined)('at the process thread limit (a pids cgroup)', () => {
  it('opening a world, taking a lock and closing give errors or succeed, and never abort the process', async () => {
    const root = pidsCgroupRoot() as string;
    const group = join(root, `little-world-test-${process.pid}`);
    mkdirSync(group);
    const child = spawn(process.execPath, ['-e', CHILD, packageRoot, tempDir(), tempDir()], { stdio: ['pipe', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    const lines = createInterface({ input: child.stdout });
    const exited = once(child, 'exit') as Promise<[number | null, string | null]>;
    const next = () =>
      Promise.race([
        once(lines, 'line').then(([line]) => String(line)),
        exited.then(([code, signal]) => Promise.reject(new Error(`the child ended (${code ?? signal}): ${stderr}`))),
      ]);
    try {
      expect(await next()).toBe('ready');
      // Not one thread more than the process has now.
      writeFileSync(join(group, 'pids.max'), String(readdirSync(`/proc/${child.pid}/task`).length));
      writeFileSync(join(group, 'cgroup.procs'), String(child.pid));
      child.stdin.write('go\n');
      const limited = JSON.parse(await next());
      writeFileSync(join(group, 'pids.max'), 'max');
      child.stdin.write('go\n');
      const after = JSON.parse(await next());
      const [code] = await exited;
      expect({ code, stderr }).toEqual({ code: 0, stderr: '' });
      expect(limited).toEqual({ open: 'WORLD_IO', read: 'ok', lock: 'WORLD_IO', append: 'ok', close: 'ok' });
      expect(after.after).toBe(1);
    } finally {
      child.kill('SIGKILL');
      await exited;
      rmdirSync(group);
    }
  });
});

describe('worker threads', () => {
  it('load the addon one after another, each after the last has exited, without crashing the process', () => {
    // Node unloads an addon loaded only by a worker when it exits; the next load crashed
    // (SIGSEGV in the allocator's thread setup), as a test runner's thread pool does.
    const script = `
      const { Worker } = require('node:worker_threads');
      (async () => {
        for (let i = 0; i < 3; i++) {
          const w = new Worker(${JSON.stringify(`
            const lw = require(${JSON.stringify(join(packageRoot, 'world.js'))});
            const world = lw.virtualWorld();
            lw.appendEvent(world, 'run_w', { type: 'StepStarted', payload: { stepPath: 's' } }).then(() => world.close());
          `)}, { eval: true });
          const code = await new Promise((r) => w.on('exit', r));
          if (code !== 0) process.exit(10 + i);
        }
      })();`;
    const run = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60_000 });
    expect({ status: run.status, signal: run.signal, stderr: run.stderr }).toEqual({ status: 0, signal: null, stderr: '' });
  });
});

describe('close', () => {
  it('called twice, completes the second time only when the first has, after the appends before it', async () => {
    const world = localWorld({ dataDir: tempDir() });
    let settled = 0;
    const appends = Array.from({ length: 400 }, (_, i) =>
      appendEvent(world, `run_${i % 8}`, { type: 'StepStarted', payload: { stepPath: `s${i}` } }).then(() => settled++),
    );
    const first = world.close();
    await world.close();
    expect(settled).toBe(400);
    await first;
    await Promise.all(appends);
  });
});

/** What `open` throws: a WorldPathError of whichever copy of the package, naming `dataDir`. */
function refusedOpening(open: () => unknown, dataDir: string): WorldError {
  let err: WorldError | undefined;
  try {
    open();
  } catch (e) {
    err = e as WorldError;
  }
  expect(err?.name, dataDir).toBe('WorldPathError');
  expect(err?.code, dataDir).toBe('WORLD_PATH');
  expect(err?.path, dataDir).toBe(dataDir);
  return err!;
}

describe('two copies of the package in one process', () => {
  it('never have one data directory open at once: each has its own SQLite, blind to the other\'s locks', async () => {
    // A second installed copy, as npm installs when two dependents need versions it cannot dedupe.
    const copy = join(tempDir(), 'node_modules', '@little-workflow', 'world');
    mkdirSync(copy, { recursive: true });
    for (const f of readdirSync(packageRoot).filter((f) => /^(world\.(js|mjs)|index\.js|package\.json|.*\.node)$/.test(f))) {
      copyFileSync(join(packageRoot, f), join(copy, f));
    }
    mkdirSync(join(copy, 'lib'));
    for (const f of readdirSync(join(packageRoot, 'lib')).filter((f) => f.endsWith('.js'))) {
      copyFileSync(join(packageRoot, 'lib', f), join(copy, 'lib', f));
    }
    const other = (await import(pathToFileURL(join(copy, 'world.mjs')).href)) as typeof import('@little-workflow/world');
    const dataDir = tempDir();
    const mine = localWorld({ dataDir });
    await appendEvent(mine, 'run_c', { type: 'StepStarted', payload: { stepPath: 'a' } });
    const refused = refusedOpening(() => other.localWorld({ dataDir }), dataDir);
    // No code says why: the message says another copy has it open, which is what to act on.
    expect(refused.message).toContain('another copy of @little-workflow/world');
    refusedOpening(() => other.localWorld({ dataDir, readOnly: true }), dataDir);
    // Another directory is no concern, and this copy may open more worlds on its own.
    const elsewhere = other.localWorld({ dataDir: tempDir() });
    await other.appendEvent(elsewhere, 'run_c', { type: 'StepStarted', payload: { stepPath: 'b' } });
    await elsewhere.close();
    const again = localWorld({ dataDir });
    await mine.close();
    refusedOpening(() => other.localWorld({ dataDir }), dataDir);
    await again.close();
    // A close completes only once the reads begun before it are done: a read's connection left
    // open after it would be this copy's SQLite, and its close would drop the other copy's locks.
    const last = localWorld({ dataDir });
    await Promise.all(Array.from({ length: 20_000 }, (_, i) => appendEvent(last, 'run_big', { type: 'StepStarted', payload: { stepPath: `s${i}` } })));
    let listed = false;
    const listing = listEvents(last, 'run_big').then(() => (listed = true));
    await last.close();
    expect(listed).toBe(true);
    await listing;
    // Once this copy's worlds are closed, the other copy may open the directory.
    const theirs = other.localWorld({ dataDir });
    expect((await other.appendEvent(theirs, 'run_c', { type: 'StepStarted', payload: { stepPath: 'c' } })).sequence).toBe(2);
    refusedOpening(() => localWorld({ dataDir }), dataDir);
    // A directory deleted and made again at the same path: the world open on the old one is
    // this copy's SQLite still (its close would take the new store's WAL with it).
    const gone = tempDir();
    const stale = localWorld({ dataDir: gone });
    await appendEvent(stale, 'run_c', { type: 'StepStarted', payload: { stepPath: 'x' } });
    rmSync(gone, { recursive: true, force: true });
    mkdirSync(gone);
    refusedOpening(() => other.localWorld({ dataDir: gone }), gone);
    // The stale world refuses to read the new store, naming the file it had open.
    const replaced = await listEvents(stale, 'run_nothing').then(() => undefined, (e: WorldError) => e);
    expect(replaced).toBeInstanceOf(WorldIoError);
    expect(replaced?.code).toBe('WORLD_IO');
    expect(replaced?.path).toBe(join(stale.dataDir!, 'events', 'events.db'));
    await stale.close();
    // Through a symlink to the directory too.
    const link = join(tempDir(), 'link');
    symlinkSync(dataDir, link);
    refusedOpening(() => localWorld({ dataDir: link }), link);
    for (let i = 0; i < 5; i++) await other.appendEvent(theirs, 'run_c', { type: 'StepStarted', payload: { stepPath: `d${i}` } });
    await theirs.close();
    const after = track(localWorld({ dataDir }));
    expect((await listEvents(after, 'run_c')).map((e) => e.sequence)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect((await lib.verifyWorld(after)).ok).toBe(true);
  });
});
