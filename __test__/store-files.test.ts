// The files of a local world's event store deleted or replaced under an open world: no append
// resolves after, and nothing acknowledged before is lost by what the world does next.
import { execFileSync } from 'node:child_process';
import { renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { appendEvent, listEvents, localWorld, WorldIoError, type Durability } from '@little-workflow/world';
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
