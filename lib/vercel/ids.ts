// Ids of the SDK's model, and how they map onto ours.
import { randomBytes } from 'node:crypto';

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

let lastTime = -1;
let lastRandom: number[] = [];

/** A monotonic ULID: later calls in one process sort after earlier ones, even within a millisecond. */
export function ulid(now = Date.now()): string {
  if (now <= lastTime) {
    // Same (or an earlier) millisecond: increment the random part instead of drawing a new one.
    let i = lastRandom.length - 1;
    while (i >= 0 && lastRandom[i] === 31) lastRandom[i--] = 0;
    if (i >= 0) lastRandom[i]++;
    now = lastTime;
  } else {
    const bytes = randomBytes(16);
    lastRandom = Array.from(bytes, (b) => b & 31);
    lastTime = now;
  }
  let time = '';
  for (let t = now, i = 0; i < 10; i++, t = Math.floor(t / 32)) time = CROCKFORD[t % 32] + time;
  return time + lastRandom.map((d) => CROCKFORD[d]).join('');
}

/** Our log of an SDK run (`wrun_…`). */
export function logOfRun(sdkRunId: string): string {
  return `run_${sdkRunId}`;
}

/** The SDK run id of one of our run logs, or undefined when it is none. */
export function runOfLog(logId: string): string | undefined {
  return logId.startsWith('run_wrun_') ? logId.slice(4) : undefined;
}

/** Sequence digits in an event id: they sort as the sequences do. */
const SEQUENCE_DIGITS = 12;

/**
 * The SDK id of the `part`-th SDK event an envelope holds (most hold one; an event that also
 * creates its entity holds the creation first), for runs created before slot ids.
 */
export function eventIdOf(sequence: number, part: number): string {
  const s = String(sequence).padStart(SEQUENCE_DIGITS, '0');
  return part === 0 ? `evnt_${s}` : `evnt_${s}_${part}`;
}
