// Envelopes out of the core's text: a committed event's envelope, and its payload decoded only
// when first read.
import { EventLogCorruptError } from './errors.js';
import { deepFreeze, frozen } from './json.js';

/** One committed fact of a run. */
export type EventEnvelope = {
  /** `evt_` + the first 16 hex of sha256(JCS({runId, sequence, type, payload})). */
  readonly eventId: string;
  readonly runId: string;
  /** 1-based, dense, strictly monotonic per run. */
  readonly sequence: number;
  readonly type: string;
  readonly appendIdempotencyKey?: string;
  /** `sha256:` + hex(sha256(JCS({runId, type, payload}))), set with a key. */
  readonly canonicalRequestDigest?: string;
  /** ISO-8601 UTC, millisecond precision. */
  readonly recordedAt: string;
  readonly payload: Readonly<Record<string, unknown>>;
};

/** Envelopes at least this long (in UTF-16 units) come back from an append with a lazy payload. */
const LAZY_ENVELOPE_MIN = 4096;

/**
 * A frozen envelope from its canonical JSON, with the payload decoded on first read. The envelope
 * is `{…,"eventId":…,"payload":<payload>,"recordedAt":…}`: the keys before the payload hold
 * strings (which cannot contain an unescaped `"payload":`), and `,"recordedAt":` after it is the
 * last of its kind. Only the small rest is parsed now; a large payload costs nothing until read.
 */
export function envelopeFromText(text: string): EventEnvelope {
  // A small envelope is cheaper to parse whole than to build lazily.
  if (text.length < LAZY_ENVELOPE_MIN) return frozen<EventEnvelope>(text);
  const start = text.indexOf('"payload":');
  const end = text.lastIndexOf(',"recordedAt":');
  if (start < 0 || end < start) return frozen<EventEnvelope>(text);
  const meta = JSON.parse(`${text.slice(0, start)}"payload":0${text.slice(end)}`) as Record<string, string> & { sequence: number };
  return lazyEnvelope(meta.runId, meta.sequence, meta.eventId, meta.recordedAt, meta.type, meta.appendIdempotencyKey ?? '', meta.canonicalRequestDigest ?? '', text.slice(start + 10, end));
}

/** Numbers per row of a packed listing (see crates/kernel/src/events/packed.rs). */
const PACKED_STRIDE = 8;

/**
 * Envelopes out of a packed listing: `parts` holds, per part, its text and its table, which gives
 * per row the sequence and where each piece starts in the text. One array is filled for all parts.
 */
export function unpack(runId: string, parts: readonly (string | Buffer)[]): EventEnvelope[] {
  let n = 0;
  for (let i = 1; i < parts.length; i += 2) n += (parts[i] as Buffer).length / 8 / PACKED_STRIDE;
  const out = new Array<EventEnvelope>(n);
  let r = 0;
  for (let i = 0; i < parts.length; i += 2) {
    const text = parts[i] as string;
    const table = parts[i + 1] as Buffer;
    const t = new Float64Array(table.buffer, table.byteOffset, table.length / 8);
    for (let b = 0; b < t.length; b += PACKED_STRIDE) {
      out[r++] = lazyEnvelope(
        runId,
        t[b],
        text.slice(t[b + 1], t[b + 2]),
        text.slice(t[b + 2], t[b + 3]),
        text.slice(t[b + 3], t[b + 4]),
        text.slice(t[b + 4], t[b + 5]),
        text.slice(t[b + 5], t[b + 6]),
        text.slice(t[b + 6], t[b + 7]),
      );
    }
  }
  return out;
}

/**
 * Gives a plain object the private state of a lazy payload: a base constructor that returns its
 * argument makes `new LazyPayload(o, raw)` add the private fields to `o` itself, so an envelope
 * keeps `Object.prototype` (a plain object to every library) while all envelopes share one
 * getter. A getter written in an object literal would cost a closure and an accessor pair per
 * envelope, and leave V8 unable to share their shapes: twice the time of a listing.
 */
class ReturnsItsArgument {
  constructor(o: object) {
    return o;
  }
}
class LazyPayload extends ReturnsItsArgument {
  #raw: string;
  #payload: Record<string, unknown> | undefined;
  constructor(o: object, raw: string) {
    super(o);
    this.#raw = raw;
  }
  static read(o: object): Record<string, unknown> {
    let self = o as LazyPayload;
    // Read through an object that inherits from an envelope, as the getter of a literal would.
    while (!(#raw in self)) self = Object.getPrototypeOf(self) as LazyPayload;
    return (self.#payload ??= deepFreeze(LazyPayload.parse(self)));
  }
  /** The payload's stored text, parsed; text that does not parse is a damaged row. */
  private static parse(self: LazyPayload): Record<string, unknown> {
    try {
      return JSON.parse(self.#raw) as Record<string, unknown>;
    } catch (err) {
      const { runId, sequence } = self as unknown as EventEnvelope;
      throw new EventLogCorruptError('EVENT_LOG_CORRUPT', `event log corrupt (${runId} sequence ${sequence}): the stored payload does not parse as JSON`, { runId, sequence }, { cause: err });
    }
  }
}
const LAZY_PAYLOAD: PropertyDescriptor = {
  get(this: object) {
    return LazyPayload.read(this);
  },
  enumerable: true,
};

/**
 * Sets the fields of an envelope without an idempotency key, in canonical order. It is called as a
 * constructor (`PlainEnvelope`) rather than an object literal being written: V8 sizes a
 * constructor's objects for all the fields it goes on to add (the private fields of `LazyPayload`
 * included), where a literal is sized for the properties it names and each later field goes to a
 * separate, growing store. Its `prototype` is `Object.prototype`, so what it makes are plain
 * objects.
 */
function plainFields(this: Record<string, unknown>, runId: string, sequence: number, eventId: string, recordedAt: string, type: string): void {
  this.eventId = eventId;
  Object.defineProperty(this, 'payload', LAZY_PAYLOAD);
  this.recordedAt = recordedAt;
  this.runId = runId;
  this.sequence = sequence;
  this.type = type;
}
plainFields.prototype = Object.prototype;
const PlainEnvelope = plainFields as unknown as new (runId: string, sequence: number, eventId: string, recordedAt: string, type: string) => object;

/** An envelope with an idempotency key: the key and digest come first in canonical order. */
function keyedFields(this: Record<string, unknown>, runId: string, sequence: number, eventId: string, recordedAt: string, type: string, key: string, digest: string): void {
  this.appendIdempotencyKey = key;
  this.canonicalRequestDigest = digest;
  plainFields.call(this, runId, sequence, eventId, recordedAt, type);
}
keyedFields.prototype = Object.prototype;
const KeyedEnvelope = keyedFields as unknown as new (runId: string, sequence: number, eventId: string, recordedAt: string, type: string, key: string, digest: string) => object;

/** A frozen envelope whose payload is parsed and deep-frozen on first read. Keys in canonical order. */
function lazyEnvelope(runId: string, sequence: number, eventId: string, recordedAt: string, type: string, key: string, digest: string, raw: string): EventEnvelope {
  const e = key === '' ? new PlainEnvelope(runId, sequence, eventId, recordedAt, type) : new KeyedEnvelope(runId, sequence, eventId, recordedAt, type, key, digest);
  new LazyPayload(e, raw);
  return Object.freeze(e) as unknown as EventEnvelope;
}
