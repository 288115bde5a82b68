// What TypeScript accepts: `npm run lint` type-checks this file (its @ts-expect-error lines must be
// errors), and Vitest runs it.
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  appendRunEvent,
  appendSessionEvent,
  EventValidationError,
  foldRunEvents,
  listRunEvents,
  virtualWorld,
  type AppendEventInput,
  type RunEvent,
  type RunEventDraft,
  type SessionEvent,
} from '@little-workflow/world';
import { rejection, track } from './helpers';

// Values of interface types have no index signature, so they are not Record<string, unknown>s;
// the append functions used to refuse them at compile time.
interface StepPayload {
  stepPath: string;
  attempt: number;
}
interface NodeStarted {
  type: 'node:started';
  nodeId: string;
  nodeType: string;
}

describe('the types of the append functions', () => {
  it('take payloads and drafts of interface types, and object literals with any fields', async () => {
    const world = track(virtualWorld());
    const payload: StepPayload = { stepPath: 'a', attempt: 1 };
    expect((await appendEvent(world, 'run_t', { type: 'StepStarted', payload })).payload).toEqual(payload);
    await appendEvent(world, 'run_t', { type: 'Note', payload: { anything: [1], at: 'all' } });
    const draft: NodeStarted = { type: 'node:started', nodeId: 'n1', nodeType: 'agent' };
    expect((await appendRunEvent(world, 'run_r', draft)).nodeId).toBe('n1');
    await appendRunEvent(world, 'run_r', { type: 'node:completed', nodeId: 'n1', durationMs: 5, output: { text: 'ok' }, tokensUsed: { input: 1, output: 1, model: 'm' } });
    await appendSessionEvent(world, 'ses_t', { type: 'session:turn_started' });
  });

  it('keep the types code written against them reads back', async () => {
    const world = track(virtualWorld());
    // An input built first and then stamped, read and passed on, as before the overloads.
    const input: AppendEventInput = { type: 'StepStarted', payload: { stepPath: 'a' } };
    input.payload.attempt = 2;
    const asRecord: Record<string, unknown> = input.payload;
    expect(asRecord.stepPath).toBe('a');
    await appendEvent(world, 'run_t', input);
    // Parameters<> reads the last declaration: the record and draft types, with their fields.
    const viaParameters: Parameters<typeof appendEvent>[2] = { type: 'StepStarted', payload: { stepPath: 'b' } };
    expect(viaParameters.payload.stepPath).toBe('b');
    const draft: Parameters<typeof appendRunEvent>[2] = { type: 'node:started', nodeId: 'n2', nodeType: 'agent' };
    const sameDraft: RunEventDraft = draft;
    expect(sameDraft.nodeId).toBe('n2');
    await appendRunEvent(world, 'run_r2', draft);
  });

  it('type a listing by the kind of id it is given', async () => {
    const world = track(virtualWorld());
    await appendRunEvent(world, 'run_l', { type: 'node:started', nodeId: 'n1', nodeType: 'agent' });
    await appendSessionEvent(world, 'ses_l', { type: 'session:turn_started' });
    // A run's listing folds as it is (it needed a cast when every listing was typed as a union).
    expect(foldRunEvents(await listRunEvents(world, 'run_l')).nodes.n1).toBeDefined();
    const session: readonly SessionEvent[] = await listRunEvents(world, 'ses_l');
    expect(session[0].sessionId).toBe('ses_l');
    const id: string = 'run_l';
    const either: readonly (RunEvent | SessionEvent)[] = await listRunEvents(world, id);
    expect(either.length).toBe(1);
  });

  it('still refuse what is not an object, at compile time and at run time', async () => {
    const world = track(virtualWorld());
    // @ts-expect-error a payload is an object
    expect(await rejection(appendEvent(world, 'run_t', { type: 'x', payload: 5 }))).toBeInstanceOf(EventValidationError);
    // @ts-expect-error a draft has a type
    expect(await rejection(appendRunEvent(world, 'run_r', { nodeId: 'n1' }))).toBeInstanceOf(EventValidationError);
  });
});
