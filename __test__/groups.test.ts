// appendEvents: a group of events committed to one run whole or not at all, on every kind of world.
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  appendEvents,
  EventAppendIdempotencyConflictError,
  EventSequenceConflictError,
  EventValidationError,
  IndexEntryConflictError,
  listEvents,
  lookupIndexEntry,
  WorldPathError,
  type World,
} from '@little-workflow/world';
import { rejection, worldKinds } from './helpers';

const sequences = async (world: World, runId: string) => (await listEvents(world, runId)).map((e) => e.sequence);

describe.each(worldKinds)('appendEvents on %s', (_name, makeWorld) => {
  it('commits a group at consecutive sequences and resolves with its envelopes in order', async () => {
    const world = makeWorld();
    await appendEvent(world, 'run_g', { type: 'custom.first', payload: {} });
    const group = await appendEvents(world, 'run_g', [
      { type: 'custom.a', payload: { n: 1 } },
      { type: 'custom.b', payload: { n: 2, long: 'x'.repeat(100_000) }, appendIdempotencyKey: 'k-b' },
      { type: 'custom.c', payload: { n: 3 }, index: [{ index: 'groups.test', key: 'g', value: 'c' }] },
    ]);
    expect(group.map((e) => [e.sequence, e.type])).toEqual([
      [2, 'custom.a'],
      [3, 'custom.b'],
      [4, 'custom.c'],
    ]);
    expect(Object.isFrozen(group[0])).toBe(true);
    expect(await listEvents(world, 'run_g')).toEqual([(await listEvents(world, 'run_g'))[0], ...group]);
    expect((group[1].payload as { long: string }).long).toHaveLength(100_000);
    expect(await lookupIndexEntry(world, 'groups.test', 'g')).toMatchObject({ runId: 'run_g', sequence: 4, value: 'c' });
  });

  it('writes nothing of a group one of whose events is refused', async () => {
    const world = makeWorld();
    await appendEvent(world, 'run_holder', { type: 'custom.hold', payload: {}, index: [{ index: 'groups.test', key: 'taken', value: 'x' }] });
    await appendEvent(world, 'run_r', { type: 'custom.first', payload: {}, appendIdempotencyKey: 'k1' });

    // The last event claims an entry another run holds.
    const held = await rejection(
      appendEvents(world, 'run_r', [
        { type: 'custom.a', payload: {}, index: [{ index: 'groups.test', key: 'free', value: 'a' }] },
        { type: 'custom.b', payload: {}, index: [{ index: 'groups.test', key: 'taken', value: 'b' }] },
      ]),
    );
    expect(held).toBeInstanceOf(IndexEntryConflictError);
    expect(await lookupIndexEntry(world, 'groups.test', 'free')).toBeUndefined();

    // The second event expects a sequence the first does not leave.
    const stale = await rejection(
      appendEvents(world, 'run_r', [
        { type: 'custom.a', payload: {}, expectedSequence: 1 },
        { type: 'custom.b', payload: {}, expectedSequence: 1 },
      ]),
    );
    expect(stale).toBeInstanceOf(EventSequenceConflictError);

    // A key stored before with another payload.
    const reused = await rejection(
      appendEvents(world, 'run_r', [
        { type: 'custom.a', payload: {} },
        { type: 'custom.first', payload: { other: true }, appendIdempotencyKey: 'k1' },
      ]),
    );
    expect(reused).toBeInstanceOf(EventAppendIdempotencyConflictError);
    expect(await sequences(world, 'run_r')).toEqual([1]);

    // The log goes on from where it was: no sequence was consumed.
    const next = await appendEvents(world, 'run_r', [
      { type: 'custom.a', payload: {}, expectedSequence: 1 },
      { type: 'custom.b', payload: {}, expectedSequence: 2 },
    ]);
    expect(next.map((e) => e.sequence)).toEqual([2, 3]);
  });

  it('keeps call order with appends sent before and after it, and fails alone among them', async () => {
    const world = makeWorld();
    const sent: Promise<unknown>[] = [];
    for (let i = 0; i < 20; i++) {
      sent.push(appendEvent(world, 'run_o', { type: 'custom.one', payload: { i } }));
      sent.push(appendEvents(world, 'run_o', [
        { type: 'custom.pair', payload: { i, part: 0 } },
        { type: 'custom.pair', payload: { i, part: 1 } },
      ]));
      // Refused in the same batch as the others: they commit all the same.
      sent.push(rejection(appendEvents(world, 'run_o', [{ type: 'custom.bad', payload: {} }, { type: 'custom.bad', payload: {}, expectedSequence: 0 }])));
    }
    await Promise.all(sent);
    const listed = await listEvents(world, 'run_o');
    expect(listed.map((e) => `${e.type}:${(e.payload as { i: number }).i}`)).toEqual(
      Array.from({ length: 20 }, (_, i) => [`custom.one:${i}`, `custom.pair:${i}`, `custom.pair:${i}`]).flat(),
    );
    expect(listed.map((e) => e.sequence)).toEqual(Array.from({ length: 60 }, (_, i) => i + 1));
  });

  it('answers a keyed group sent again with the events it stored', async () => {
    const world = makeWorld();
    const group = [
      { type: 'custom.a', payload: { n: 1 }, appendIdempotencyKey: 'a' },
      { type: 'custom.b', payload: { n: 2 }, appendIdempotencyKey: 'b' },
    ];
    const first = await appendEvents(world, 'run_k', group);
    const again = await appendEvents(world, 'run_k', group);
    expect(again).toEqual(first);
    expect(await sequences(world, 'run_k')).toEqual([1, 2]);
  });

  it('refuses a malformed group with a typed error naming the event', async () => {
    const world = makeWorld();
    const notArray = await rejection(appendEvents(world, 'run_m', {} as never));
    expect(notArray).toBeInstanceOf(EventValidationError);
    const badType = await rejection(appendEvents(world, 'run_m', [{ type: 'custom.a', payload: {} }, { type: 7, payload: {} } as never]));
    expect(badType).toBeInstanceOf(EventValidationError);
    expect(badType.message).toContain('events[1].type');
    const badPayload = await rejection(appendEvents(world, 'run_m', [{ type: 'custom.a', payload: [] as never }]));
    expect(badPayload.message).toContain('events[0].payload');
    expect((await rejection(appendEvents(world, 'run_m', []))).message).toMatch(/1 to 1000 events/);
    const many = Array.from({ length: 1001 }, () => ({ type: 'custom.a', payload: {} }));
    expect(await rejection(appendEvents(world, 'run_m', many))).toBeInstanceOf(EventValidationError);
    expect(await rejection(appendEvents(world, 'bad run id', [{ type: 'custom.a', payload: {} }]))).toBeInstanceOf(WorldPathError);
    expect(await sequences(world, 'run_m')).toEqual([]);
  });
});
