// The event log: appending, listing, checking a log's shape, and canonical JSON.
import { EventLogCorruptError, call, callSync, checkRunIdType, closedError, fromNative, invalid, wellFormed } from './errors.js';
import { envelopeFromText, unpack, type EventEnvelope } from './envelopes.js';
import { fieldsOf, isPlainRecord, jsonOf, options, read, snapshotOf, toJsonText } from './json.js';
import { native, type NativeWorld } from './native.js';
import { handleOf, nativeOf, wakeSubscribers, type World } from './worlds.js';

/** What to append. */
export interface AppendEventInput {
  type: string;
  payload: Record<string, unknown>;
  /** Required for every type that starts with `harness.`. */
  appendIdempotencyKey?: string;
  /**
   * Commit only if the run's last sequence is this one (0 for a run with no events); else the
   * append is refused with `EventSequenceConflictError` and writes nothing. A keyed retry of an
   * append already committed is answered with its event whatever it expected.
   */
  expectedSequence?: number;
  /** Index entries to set (or, with `value: null`, remove) in the same transaction as the event. */
  index?: readonly IndexWrite[];
}

/**
 * An entry of an index written with an event. An entry belongs to the run that wrote it: another
 * run's write to the same key is refused with `IndexEntryConflictError` until the owner removes it.
 */
export interface IndexWrite {
  index: string;
  key: string;
  /** The entry's value, or `null` to remove the entry. */
  value: string | null;
}

const INPUT_FIELDS = ['type', 'payload', 'appendIdempotencyKey', 'expectedSequence', 'index'] as const;

/**
 * {@link appendEvent} with a payload of an interface type, which has no index signature and so is
 * no `Record<string, unknown>` to TypeScript. (Declared first, so that `Parameters<typeof
 * appendEvent>`, which reads the last declaration, still names {@link AppendEventInput}.)
 */
export function appendEvent(world: World, runId: string, input: Omit<AppendEventInput, 'payload'> & { payload: object }): Promise<EventEnvelope>;
/**
 * Append an event to a run's log. Resolves with the committed, deep-frozen envelope once its row
 * is committed (as durably as the world's `durability` says). A rejected append writes nothing
 * and consumes no sequence number.
 */
export function appendEvent(world: World, runId: string, input: AppendEventInput): Promise<EventEnvelope>;
export function appendEvent(world: World, runId: string, input: AppendEventInput | (Omit<AppendEventInput, 'payload'> & { payload: object })): Promise<EventEnvelope> {
  // Not an async function: an append is on every hot path, and each promise layer costs a
  // microtask. Errors found here still reject the returned promise; nothing is thrown.
  let pending: Promise<string>;
  let handle: NativeWorld | undefined;
  try {
    handle = handleOf(world);
    checkRunIdType(runId);
    const a = nativeAppend(input, 'input', '', runId);
    pending = handle.append(runId, a.eventType, a.payloadJson, a.idempotencyKey, a.beside, a.expectedSequence, a.indexJson);
  } catch (err) {
    // As nativeOf, a closed world says so rather than what is wrong with the arguments; asked
    // only once they are refused, so that an append does not pay for it (the core checks too).
    return Promise.reject(handle?.closed ? closedError() : fromNative(err));
  }
  return pending.then(
    (text) => {
      wakeSubscribers(world, runId);
      return envelopeFromText(text);
    },
    (err: unknown) => {
      throw fromNative(err);
    },
  );
}

/**
 * Append events to a run's log in one transaction: all of them, in order and at consecutive
 * sequences, or none. Resolves with their committed, deep-frozen envelopes. Each input is as
 * {@link appendEvent}'s, and is checked as it would be at its place: an `expectedSequence`
 * against the events before it in the group too. The first refusal rejects the whole group, and
 * nothing of it is written. At most 1,000 events.
 */
export async function appendEvents(world: World, runId: string, inputs: readonly AppendEventInput[]): Promise<EventEnvelope[]> {
  let handle: NativeWorld | undefined;
  let pending: Promise<string[]>;
  try {
    handle = handleOf(world);
    checkRunIdType(runId);
    if (!Array.isArray(inputs)) invalid('events', 'must be an array of { type, payload }', runId);
    const group = inputs.map((input, i) => {
      const a = nativeAppend(input, `events[${i}]`, `events[${i}].`, runId);
      return { eventType: a.eventType, payloadJson: a.payloadJson, strings: a.beside, idempotencyKey: a.idempotencyKey, expectedSequence: a.expectedSequence, indexJson: a.indexJson };
    });
    pending = handle.appendGroup(runId, group);
  } catch (err) {
    throw handle?.closed ? closedError() : fromNative(err);
  }
  let texts: string[];
  try {
    texts = await pending;
  } catch (err) {
    throw fromNative(err);
  }
  wakeSubscribers(world, runId);
  return texts.map(envelopeFromText);
}

/** An append's input at `path` (its fields named with `prefix`), checked and converted for the native append. */
function nativeAppend(input: unknown, path: string, prefix: string, runId: string) {
  const { type, payload, appendIdempotencyKey, expectedSequence, index } = fieldsOf(input, path, prefix, INPUT_FIELDS, 'must be an object with type and payload', runId);
  if (typeof type !== 'string') invalid(`${prefix}type`, 'must be a string', runId);
  wellFormed(`${prefix}type`, type, runId);
  if (appendIdempotencyKey !== undefined) {
    if (typeof appendIdempotencyKey !== 'string') invalid(`${prefix}appendIdempotencyKey`, 'must be a string', runId);
    wellFormed(`${prefix}appendIdempotencyKey`, appendIdempotencyKey, runId);
  }
  if (expectedSequence !== undefined && (typeof expectedSequence !== 'number' || !Number.isSafeInteger(expectedSequence) || expectedSequence < 0)) {
    invalid(`${prefix}expectedSequence`, 'must be a non-negative safe integer', runId);
  }
  let indexJson: string | undefined;
  if (index !== undefined) {
    if (!Array.isArray(index)) invalid(`${prefix}index`, 'must be an array of { index, key, value }', runId);
    indexJson = toJsonText(index, `${prefix}index`, { runId });
  }
  // A colon type is a run event's (or a namespace's that may become one): its errors name no
  // key that looks like a credential, as appendRunEvent's do not.
  const { copy, long } = read(payload, `${prefix}payload`, { runId, screenKeys: type.includes(':') });
  if (!isPlainRecord(copy)) invalid(`${prefix}payload`, 'must be an object', runId);
  const beside: string[] = [];
  const payloadJson = jsonOf(copy, long ? beside : undefined);
  return {
    eventType: type,
    payloadJson,
    beside: beside.length > 0 ? beside : undefined,
    idempotencyKey: appendIdempotencyKey as string | undefined,
    expectedSequence: expectedSequence as number | undefined,
    indexJson,
  };
}

/** Options of {@link listEvents}. */
export interface ListEventsOptions {
  /** Only events with a greater sequence. Default 0. */
  afterSequence?: number;
  /** At most this many events. */
  limit?: number;
}

/**
 * A run's committed envelopes in sequence order, deep-frozen. Each payload is decoded the first
 * time it is read (then kept, deep-frozen): a listing of a large run costs little until its
 * payloads are used.
 */
export async function listEvents(world: World, runId: string, opts?: ListEventsOptions): Promise<readonly EventEnvelope[]> {
  const handle = nativeOf(world);
  checkRunIdType(runId);
  const o = options(opts, 'listEvents options', ['afterSequence', 'limit']);
  for (const name of ['afterSequence', 'limit'] as const) {
    const v = o[name];
    if (v !== undefined && (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0)) {
      invalid(name, 'must be a non-negative safe integer', runId);
    }
  }
  return (await listPacked(handle, runId, o.afterSequence, o.limit)).events;
}

/**
 * A run's envelopes after `after` (at most `limit`), with the length of the text they were cut
 * from. Given `maxUnits`, the listing ends with the first event that takes that text to
 * `maxUnits` (at least one event): one whose text is shorter holds every event there was.
 */
export async function listPacked(handle: NativeWorld, runId: string, after?: number, limit?: number, maxUnits?: number): Promise<{ events: readonly EventEnvelope[]; units: number }> {
  const parts = (await call(() => handle.listPacked(runId, after, limit, maxUnits))) as unknown as (string | Buffer)[];
  let units = 0;
  for (let i = 0; i < parts.length; i += 2) units += (parts[i] as string).length;
  return { events: Object.freeze(unpack(runId, parts)), units };
}

/**
 * Check that `events` is one run's log as the world writes it: sequences 1..n in order, each
 * `eventId` (and `canonicalRequestDigest`) matching its content. Throws `EventLogCorruptError`.
 */
export function validateEventLogShape(events: readonly EventEnvelope[]): void {
  let copy: unknown;
  try {
    copy = snapshotOf(events, 'events', { around: 2 });
  } catch (err) {
    throw new EventLogCorruptError('EVENT_LOG_CORRUPT', `the log cannot be read as JSON: ${(err as Error).message}`, {}, { cause: err });
  }
  if (!Array.isArray(copy)) {
    throw new EventLogCorruptError('EVENT_LOG_CORRUPT', 'expected an array of envelopes', {});
  }
  const text = jsonOf(copy);
  callSync(() => native.validateEventLogShapeJson(text));
}

/** RFC 8785 canonical JSON of a value, exactly as the world stores it. */
export function canonicalize(value: unknown): string {
  const text = toJsonText(value, 'value');
  return callSync(() => native.canonicalizeJson(text));
}
