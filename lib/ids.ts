// Ids and vocabularies, as the core has them.
import { frozen } from './json.js';
import { native } from './native.js';

function idOf(kind: 'run' | 'session', id: unknown): boolean {
  if (typeof id !== 'string') return false;
  try {
    native.checkId(kind, id);
    return true;
  } catch {
    return false;
  }
}

/** Whether `id` is a run id: `run_` followed by 1–80 of `[A-Za-z0-9_-]`. */
export function isRunId(id: unknown): id is string {
  return idOf('run', id);
}

/** Whether `id` is a session id: `ses_` followed by 1–80 of `[A-Za-z0-9_-]`. */
export function isSessionId(id: unknown): id is string {
  return idOf('session', id);
}

/** The event types each vocabulary knows. */
export type KnownEventTypes = {
  /** The event log's own types (`RunStarted`, `harness.model.responded`, ...). */
  readonly events: readonly string[];
  /** The run events a run holds (`run:started`, `node:completed`, ...). */
  readonly runEvents: readonly string[];
  /** The run events a session holds (`session:*` and the types both carry). */
  readonly sessionEvents: readonly string[];
};

let knownTypes: KnownEventTypes | undefined;

/** The event types each vocabulary knows, as this build validates them. */
export function knownEventTypes(): KnownEventTypes {
  return (knownTypes ??= frozen<KnownEventTypes>(native.knownEventTypesJson()));
}
