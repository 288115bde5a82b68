/**
 * What both TypeScript baseline worlds (./world.ts on better-sqlite3, ./pg-world.ts on
 * node-postgres) share: the envelope's shape, the per-run promise chain, JCS through the npm
 * `canonicalize`, sha256 from `node:crypto`, and the deep freeze of what a read returns.
 */
import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';

export type Envelope = {
  readonly eventId: string;
  readonly runId: string;
  readonly sequence: number;
  readonly type: string;
  readonly appendIdempotencyKey?: string;
  readonly canonicalRequestDigest?: string;
  readonly recordedAt: string;
  readonly payload: Readonly<Record<string, unknown>>;
};

export const sha256hex = (data: string | Uint8Array) => createHash('sha256').update(data).digest('hex');
export const jcs = (v: unknown): string => canonicalize(v) as string;

export function deepFreeze<T>(v: T): T {
  if (v !== null && typeof v === 'object' && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const k of Object.keys(v)) deepFreeze((v as Record<string, unknown>)[k]);
  }
  return v;
}

/** canonicalClone: the payload as JCS text and as the value that text parses to. */
export function canonicalClone(payload: unknown): { text: string; value: Record<string, unknown> } {
  const text = jcs(payload);
  if (text === undefined) throw new Error('payload cannot be stored in JSON');
  return { text, value: JSON.parse(text) };
}

/**
 * One promise chain per key: each call runs after the previous call with its key has settled,
 * whatever its outcome. `pending()` is what is still running.
 */
export class Chains {
  private readonly chains = new Map<string, Promise<unknown>>();

  run<T>(key: string, fn: () => T | Promise<T>): Promise<T> {
    const previous = this.chains.get(key) ?? Promise.resolve();
    const next = previous.catch(() => undefined).then(fn);
    this.chains.set(key, next);
    return next.finally(() => {
      if (this.chains.get(key) === next) this.chains.delete(key);
    });
  }

  pending(): Promise<unknown>[] {
    return [...this.chains.values()];
  }
}
