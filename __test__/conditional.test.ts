// Conditional appends and the index entries written with events, against every kind of world.
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  EventSequenceConflictError,
  EventValidationError,
  IndexEntryConflictError,
  listEvents,
  listIndexEntries,
  lookupIndexEntry,
} from '@little-workflow/world';
import { worldKinds, rejection } from './helpers';

const step = (stepPath: string) => ({ type: 'StepStarted', payload: { stepPath } });

describe.each(worldKinds)('conditional appends and index entries on %s', (_name, makeWorld) => {
  it('commits an append only when the run is at its expected sequence', async () => {
    const world = makeWorld();
    expect((await appendEvent(world, 'run_cas', { ...step('a'), expectedSequence: 0 })).sequence).toBe(1);
    // Two writers that both read sequence 1: one wins, the other is told what the log holds.
    const both = await Promise.allSettled([
      appendEvent(world, 'run_cas', { ...step('b'), expectedSequence: 1 }),
      appendEvent(world, 'run_cas', { ...step('c'), expectedSequence: 1 }),
    ]);
    expect(both.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const lost = both.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect(lost.reason).toBeInstanceOf(EventSequenceConflictError);
    expect(lost.reason.code).toBe('EVENT_SEQUENCE_CONFLICT');
    expect(lost.reason.details).toMatchObject({ runId: 'run_cas', expectedSequence: 1, lastSequence: 2 });
    expect((await listEvents(world, 'run_cas')).map((e) => e.sequence)).toEqual([1, 2]);
    const bad = await rejection(appendEvent(world, 'run_cas', { ...step('d'), expectedSequence: -1 }));
    expect(bad).toBeInstanceOf(EventValidationError);
    expect(bad.details.path).toBe('expectedSequence');
  });

  it('gives an index entry to the run that wrote it until that run removes it', async () => {
    const world = makeWorld();
    const a = await appendEvent(world, 'run_owner', { ...step('a'), index: [{ index: 'hook.token', key: 'tok-1', value: 'hook_1' }] });
    expect(await lookupIndexEntry(world, 'hook.token', 'tok-1')).toEqual({ index: 'hook.token', key: 'tok-1', value: 'hook_1', runId: 'run_owner', sequence: a.sequence });
    const taken = await rejection(appendEvent(world, 'run_other', { ...step('b'), index: [{ index: 'hook.token', key: 'tok-1', value: 'hook_2' }] }));
    expect(taken).toBeInstanceOf(IndexEntryConflictError);
    expect(taken.details).toMatchObject({ runId: 'run_other', index: 'hook.token', key: 'tok-1', holderRunId: 'run_owner' });
    // The refused append wrote nothing: no event, no entry.
    expect(await listEvents(world, 'run_other')).toEqual([]);
    await appendEvent(world, 'run_owner', { ...step('c'), index: [{ index: 'hook.token', key: 'tok-1', value: null }] });
    expect(await lookupIndexEntry(world, 'hook.token', 'tok-1')).toBeUndefined();
    await appendEvent(world, 'run_other', { ...step('d'), index: [{ index: 'hook.token', key: 'tok-1', value: 'hook_2' }] });
    expect((await lookupIndexEntry(world, 'hook.token', 'tok-1'))?.runId).toBe('run_other');
  });

  it('lists an index by key in either order, filtered by value, a page at a time', async () => {
    const world = makeWorld();
    const index = Array.from({ length: 7 }, (_, i) => ({ index: 'runs.by.status', key: `run_${i}`, value: i % 2 === 0 ? 'running' : 'done' }));
    await appendEvent(world, 'run_lister', { ...step('a'), index });
    const keys = async (opts: Parameters<typeof listIndexEntries>[2]) => (await listIndexEntries(world, 'runs.by.status', opts)).map((e) => e.key);
    expect(await keys({ value: 'running' })).toEqual(['run_0', 'run_2', 'run_4', 'run_6']);
    expect(await keys({ order: 'desc', limit: 3 })).toEqual(['run_6', 'run_5', 'run_4']);
    expect(await keys({ order: 'desc', after: 'run_4', limit: 2 })).toEqual(['run_3', 'run_2']);
    expect(await keys({ value: 'done', after: 'run_1' })).toEqual(['run_3', 'run_5']);
    expect(Object.isFrozen((await listIndexEntries(world, 'runs.by.status'))[0])).toBe(true);
    for (const [opts, path] of [
      [{ limit: 0 }, 'limit'],
      [{ order: 'up' }, 'order'],
      [{ after: 1 }, 'after'],
    ] as const) {
      const err = await rejection(listIndexEntries(world, 'runs.by.status', opts as never));
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.details.path).toBe(path);
    }
  });

  it('refuses a malformed index write, writing nothing', async () => {
    const world = makeWorld();
    for (const [index, path] of [
      [{ index: 'i', key: 'k' }, 'index'],
      [[{ index: 'i', key: '', value: 'v' }], 'index[0].key'],
      [[{ index: 'i', key: 'k', value: 'v', extra: 1 }], 'index'],
      [[{ index: 'i', key: 'k', value: 5 }], 'index'],
    ] as const) {
      const err = await rejection(appendEvent(world, 'run_badindex', { ...step('a'), index: index as never }));
      expect(err).toBeInstanceOf(EventValidationError);
      expect(err.details.path).toBe(path);
      expect(err.runId).toBe('run_badindex');
    }
    expect(await listEvents(world, 'run_badindex')).toEqual([]);
    expect(await listIndexEntries(world, 'i')).toEqual([]);
  });
});
