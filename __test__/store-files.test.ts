// The files of a local world deleted, replaced or made something else: no append resolves after a
// file of the event store went under an open world, nothing acknowledged before is lost by what
// the world does next, and no special file put in a data directory hangs a world opening it.
import { execFileSync, spawnSync } from 'node:child_process';
import { renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { acquireRunLock, appendEvent, listEvents, localWorld, WorldIoError, WorldPathError, type Durability } from '@little-workflow/world';
import { packageRoot, rejection, tempDir } from './helpers';

/** The events of `runId` as a fresh process sees the world at `dataDir`. */
function countInChild(dataDir: string, runId: string): number {
  const script = `
    const { localWorld, listEvents, verifyWorld } = require('./world.js');
    (async () => {
      const w = localWorld({ dataDir: ${JSON.stringify(dataDir)} });
      const events = await listEvents(w, ${JSON.stringify(runId)});
      const report = await verifyWorld(w);
      await w.close();
      console.log(JSON.stringify({ n: events.length, ok: report.ok }));
    })().catch((e) => { console.error(e); process.exit(1); });`;
  const out = JSON.parse(execFileSync(process.execPath, ['-e', script], { cwd: packageRoot }).toString()) as { n: number; ok: boolean };
  expect(out.ok).toBe(true);
  return out.n;
}

type Damage = (eventsDir: string) => void;

const damages: ReadonlyArray<readonly [string, Damage]> = [
  ['the WAL deleted', (d) => rmSync(join(d, 'events.db-wal'))],
  [
    'the WAL replaced by an empty file',
    (d) => {
      renameSync(join(d, 'events.db-wal'), join(d, 'moved-away'));
      writeFileSync(join(d, 'events.db-wal'), '');
    },
  ],
  ['the -shm deleted', (d) => rmSync(join(d, 'events.db-shm'))],
];

describe.each(['full', 'normal'] as const)('at durability %s', (durability: Durability) => {
  describe.each(damages)('with %s', (_name, damage) => {
    it('refuses the next append and the next read, and keeps every acknowledged append through the close', async () => {
      const dataDir = tempDir();
      const world = localWorld({ dataDir, durability });
      for (let i = 0; i < 5; i++) await appendEvent(world, 'run_kept', { type: 'T', payload: { i } });
      damage(join(dataDir, 'events'));
      const append = await rejection(appendEvent(world, 'run_kept', { type: 'T', payload: { i: 5 } }));
      expect(append).toBeInstanceOf(WorldIoError);
      expect(append.code).toBe('WORLD_IO');
      // And it keeps refusing: the world is not writable again until it is reopened.
      expect((await rejection(appendEvent(world, 'run_kept', { type: 'T', payload: { i: 6 } }))).code).toBe('WORLD_IO');
      expect((await rejection(listEvents(world, 'run_kept'))).code).toBe('WORLD_IO');
      await world.close();
      expect(countInChild(dataDir, 'run_kept')).toBe(5);
    });

    it('keeps every acknowledged append when the world is closed with nothing else done', async () => {
      const dataDir = tempDir();
      const world = localWorld({ dataDir, durability });
      for (let i = 0; i < 5; i++) await appendEvent(world, 'run_kept', { type: 'T', payload: { i } });
      damage(join(dataDir, 'events'));
      await world.close();
      expect(countInChild(dataDir, 'run_kept')).toBe(5);
    });
  });

  it('refuses appends once events.db itself is deleted', async () => {
    const dataDir = tempDir();
    const world = localWorld({ dataDir, durability });
    await appendEvent(world, 'run_gone', { type: 'T', payload: {} });
    rmSync(join(dataDir, 'events', 'events.db'));
    expect((await rejection(appendEvent(world, 'run_gone', { type: 'T', payload: {} }))).code).toBe('WORLD_IO');
    await world.close();
  });
});

/** Open the world at `dataDir` in a child process that is killed after 10 s: its outcome, or 'hung'. */
function openInChild(dataDir: string): { ok: boolean; code?: string } | 'hung' {
  const r = spawnSync(process.execPath, [join(__dirname, 'fixtures', 'open-child.cjs'), dataDir], { cwd: packageRoot, encoding: 'utf8', timeout: 10_000 });
  if (r.error || r.signal) return 'hung';
  return JSON.parse(r.stdout) as { ok: boolean; code?: string };
}

const mkfifo = (path: string) => execFileSync('mkfifo', [path]);

describe.runIf(process.platform === 'linux')('special files in a data directory', () => {
  // Leftover temporary files of the world's own shapes, and lock files, made FIFOs: opening any
  // of them for reading would wait for a writer that never comes.
  const leftovers: ReadonlyArray<readonly [string, (dataDir: string) => void]> = [
    ['an artifact tmp file', (d) => mkfifo(join(d, 'artifacts', 'blobs', 'incoming.1.0-0-flock.tmp'))],
    ['a manifest tmp file', (d) => mkfifo(join(d, 'artifacts', 'manifest.999999.0-1-flock.tmp'))],
    ['an outer-loop tmp file', (d) => mkfifo(join(d, 'outer-loops', 'ol_x.json.1.2-3-flock.tmp'))],
    ['a symbolic link to a FIFO', (d) => {
      mkfifo(join(d, 'elsewhere'));
      symlinkSync(join(d, 'elsewhere'), join(d, 'artifacts', 'incoming.1.0-0-flock.tmp'));
    }],
  ];
  it.each(leftovers)('neither hang nor stop a world opening, with %s', async (_name, put) => {
    const dataDir = tempDir();
    await localWorld({ dataDir }).close();
    put(dataDir);
    expect(openInChild(dataDir)).toEqual({ ok: true });
  });

  it.each(['events.db', 'events.db-wal', 'events.db-shm'])('refuse a world whose %s is a FIFO, saying so', async (name) => {
    const dataDir = tempDir();
    await localWorld({ dataDir }).close();
    rmSync(join(dataDir, 'events', name), { force: true });
    mkfifo(join(dataDir, 'events', name));
    expect(openInChild(dataDir)).toEqual({ ok: false, code: 'WORLD_PATH', name: 'WorldPathError' });
    if (name === 'events.db') {
      const err = (() => {
        try {
          localWorld({ dataDir });
        } catch (e) {
          return e as Error;
        }
        throw new Error('opened');
      })();
      expect(err).toBeInstanceOf(WorldPathError);
    }
  });

  it('take no lock whose owner record is a FIFO for one held, and do not hang on it', async () => {
    const dataDir = tempDir();
    const world = localWorld({ dataDir });
    const lock = await acquireRunLock(world, 'run_fifo');
    await lock.release();
    await world.close();
    const r = spawnSync(
      process.execPath,
      ['-e', `
        const { localWorld, acquireRunLock } = require('./world.js');
        const { readdirSync, rmSync } = require('node:fs');
        const { execFileSync } = require('node:child_process');
        const { join } = require('node:path');
        (async () => {
          const dataDir = ${JSON.stringify(dataDir)};
          const w = localWorld({ dataDir });
          const held = await acquireRunLock(w, 'run_fifo');
          const dir = readdirSync(join(dataDir, 'locks')).map((n) => join(dataDir, 'locks', n)).find((p) => !p.endsWith('.recovery-lock'));
          rmSync(join(dir, 'owner.json'));
          execFileSync('mkfifo', [join(dir, 'owner.json')]);
          try { await acquireRunLock(w, 'run_fifo'); console.log('taken'); } catch (e) { console.log(e.code); }
          await w.close();
        })();`],
      { cwd: packageRoot, encoding: 'utf8', timeout: 10_000 },
    );
    expect(r.signal, r.stderr).toBeNull();
    expect(r.stdout.trim()).not.toBe('');
  });
});
