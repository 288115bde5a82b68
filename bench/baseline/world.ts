/**
 * The pure-TypeScript world the benchmark measures the native one against. Written as a good
 * engineer would: better-sqlite3 in WAL mode with `synchronous` set explicitly, one row per event holding the
 * whole envelope as canonical JSON beside the indexed columns, a per-run promise chain around
 * `SELECT MAX(sequence)` then `INSERT`, JCS through the npm `canonicalize`, sha256 from
 * `node:crypto`, reads that parse the stored envelope and deep-freeze it, artifacts as
 * tmp + fsync + rename files re-hashed on every read, and the plain TypeScript fold of ./fold.ts
 * for materialization.
 *
 * It is the benchmark's baseline only: it checks what the native append path checks (JSON-safe
 * payload, harness keys, idempotency, artifact references) and nothing the benchmark does not use.
 */
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, renameSync, writeSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { canonicalClone, Chains, deepFreeze, jcs, sha256hex, type Envelope } from './common';
import { foldRun, pricingTable, type Registry } from './fold';

function collectRefs(v: unknown, out: string[]): void {
  if (typeof v === 'string') {
    if (/^artifact:\/\/art_[0-9a-f]{16}$/.test(v)) out.push(v.slice('artifact://'.length));
  } else if (Array.isArray(v)) for (const x of v) collectRefs(x, out);
  else if (v && typeof v === 'object') for (const x of Object.values(v)) collectRefs(x, out);
}

export class BaselineWorld {
  private readonly db: Database.Database;
  private readonly chains = new Chains();
  private readonly artifactsDir: string;
  private readonly maxSeq: Database.Statement;
  private readonly byKey: Database.Statement;
  private readonly insert: Database.Statement;
  private readonly list: Database.Statement;

  constructor(readonly dataDir: string, durability: 'full' | 'normal' = 'full') {
    mkdirSync(join(dataDir, 'events'), { recursive: true });
    this.artifactsDir = join(dataDir, 'artifacts');
    mkdirSync(join(this.artifactsDir, 'blobs'), { recursive: true });
    this.db = new Database(join(dataDir, 'events', 'events.db'));
    this.db.pragma('journal_mode = WAL');
    this.db.pragma(`synchronous = ${durability === 'full' ? 'FULL' : 'NORMAL'}`);
    this.db.exec(`CREATE TABLE IF NOT EXISTS events (
      run_id TEXT NOT NULL, sequence INTEGER NOT NULL, event_id TEXT NOT NULL, type TEXT NOT NULL,
      idempotency_key TEXT, request_digest TEXT, envelope TEXT NOT NULL,
      UNIQUE (run_id, sequence));
      CREATE UNIQUE INDEX IF NOT EXISTS events_key ON events (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;`);
    this.maxSeq = this.db.prepare('SELECT MAX(sequence) AS s FROM events WHERE run_id = ?');
    this.byKey = this.db.prepare('SELECT request_digest, envelope FROM events WHERE run_id = ? AND idempotency_key = ?');
    this.insert = this.db.prepare(
      'INSERT INTO events (run_id, sequence, event_id, type, idempotency_key, request_digest, envelope) VALUES (?, ?, ?, ?, ?, ?, ?)',
    );
    this.list = this.db.prepare('SELECT envelope FROM events WHERE run_id = ? AND sequence > ? ORDER BY sequence').pluck();
  }

  close(): void {
    this.db.close();
  }

  appendEvent(runId: string, input: { type: string; payload: Record<string, unknown>; appendIdempotencyKey?: string }): Promise<Envelope> {
    if (!/^run_[A-Za-z0-9_-]{1,80}$/.test(runId)) return Promise.reject(new Error(`invalid run id ${runId}`));
    return this.chains.run(`events:${this.dataDir}:${runId}`, () => {
      const { type, payload, appendIdempotencyKey: key } = input;
      if (type.startsWith('harness.') && key === undefined) throw new Error('harness appends need an appendIdempotencyKey');
      const canon = canonicalClone(payload);
      const refs: string[] = [];
      collectRefs(canon.value, refs);
      for (const id of refs) if (!existsSync(join(this.artifactsDir, `${id}.json`))) throw new Error(`artifact ${id} not found`);
      const digest = key === undefined ? null : `sha256:${sha256hex(`{"payload":${canon.text},"runId":${JSON.stringify(runId)},"type":${JSON.stringify(type)}}`)}`;
      if (key !== undefined) {
        const found = this.byKey.get(runId, key) as any;
        if (found) {
          if (found.request_digest !== digest) throw new Error('EventAppendIdempotencyConflictError');
          return deepFreeze(JSON.parse(found.envelope) as Envelope);
        }
      }
      const sequence = ((this.maxSeq.get(runId) as { s: number | null }).s ?? 0) + 1;
      const eventId = `evt_${sha256hex(jcs({ runId, sequence, type, payload: canon.value })).slice(0, 16)}`;
      const recordedAt = new Date().toISOString();
      const e: Record<string, unknown> = { eventId, runId, sequence, type, recordedAt, payload: canon.value };
      if (key !== undefined) {
        e.appendIdempotencyKey = key;
        e.canonicalRequestDigest = digest;
      }
      this.insert.run(runId, sequence, eventId, type, key ?? null, digest, jcs(e));
      return deepFreeze(e as Envelope);
    });
  }

  async listEvents(runId: string, afterSequence = 0): Promise<readonly Envelope[]> {
    return deepFreeze((this.list.all(runId, afterSequence) as string[]).map((text) => JSON.parse(text) as Envelope));
  }

  async materializeRunState(runId: string, registry: Registry): Promise<Record<string, unknown>> {
    const events = await this.listEvents(runId);
    return foldRun(runId, events as never, pricingTable(registry), (v) => jcs(v), sha256hex);
  }

  private publish(path: string, data: Uint8Array): void {
    const tmp = `${path}.${process.pid}.tmp`;
    const fd = openSync(tmp, 'w');
    try {
      writeSync(fd, data);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
    const dir = openSync(join(path, '..'), 'r');
    try {
      fsyncSync(dir);
    } finally {
      closeSync(dir);
    }
  }

  async writeArtifact(input: { runId: string; stepPath: string; name: string; contentType: string; encoding: 'bytes'; payload: Uint8Array }) {
    const payloadHash = `sha256:${sha256hex(input.payload)}`;
    const { runId, stepPath, name, contentType, encoding } = input;
    const artifactId = `art_${sha256hex(jcs({ runId, stepPath, name, contentType, encoding, payloadHash })).slice(0, 16)}`;
    const manifest = {
      artifactId, artifactRef: `artifact://${artifactId}`, runId, stepPath, name, contentType, encoding,
      sha256: payloadHash, sizeBytes: input.payload.length, createdAt: new Date().toISOString(),
    };
    this.publish(join(this.artifactsDir, 'blobs', `${artifactId}.bin`), input.payload);
    this.publish(join(this.artifactsDir, `${artifactId}.json`), Buffer.from(jcs(manifest)));
    return deepFreeze(manifest);
  }

  async readArtifact(ref: string): Promise<{ manifest: Record<string, unknown>; payload: Buffer }> {
    const id = ref.replace(/^artifact:\/\//, '');
    const manifest = JSON.parse(await readFile(join(this.artifactsDir, `${id}.json`), 'utf8'));
    const payload = await readFile(join(this.artifactsDir, 'blobs', `${id}.bin`));
    if (payload.length !== manifest.sizeBytes) throw new Error('ArtifactManifestCorruptError');
    if (`sha256:${sha256hex(payload)}` !== manifest.sha256) throw new Error('ArtifactHashMismatchError');
    return { manifest: deepFreeze(manifest), payload };
  }
}
