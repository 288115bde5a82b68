/**
 * The pure-TypeScript PostgreSQL world the benchmark measures the native `postgresWorld` against.
 * Written as a good engineer would: node-postgres through a `pg.Pool` of 10 (its default), a schema
 * of its own created if missing, `synchronous_commit` set explicitly on every connection, one row
 * per event holding the whole envelope as canonical JSON text beside the indexed columns, a
 * per-run promise chain around one transaction per append (`SELECT MAX(sequence)` then `INSERT`,
 * as named prepared statements), JCS through the npm `canonicalize`, sha256 from `node:crypto`,
 * reads that parse each stored envelope and deep-freeze it, and the plain TypeScript fold of
 * ./fold.ts for materialization.
 *
 * It is the benchmark's baseline only, the PostgreSQL twin of ./world.ts: it checks what that one
 * checks on the append path (run id, JSON-safe payload, harness keys, idempotency) and nothing the
 * benchmark does not use. The promise chain orders appends within a process; an append that loses
 * a race with another process (unique violation) is retried (up to 50 times).
 */
import { Pool, type PoolClient } from 'pg';
import { canonicalClone, Chains, deepFreeze, jcs, sha256hex, type Envelope } from './common';
import { foldRun, pricingTable, type Registry } from './fold';

export class PgBaselineWorld {
  private readonly pool: Pool;
  private readonly chains = new Chains();
  private readonly ready: Promise<void>;
  private readonly t: string;

  constructor(connectionString: string, readonly schema: string, durability: 'full' | 'normal' = 'full') {
    if (!/^[a-z_][a-z0-9_]{0,62}$/.test(schema)) throw new Error(`invalid schema name ${schema}`);
    this.t = `"${schema}".events`;
    this.pool = new Pool({ connectionString, max: 10 });
    const sync = durability === 'full' ? 'on' : 'off';
    // Runs before any query of the new connection: pg queues a client's queries in order.
    this.pool.on('connect', (client) => void client.query(`SET synchronous_commit = ${sync}`).catch(() => undefined));
    this.ready = this.createTables();
    this.ready.catch(() => undefined);
  }

  private async createTables(): Promise<void> {
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN');
      // Two processes opening one fresh schema would otherwise race on CREATE ... IF NOT EXISTS.
      await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [this.schema]);
      await client.query(`CREATE SCHEMA IF NOT EXISTS "${this.schema}"`);
      await client.query(`CREATE TABLE IF NOT EXISTS ${this.t} (
        run_id text NOT NULL, sequence integer NOT NULL, event_id text NOT NULL, type text NOT NULL,
        idempotency_key text, request_digest text, envelope text NOT NULL,
        UNIQUE (run_id, sequence))`);
      await client.query(
        `CREATE UNIQUE INDEX IF NOT EXISTS events_key ON ${this.t} (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL`,
      );
      await client.query('COMMIT');
    } catch (e) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw e;
    } finally {
      client.release();
    }
  }

  /** Waits for the appends in flight, then ends the pool. */
  async close(): Promise<void> {
    await Promise.allSettled([this.ready, ...this.chains.pending()]);
    await this.pool.end();
  }

  appendEvent(runId: string, input: { type: string; payload: Record<string, unknown>; appendIdempotencyKey?: string }): Promise<Envelope> {
    if (!/^run_[A-Za-z0-9_-]{1,80}$/.test(runId)) return Promise.reject(new Error(`invalid run id ${runId}`));
    return this.chains.run(`events:${this.schema}:${runId}`, async () => {
      await this.ready;
      const { type, payload, appendIdempotencyKey: key } = input;
      if (type.startsWith('harness.') && key === undefined) throw new Error('harness appends need an appendIdempotencyKey');
      const canon = canonicalClone(payload);
      const digest = key === undefined ? null : `sha256:${sha256hex(`{"payload":${canon.text},"runId":${JSON.stringify(runId)},"type":${JSON.stringify(type)}}`)}`;
      const client = await this.pool.connect();
      try {
        for (let attempt = 1; ; attempt++) {
          try {
            return await this.appendIn(client, runId, type, canon.value, key, digest);
          } catch (e) {
            await client.query('ROLLBACK').catch(() => undefined);
            if ((e as { code?: string }).code !== '23505' || attempt === 50) throw e;
          }
        }
      } finally {
        client.release();
      }
    });
  }

  private async appendIn(
    client: PoolClient, runId: string, type: string, payload: Record<string, unknown>, key: string | undefined, digest: string | null,
  ): Promise<Envelope> {
    await client.query('BEGIN');
    if (key !== undefined) {
      const found = await client.query({
        name: `${this.schema}.byKey`,
        text: `SELECT request_digest, envelope FROM ${this.t} WHERE run_id = $1 AND idempotency_key = $2`,
        values: [runId, key],
      });
      if (found.rows.length > 0) {
        await client.query('COMMIT');
        if (found.rows[0].request_digest !== digest) throw new Error('EventAppendIdempotencyConflictError');
        return deepFreeze(JSON.parse(found.rows[0].envelope) as Envelope);
      }
    }
    const max = await client.query({ name: `${this.schema}.maxSeq`, text: `SELECT MAX(sequence) AS s FROM ${this.t} WHERE run_id = $1`, values: [runId] });
    const sequence = ((max.rows[0].s as number | null) ?? 0) + 1;
    const eventId = `evt_${sha256hex(jcs({ runId, sequence, type, payload })).slice(0, 16)}`;
    const recordedAt = new Date().toISOString();
    const e: Record<string, unknown> = { eventId, runId, sequence, type, recordedAt, payload };
    if (key !== undefined) {
      e.appendIdempotencyKey = key;
      e.canonicalRequestDigest = digest;
    }
    await client.query({
      name: `${this.schema}.insert`,
      text: `INSERT INTO ${this.t} (run_id, sequence, event_id, type, idempotency_key, request_digest, envelope) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
      values: [runId, sequence, eventId, type, key ?? null, digest, jcs(e)],
    });
    await client.query('COMMIT');
    return deepFreeze(e as Envelope);
  }

  async listEvents(runId: string, afterSequence = 0): Promise<readonly Envelope[]> {
    await this.ready;
    const r = await this.pool.query<string[]>({
      name: `${this.schema}.list`,
      text: `SELECT envelope FROM ${this.t} WHERE run_id = $1 AND sequence > $2 ORDER BY sequence`,
      values: [runId, afterSequence],
      rowMode: 'array',
    });
    return deepFreeze(r.rows.map((row) => JSON.parse(row[0]) as Envelope));
  }

  async materializeRunState(runId: string, registry: Registry): Promise<Record<string, unknown>> {
    const events = await this.listEvents(runId);
    return foldRun(runId, events as never, pricingTable(registry), (v) => jcs(v), sha256hex);
  }
}
