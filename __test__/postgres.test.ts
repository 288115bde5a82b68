// The PostgreSQL world with many processes on one database, and with the faults a real server
// brings: processes racing one run and one key, lost connections, a server that restarts (and
// one that is down when a Vercel World's queue starts), a server that crashes at `durability:
// 'normal'` and loses commits it had acknowledged, a transaction that commits late, a lock holder
// that dies, large artifacts, versioned schemas, and the `little` command. The contract itself is
// checked by the conformance suite, which runs against this world too (see helpers.ts).
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  acquireRunLock,
  appendEvent,
  EventLogCorruptError,
  canonicalize,
  listEvents,
  listRuns,
  localWorld,
  materializeRunState,
  postgresWorld,
  readArtifact,
  RunLockedError,
  subscribe,
  validateEventLogShape,
  verifyWorld,
  writeArtifact,
  type EventEnvelope,
  type World,
} from '@little-workflow/world';
import { createWorld } from '@little-workflow/world/vercel';
import { freshSchema, needsPostgres, ownCluster, type OwnCluster, packageRoot, postgresUrl, rejection, tempDir, track, withPg } from './helpers';

const url = (): string => postgresUrl()!;
const open = (schema: string, extra: Record<string, unknown> = {}): World => track(postgresWorld({ connectionString: url(), schema, ...extra }));
const step = (i: number | string) => ({ type: 'StepStarted', payload: { stepPath: `s${i}` } });

/** Run a fixture in a child process to its end; resolves with its output lines. */
function runChild(fixture: string, args: string[], env: Record<string, string> = {}): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(__dirname, 'fixtures', fixture), ...args], { cwd: packageRoot, env: { ...process.env, ...env } });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (code) => (code === 0 ? resolve(out.trim().split('\n')) : reject(new Error(`${fixture} exited ${code}: ${err}`))));
  });
}

/** Every sequence 1..n once, and the shape check passes. */
function expectDense(events: readonly EventEnvelope[], n: number): void {
  expect(events.map((e) => e.sequence)).toEqual(Array.from({ length: n }, (_, i) => i + 1));
  validateEventLogShape(events);
}

describe.runIf(needsPostgres())('postgresWorld with many processes and a real server', () => {
  it('two processes appending 200 events each to one run get dense sequences, each used once', async () => {
    const schema = freshSchema();
    const [a, b] = await Promise.all([runChild('append-child.cjs', [`pg:${schema}`, 'run_two', '200', 'a']), runChild('append-child.cjs', [`pg:${schema}`, 'run_two', '200', 'b'])]);
    const seqs = [...a, ...b].filter((l) => l !== 'done').map((l) => Number(l.split(' ')[1]));
    expect(seqs).toHaveLength(400);
    expect(new Set(seqs).size).toBe(400);
    const events = await listEvents(open(schema), 'run_two');
    expectDense(events, 400);
    expect(events.filter((e) => (e.payload as { stepPath: string }).stepPath.startsWith('a-'))).toHaveLength(200);
  });

  it('16 identical keyed appends from two processes store one row, and other content under the key conflicts', async () => {
    const schema = freshSchema();
    const world = open(schema);
    await appendEvent(world, 'run_keyed', step(0));
    const lines = (await Promise.all([runChild('keyed-child.cjs', [`pg:${schema}`, 'run_keyed', '8', 'same']), runChild('keyed-child.cjs', [`pg:${schema}`, 'run_keyed', '8', 'same'])])).flat();
    const oks = lines.filter((l) => l.startsWith('ok '));
    expect(oks).toHaveLength(16);
    expect(new Set(oks).size).toBe(1);
    expect(oks[0].split(' ')[1]).toBe('2');
    const other = await runChild('keyed-child.cjs', [`pg:${schema}`, 'run_keyed', '2', 'other']);
    expect(other.filter((l) => l !== 'done')).toEqual(['err EVENT_APPEND_IDEMPOTENCY_CONFLICT', 'err EVENT_APPEND_IDEMPOTENCY_CONFLICT']);
    const events = await listEvents(world, 'run_keyed');
    expectDense(events, 2);
    expect(events[1].eventId).toBe(oks[0].split(' ')[2]);
  });

  it("loses nothing resolved when the world's connections are terminated mid-append, and works on without reopening", async () => {
    const schema = freshSchema();
    const world = open(schema);
    await appendEvent(world, 'run_term', step('first'));
    const resolved = new Map<string, number>();
    const rejected: string[] = [];
    const appendKeyed = (i: number) =>
      appendEvent(world, 'run_term', { type: 'harness.tool_call.started', appendIdempotencyKey: `k${i}`, payload: { callId: `c${i}`, caller: 'code', toolName: 't', args: { i } } }).then(
        (e) => void resolved.set(`k${i}`, e.sequence),
        (err: { code?: string }) => void rejected.push(`k${i} ${err.code}`),
      );
    // Waves of 50 appends keep the writer in its transactions, and its connection is ended two
    // ways, in turns. In even waves, for certain: the test holds the events table, so the
    // writer's insert waits on that lock inside its transaction until the test ends its
    // connection there. In odd waves, whenever it is in the middle of a transaction (running a
    // statement, or between round trips), which catches some at their COMMIT.
    const session = `little_workflow ${schema}`;
    let settled = false;
    let oddWave = false;
    let oddKill: Promise<unknown> = Promise.resolve();
    let terminated = 0;
    let heldWaves = 0;
    await withPg(async (holder) => {
      const appends = (async () => {
        try {
          for (let wave = 0; wave < 12; wave++) {
            const hold = wave % 2 === 0;
            oddWave = !hold;
            if (hold) {
              await oddKill; // the odd waves' loop has stopped: only the wait below ends this one
              await holder.query('BEGIN');
              await holder.query(`LOCK TABLE "${schema}".events IN EXCLUSIVE MODE`);
            }
            let waveSettled = false;
            const batch = Promise.all(Array.from({ length: 50 }, (_, j) => appendKeyed(wave * 50 + j))).finally(() => (waveSettled = true));
            if (hold) {
              await withPg(async (c) => {
                while (!waveSettled) {
                  const ended = (await c.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", [session])).rowCount ?? 0;
                  terminated += ended;
                  if (ended > 0) {
                    heldWaves++;
                    return;
                  }
                  await new Promise((r) => setTimeout(r, 2));
                }
              });
              await holder.query('COMMIT');
            }
            await batch;
          }
        } finally {
          settled = true;
        }
      })();
      await withPg(async (c) => {
        while (!settled) {
          if (oddWave) {
            const kill = c.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND state IN ('active', 'idle in transaction')", [session]);
            oddKill = kill;
            terminated += (await kill).rowCount ?? 0;
          }
          await new Promise((r) => setTimeout(r, 1));
        }
      });
      await appends;
    });
    expect(heldWaves).toBe(6);
    expect(terminated).toBeGreaterThanOrEqual(6);
    console.log(`terminate test: ${terminated} connections ended mid-transaction (${heldWaves} waiting on the held table), ${rejected.length} of 600 appends rejected`);
    // A lost connection is a typed rejection, never a crash or another kind of error.
    for (const r of rejected) expect(r).toMatch(/ WORLD_IO$/);
    // Retrying what was rejected, with its key, settles each unknown outcome.
    for (const r of rejected) await appendKeyed(Number(r.split(' ')[0].slice(1)));
    expect(resolved.size).toBe(600);
    const events = await listEvents(world, 'run_term');
    expectDense(events, 601);
    const byKey = new Map(events.map((e) => [`k${(e.payload as { args?: { i: number } }).args?.i}`, e.sequence]));
    for (const [key, sequence] of resolved) expect(byKey.get(key), key).toBe(sequence);
    expect((await verifyWorld(world)).problems).toEqual([]);
  }, 60_000);

  it('sees a transaction that commits late, after later ones: a subscriber neither skips nor repeats', async () => {
    const schema = freshSchema();
    const world = open(schema);
    await appendEvent(world, 'run_other', step(0)); // makes the schema
    const late = subscribe(world, 'run_late')[Symbol.asyncIterator]();
    const other = subscribe(world, 'run_other')[Symbol.asyncIterator]();
    expect((await other.next()).value?.sequence).toBe(1);
    const recordedAt = new Date().toISOString();
    const payload = { stepPath: 'late' };
    const eventId = `evt_${createHash('sha256').update(canonicalize({ runId: 'run_late', sequence: 1, type: 'StepStarted', payload })).digest('hex').slice(0, 16)}`;
    const envelope = canonicalize({ eventId, payload, recordedAt, runId: 'run_late', sequence: 1, type: 'StepStarted' });
    await withPg(async (c) => {
      // This transaction takes its id first, and commits only after later ones have.
      await c.query('BEGIN');
      await c.query(`INSERT INTO "${schema}".events (run_id, sequence, event_id, type, recorded_at, envelope) VALUES ('run_late', 1, $1, 'StepStarted', $2, $3)`, [eventId, recordedAt, envelope]);
      await c.query(`INSERT INTO "${schema}".runs (run_id, last_sequence, first_recorded_at, last_recorded_at, status) VALUES ('run_late', 1, $1, $1, 'running')`, [recordedAt]);
      for (let i = 1; i <= 5; i++) await appendEvent(world, 'run_other', step(i));
      const seen: number[] = [];
      for (let i = 0; i < 5; i++) seen.push((await other.next()).value!.sequence);
      expect(seen).toEqual([2, 3, 4, 5, 6]);
      await new Promise((r) => setTimeout(r, 300)); // the world has looked for changes since
      await c.query('COMMIT');
    });
    const got = await Promise.race([late.next(), new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 10_000))]);
    expect(got).not.toBe('timeout');
    expect((got as IteratorResult<EventEnvelope>).value).toEqual(JSON.parse(envelope));
    await appendEvent(world, 'run_late', step('after'));
    await appendEvent(world, 'run_other', step(6));
    expect((await late.next()).value?.sequence).toBe(2);
    expect((await other.next()).value?.sequence).toBe(7);
    await late.return?.(undefined);
    await other.return?.(undefined);
    expect((await verifyWorld(world)).problems).toEqual([]);
  }, 30_000);

  it("takes over a lease from a holder killed with SIGKILL once it expires, with a higher fence, and refuses the dead holder's release", async () => {
    const schema = freshSchema();
    const lease = 1500;
    const world = open(schema, { lockLeaseMs: lease });
    await appendEvent(world, 'run_lease', step(0));
    const child = spawn(process.execPath, [join(__dirname, 'fixtures', 'lock-child.cjs'), `pg:${schema}`, 'run_lease', String(lease)], { cwd: packageRoot });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    while (!out.includes('locked ')) await new Promise((r) => setTimeout(r, 20));
    const deadToken = out.split(' ')[1].trim();
    // A live holder renews its lease: another waiting longer than the lease still gets RUN_LOCKED.
    expect((await rejection(acquireRunLock(world, 'run_lease', { waitMs: lease * 2 }))).code).toBe('RUN_LOCKED');
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    const started = Date.now();
    const lock = await acquireRunLock(world, 'run_lease', { waitMs: lease * 4 });
    expect(Date.now() - started).toBeLessThan(lease * 4);
    const fence = (t: string) => withPg((c) => c.query(`SELECT fence FROM "${schema}".leases WHERE owner = $1`, [t]).then((r) => r.rows[0]?.fence));
    const takenOver = Number(await fence(lock.token));
    expect(takenOver).toBeGreaterThan(1);
    expect(deadToken).not.toBe(lock.token);
    await lock.release();
    // A holder whose lease ran out while another took the lock over is refused its release.
    const first = await acquireRunLock(world, 'run_lease', { waitMs: 0 });
    await withPg((c) => c.query(`UPDATE "${schema}".leases SET expires_at = now() - interval '1 second' WHERE owner = $1`, [first.token]));
    const other = open(schema, { lockLeaseMs: lease });
    const taker = await acquireRunLock(other, 'run_lease', { waitMs: 0 });
    expect(Number(await fence(taker.token))).toBeGreaterThan(takenOver);
    expect((await rejection(first.release())).code).toBe('RUN_LOCKED');
    await taker.release();
    await (await acquireRunLock(world, 'run_lease', { waitMs: 0 })).release();
  }, 30_000);

  it('reads a 64 MiB artifact written by one process back verified in another', async () => {
    const schema = freshSchema();
    const payload = Buffer.alloc(64 * 1024 * 1024);
    for (let i = 0; i < payload.length; i += 4096) payload.writeUInt32LE((i * 2654435761) >>> 0, i);
    const writer = postgresWorld({ connectionString: url(), schema });
    const m = await writeArtifact(writer, { runId: 'run_big', stepPath: 's', name: 'big', contentType: 'application/octet-stream', encoding: 'bytes', payload });
    await writer.close();
    const sha = createHash('sha256').update(payload).digest('hex');
    expect(m.sha256).toBe(`sha256:${sha}`);
    const lines = await runChild('read-artifact-child.cjs', [`pg:${schema}`, m.artifactId]);
    expect(lines).toEqual([`${m.sizeBytes} sha256:${sha}`]);
    // Damaged bytes in the database are an integrity error on read, never returned as the artifact.
    await withPg((c) => c.query(`UPDATE "${schema}".artifact_chunks SET data = set_byte(data, 7, get_byte(data, 7) # 1) WHERE artifact_id = $1 AND idx = 40`, [m.artifactId]));
    expect((await rejection(readArtifact(open(schema), m.artifactId))).code).toBe('ARTIFACT_HASH_MISMATCH');
  }, 120_000);

  it('lists and folds the same bytes as a local world holding the same events, stored as canonical text', async () => {
    const schema = freshSchema();
    const pgw = open(schema);
    const local = track(localWorld({ dataDir: tempDir() }));
    const inputs = [
      { type: 'WorkflowStarted', payload: { workflow: 'w', input: { n: 1e21, s: 'é\u2028', z: -0, big: 12345678901234567890, k: { b: 1, a: [1.5, 'x'] } } } },
      { type: 'StepStarted', payload: { stepPath: 'a' } },
      { type: 'StepCompleted', payload: { stepPath: 'a', output: { text: 'y'.repeat(200_000) } } },
      { type: 'harness.model.responded', appendIdempotencyKey: 'm1', payload: { turn: 1, callId: 'm1', stepPath: 'a', model: { provider: 'openai', modelId: 'gpt-5' }, response: { text: 'ok', usage: { inputTokens: 1200, outputTokens: 300 } } } },
    ];
    const times = (s: string) => s.replace(/"(recordedAt|lastRecordedAt|firstRecordedAt|createdAt)":"[^"]*"/g, '"$1":"T"');
    for (const input of inputs) {
      const [a, b] = [await appendEvent(pgw, 'run_same', input as never), await appendEvent(local, 'run_same', input as never)];
      expect(times(canonicalize(a))).toBe(times(canonicalize(b)));
    }
    const [pa, la] = [await listEvents(pgw, 'run_same'), await listEvents(local, 'run_same')];
    expect(pa.map((e) => times(canonicalize(e)))).toEqual(la.map((e) => times(canonicalize(e))));
    const fold = async (w: World) => {
      const s = times(canonicalize(await materializeRunState(w, 'run_same')));
      return s.replace(/"(startedAt|finishedAt)":"[^"]*"/g, '"$1":"T"');
    };
    expect(await fold(pgw)).toBe(await fold(local));
    // What the table holds is the listed envelope's canonical text, byte for byte.
    const rows = await withPg((c) => c.query(`SELECT envelope, pg_typeof(envelope)::text AS t FROM "${schema}".events WHERE run_id = 'run_same' ORDER BY sequence`));
    expect(rows.rows.map((r) => r.t)).toEqual(['text', 'text', 'text', 'text']);
    expect(rows.rows.map((r) => r.envelope)).toEqual(pa.map((e) => canonicalize(e)));
  });

  it('makes one schema when several processes open a fresh database at once, refuses a newer or foreign one, and never shows the password', async () => {
    const schema = freshSchema();
    const lines = await Promise.all(Array.from({ length: 4 }, (_, i) => runChild('append-child.cjs', [`pg:${schema}`, `run_open${i}`, '3', `p${i}`])));
    expect(lines.every((l) => l.at(-1) === 'done')).toBe(true);
    const version = await withPg((c) => c.query(`SELECT version, application FROM "${schema}".world_schema`));
    expect(version.rows).toEqual([{ version: 5, application: 'little-workflow' }]);

    await withPg((c) => c.query(`UPDATE "${schema}".world_schema SET version = 99`));
    const newer = await rejection(appendEvent(open(schema), 'run_x', step(1)));
    expect(newer.code).toBe('WORLD_PATH');
    expect(newer.message).toMatch(/version 99/);
    expect(newer.message).toMatch(/newer/);

    const foreign = freshSchema();
    await withPg((c) => c.query(`CREATE SCHEMA "${foreign}"; CREATE TABLE "${foreign}".world_schema (id int PRIMARY KEY, version int NOT NULL, application text NOT NULL); INSERT INTO "${foreign}".world_schema VALUES (1, 1, 'something-else')`));
    expect((await rejection(appendEvent(open(foreign), 'run_x', step(1)))).message).toMatch(/something-else/);

    const down = track(postgresWorld({ connectionString: 'postgres://alice:s3cr3t-pw@127.0.0.1:1/appdb?connect_timeout=2', schema: 'little_workflow' }));
    const err = await rejection(appendEvent(down, 'run_x', step(1)));
    expect(err.code).toBe('WORLD_IO');
    expect(err.details).toMatchObject({ host: '127.0.0.1', port: 1, database: 'appdb' });
    expect(`${err.message} ${err.stack} ${JSON.stringify(err)} ${JSON.stringify(err.details)}`).not.toContain('s3cr3t');
    const kv = track(postgresWorld({ connectionString: "host=127.0.0.1 port=1 dbname=appdb user=alice password='s3cr3t-pw' connect_timeout=2" }));
    const err2 = await rejection(listEvents(kv, 'run_x'));
    expect(err2.code).toBe('WORLD_IO');
    expect(`${err2.message} ${err2.stack} ${JSON.stringify(err2.details)}`).not.toContain('s3cr3t');
  }, 60_000);

  it('serves the little command with --database-url and --schema, or LITTLE_DATABASE_URL', async () => {
    const schema = freshSchema();
    const world = open(schema);
    await appendEvent(world, 'run_cli', step(1));
    await appendEvent(world, 'run_cli', step(2));
    const little = (args: string[], env: Record<string, string> = {}) => spawnSync(process.execPath, [join(packageRoot, 'bin', 'little.js'), ...args], { encoding: 'utf8', env: { ...process.env, ...env } });
    const runs = little(['runs', '--database-url', url(), '--schema', schema]);
    expect(runs.status, runs.stderr).toBe(0);
    expect(JSON.parse(runs.stdout)).toMatchObject({ runId: 'run_cli', eventCount: 2, lastSequence: 2 });
    const events = little(['events', 'run_cli', '--schema', schema], { LITTLE_DATABASE_URL: url() });
    expect(events.status, events.stderr).toBe(0);
    expect(events.stdout.trim().split('\n')).toEqual((await listEvents(world, 'run_cli')).map((e) => canonicalize(e)));
    const verify = little(['verify', '--database-url', url(), '--schema', schema]);
    expect(verify.status, verify.stderr).toBe(0);
    const typo = little(['events', 'run_typo', '--database-url', url(), '--schema', schema]);
    expect(typo.status).toBe(1);
    expect(typo.stderr).toContain(`schema ${schema}`);
    const both = little(['runs', '--database-url', url(), '--data-dir', '.']);
    expect(both.status).toBe(2);
    // A read-only look at a schema nobody made says so, and makes nothing.
    const missing = freshSchema();
    const none = little(['runs', '--database-url', url(), '--schema', missing]);
    expect(none.status).toBe(1);
    expect(none.stderr).toContain(missing);
    const made = await withPg((c) => c.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [missing]));
    expect(made.rowCount).toBe(0);
  }, 30_000);
});

/**
 * Run `body` with a server of the test's own, stopped and removed afterwards; skipped, with a line
 * saying so, when the test server is not one that scripts/with-postgres.mjs started.
 */
async function withOwnCluster(test: string, body: (cluster: OwnCluster) => Promise<void>): Promise<void> {
  const cluster = await ownCluster();
  if (cluster === undefined) {
    console.warn(`SKIPPED: the ${test} test needs a server that scripts/with-postgres.mjs starts; LITTLE_TEST_DATABASE_URL names one of its own`);
    return;
  }
  try {
    await body(cluster);
  } finally {
    await cluster.stop();
  }
}

describe.runIf(needsPostgres())('postgresWorld through a server restart', () => {
  it('rejects appends with WORLD_IO while the server is down, succeeds after it is back without reopening, and loses nothing resolved', () =>
    withOwnCluster('restart', async (cluster) => {
      const world = postgresWorld({ connectionString: cluster.url, schema: 'outage' });
      const resolved = new Map<number, number>();
      const codes = new Set<string>();
      let stop = false;
      let i = 0;
      const loop = (async () => {
        while (!stop) {
          const n = i++;
          await appendEvent(world, 'run_outage', { type: 'harness.tool_call.started', appendIdempotencyKey: `k${n}`, payload: { callId: `c${n}`, caller: 'code', toolName: 't', args: { n } } }).then(
            (e) => void resolved.set(n, e.sequence),
            (err: { code?: string }) => void codes.add(err.code ?? String(err)),
          );
          await new Promise((r) => setTimeout(r, 2));
        }
      })();
      while (resolved.size < 50) await new Promise((r) => setTimeout(r, 10));
      await cluster.control.restart('immediate');
      const before = resolved.size;
      await cluster.control.stop();
      await new Promise((r) => setTimeout(r, 300));
      const duringOutage = await rejection(appendEvent(world, 'run_outage', step('down')));
      expect(duringOutage.code).toBe('WORLD_IO');
      await cluster.control.start();
      const deadline = Date.now() + 20_000;
      while (resolved.size < before + 50 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      stop = true;
      await loop;
      expect(resolved.size).toBeGreaterThanOrEqual(before + 50);
      expect([...codes].filter((c) => c !== 'WORLD_IO')).toEqual([]);
      const events = await listEvents(world, 'run_outage');
      validateEventLogShape(events);
      const stored = new Map(events.map((e) => [(e.payload as { args: { n: number } }).args.n, e.sequence]));
      for (const [n, sequence] of resolved) expect(stored.get(n), `append ${n}`).toBe(sequence);
      expect((await verifyWorld(world)).problems).toEqual([]);
      expect((await listRuns(world)).map((r) => r.runId)).toEqual(['run_outage']);
      await world.close();
    }), 120_000);

  it('a Vercel World started while the server is down delivers the pending messages once it is back', () =>
    withOwnCluster('start-while-down', async (cluster) => {
      const store = postgresWorld({ connectionString: cluster.url, schema: 'queue_outage' });
      // A message left pending by a process that stopped before its delivery was due.
      const before = createWorld({ world: store });
      const { messageId } = await before.queue('__wkf_workflow_outage', { runId: 'wrun_outage' }, { delaySeconds: 1 });
      await before.close();
      await cluster.control.stop();
      const after = createWorld({ world: store });
      const delivered: string[] = [];
      after.registerHandler('__wkf_workflow_', async (req) => {
        delivered.push(req.headers.get('x-vqs-message-id')!);
        return Response.json({ ok: true });
      });
      // The first look for pending messages fails; the World keeps looking.
      expect((await rejection(after.start())).code).toBe('WORLD_IO');
      await cluster.control.start();
      const deadline = Date.now() + 20_000;
      while (delivered.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(delivered).toEqual([messageId]);
      await after.close();
      await store.close();
    }), 60_000);
});

/**
 * What the package does when a server at `durability: 'normal'` crashes and loses commits it had
 * acknowledged: the writer goes on densely from what is stored, a subscription that yielded a lost
 * event ends with EventLogCorruptError rather than join the two histories, and the Vercel World
 * folds a run anew, indexes a stream again and enqueues again a message whose enqueueing was lost.
 * Such commits are in the server's WAL buffers until its WAL writer writes them out, within 600 ms
 * by default; here the WAL writer is stopped before the commits that the crash is to lose.
 */
describe.runIf(needsPostgres())("postgresWorld at durability 'normal' through a server crash", () => {
  let cluster: OwnCluster | undefined;
  let schemas = 0;
  const sql = async (q: string): Promise<void> => {
    const c = new pg.Client({ connectionString: cluster!.url });
    await c.connect();
    try {
      await c.query(q);
    } finally {
      await c.end();
    }
  };
  /** A world at 'normal' on the cluster, in a schema of the test's own. */
  const normal = (schema = `crash_${++schemas}`): World => postgresWorld({ connectionString: cluster!.url, schema, durability: 'normal' });
  let walWriter = 0;
  /**
   * Put what is committed so far on disk, and stop the server's WAL writer: what commits from here
   * on stays in the server's memory, for `crash` to lose.
   */
  const hold = async () => {
    await sql('CHECKPOINT');
    const c = new pg.Client({ connectionString: cluster!.url });
    await c.connect();
    try {
      walWriter = (await c.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'")).rows[0].pid;
    } finally {
      await c.end();
    }
    process.kill(walWriter, 'SIGSTOP');
  };
  /** Crash the server (the stopped WAL writer killed, the rest stopped with no checkpoint) and start it again. */
  const crash = async () => {
    process.kill(walWriter, 'SIGKILL');
    await cluster!.control.restart('immediate');
  };

  beforeAll(async () => {
    cluster = await ownCluster();
  }, 60_000);
  afterAll(async () => {
    await cluster?.stop();
  }, 60_000);

  it('loses the last appends that resolved; the writer goes on densely, and a subscription that yielded a lost event ends with EventLogCorruptError', async (t) => {
    if (cluster === undefined) return t.skip();
    const writer = normal('crash_log');
    const reader = normal('crash_log'); // another host's world
    try {
      await appendEvent(writer, 'run_a', step(0));
      await hold();
      const subscription = subscribe(reader, 'run_a');
      const acked: EventEnvelope[] = [];
      for (let i = 1; i <= 20; i++) acked.push(await appendEvent(writer, 'run_a', step(i)));
      const yielded: EventEnvelope[] = [];
      while (yielded.length < 21) yielded.push((await subscription.next()).value as EventEnvelope);
      expect(yielded.map((e) => e.eventId)).toEqual([yielded[0].eventId, ...acked.map((e) => e.eventId)]);
      await crash();
      const stored = await listEvents(writer, 'run_a');
      const lost = acked.filter((e) => stored[e.sequence - 1]?.eventId !== e.eventId);
      expect(lost).toEqual(acked);
      // The lost sequences go to other events: the log stays dense, past where it was.
      const next = [];
      for (let i = 0; i < 25; i++) next.push(await appendEvent(writer, 'run_a', step(`after-${i}`)));
      expect(next[0].sequence).toBe(stored.length + 1);
      expectDense(await listEvents(reader, 'run_a'), stored.length + 25);
      // The subscription had yielded sequence 21 of the history the store lost; it does not go on
      // with sequence 22 of the other.
      const ended = await rejection(subscription.next());
      expect(ended).toBeInstanceOf(EventLogCorruptError);
      expect(ended).toMatchObject({ code: 'EVENT_LOG_CORRUPT', runId: 'run_a', sequence: 21, details: { eventId: acked.at(-1)!.eventId, storedEventId: next[20 - stored.length]?.eventId } });
      expect((await subscription.next()).done).toBe(true);
      // A caller that kept its position finds out the same way.
      const resumed = subscribe(reader, 'run_a', { afterSequence: 21, afterEventId: acked.at(-1)!.eventId });
      expect(await rejection(resumed.next())).toBeInstanceOf(EventLogCorruptError);
      const kept = subscribe(reader, 'run_a', { afterSequence: stored.length, afterEventId: stored.at(-1)!.eventId });
      expect(((await kept.next()).value as EventEnvelope).eventId).toBe(next[0].eventId);
      await kept.return();
    } finally {
      await writer.close();
      await reader.close();
    }
  }, 60_000);

  it('keeps a lock taken just before the crash: no second holder runs beside the first', async (t) => {
    if (cluster === undefined) return t.skip();
    const holder = normal('crash_lock');
    const other = normal('crash_lock'); // another host's world
    try {
      await appendEvent(holder, 'run_l', step(0));
      await hold();
      const lock = await acquireRunLock(holder, 'run_l');
      await crash();
      expect(await rejection(acquireRunLock(other, 'run_l'))).toBeInstanceOf(RunLockedError);
      await lock.release();
      await (await acquireRunLock(other, 'run_l')).release();
    } finally {
      await holder.close();
      await other.close();
    }
  }, 60_000);

  it('a Vercel World folds a run anew from what the store kept, and appends after it', async (t) => {
    if (cluster === undefined) return t.skip();
    const store = normal();
    const world = createWorld({ world: store });
    const bytes = (...b: number[]) => new Uint8Array(b);
    try {
      const created = (await world.events.create(null, { eventType: 'run_created', eventData: { deploymentId: 'd', workflowName: 'wf', input: bytes(1) } } as never)) as { run: { runId: string } };
      const runId = created.run.runId;
      await world.events.create(runId, { eventType: 'run_started' } as never);
      await hold();
      await world.events.create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: bytes(2) } } as never);
      await world.events.create(runId, { eventType: 'step_started', correlationId: 'step_1' } as never);
      await world.events.create(runId, { eventType: 'step_completed', correlationId: 'step_1', eventData: { result: bytes(3) } } as never);
      await crash();
      const stored = await listEvents(store, `run_${runId}`);
      expect(stored).toHaveLength(2);
      // What the World says of the run is what the store holds, not what it had acknowledged.
      const listed = (await world.events.list({ runId, pagination: { limit: 100 } } as never)).data as { eventType: string }[];
      expect(listed.map((e) => e.eventType)).toEqual(['run_created', 'run_started']);
      await expect(world.steps.get(runId, 'step_1')).rejects.toThrow();
      // And its next transition is decided on that, and appended after it (not retried for ever).
      const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error('the transition did not end')), 10_000).unref());
      await Promise.race([world.events.create(runId, { eventType: 'wait_created', correlationId: 'wait_1', eventData: { resumeAt: new Date() } } as never), timeout]);
      expect((await listEvents(store, `run_${runId}`)).map((e) => e.type).at(-1)).toBe('workflow.wait_created');
      expect((await listEvents(store, `run_${runId}`)).length).toBe(3);
    } finally {
      await world.close();
      await store.close();
    }
  }, 60_000);

  it("a Vercel World lists a stream whose index entry the store lost, once it is written to again", async (t) => {
    if (cluster === undefined) return t.skip();
    const store = normal();
    const world = createWorld({ world: store });
    const runId = 'wrun_01JSTREAMCRASH000000000000';
    try {
      await appendEvent(store, `run_${runId}`, step(0)); // a stream's owner is a run that exists
      await world.streams.write(runId, 'other', 'x');
      await hold();
      await world.streams.write(runId, 'out', 'first'); // writes the stream's index entry
      await crash();
      expect(await world.streams.list(runId)).toEqual(['other']);
      await world.streams.write(runId, 'out', 'second');
      await world.streams.write(runId, 'out', 'third');
      expect((await world.streams.list(runId)).sort()).toEqual(['other', 'out']);
    } finally {
      await world.close();
      await store.close();
    }
  }, 60_000);

  it('a Vercel World enqueues again a message whose enqueueing the store lost, and delivers it', async (t) => {
    if (cluster === undefined) return t.skip();
    const store = normal();
    const world = createWorld({ world: store });
    const delivered: string[] = [];
    world.registerHandler('__wkf_workflow_', async (req) => {
      delivered.push(req.headers.get('x-vqs-message-id')!);
      return Response.json({ ok: true });
    });
    try {
      await appendEvent(store, 'run_wrun_lost', step(0)); // the message's run, its owner
      await hold();
      const { messageId } = await world.queue('__wkf_workflow_lost' as never, { runId: 'wrun_lost' } as never, { delaySeconds: 1 });
      await crash();
      expect(await listEvents(store, `run_wq_${messageId}`)).toEqual([]);
      const log = async () => (await listEvents(store, `run_wq_${messageId}`)).map((e) => e.type);
      const deadline = Date.now() + 10_000;
      while ((await log()).length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(delivered).toEqual([messageId]);
      expect(await log()).toEqual(['workflow.queue.enqueued', 'workflow.queue.delivered']);
    } finally {
      await world.close();
      await store.close();
    }
  }, 60_000);
});
