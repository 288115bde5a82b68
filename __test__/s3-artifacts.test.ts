// Artifacts in an S3-compatible object store (`artifacts: { s3 }`), against the server that
// scripts/with-s3.mjs starts (moto): the same contract as artifacts kept by the world, written
// whole or not at all, typed failures, lifecycle, migration, orphans, and the server going away.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import canonicalizeOracle from 'canonicalize';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  ArtifactHashMismatchError,
  ArtifactNotFoundError,
  deleteRun,
  exportRuns,
  importRuns,
  listRuns,
  localWorld,
  moveArtifactsToBucket,
  postgresWorld,
  pruneRuns,
  readArtifact,
  RuntimeIntegrityError,
  verifyWorld,
  WorldIoError,
  writeArtifact,
  type LocalWorldOptions,
  type PostgresWorldOptions,
  type World,
  type WorldError,
  type WriteArtifactInput,
} from '@little-workflow/world';
import { freshSchema, needsPostgres, packageRoot, postgresUrl, rejection, runLittle, tempDir, track } from './helpers';
import { closedPort, createBucket, deleteObject, getObject, listKeys, missingBucket, needsS3, putObject, s3Control, s3Endpoint, s3Proxy, silentServer } from './s3';

type S3Options = { bucket: string; prefix?: string; endpoint?: string; region?: string; forcePathStyle?: boolean };

const DEFAULT_PREFIX = 'little-workflow/';
// The key of an artifact's bytes in the bucket.
const OBJECT_KEY = (prefix: string, a: { artifactId: string; sha256: string }) => `${prefix}${a.artifactId}`;
// How `little` is told where a world keeps its artifacts' bytes.
const LITTLE_S3_ARGS = (s3: S3Options): string[] => ['--s3-bucket', s3.bucket, '--s3-prefix', s3.prefix ?? DEFAULT_PREFIX, '--s3-endpoint', s3.endpoint!, '--s3-region', s3.region!, '--s3-path-style'];
/** Well above the backend's bound on retries: a failing store must settle its promises by then. */
const SETTLES_MS = 120_000;

const sha256hex = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');
const s3At = (bucket: string, extra: Partial<S3Options> = {}): S3Options => ({ bucket, endpoint: s3Endpoint()!, forcePathStyle: true, region: 'us-east-1', ...extra });
const withS3 = (s3?: S3Options) => (s3 ? { artifacts: { s3 } } : {});

/** A world's stores that outlive its handle: `open` opens them, with or without a bucket. */
type Store = { where: string; open: (s3?: S3Options) => World };
function stores(): Array<[string, () => Store]> {
  const kinds: Array<[string, () => Store]> = [
    [
      'localWorld',
      () => {
        const dataDir = tempDir();
        return { where: dataDir, open: (s3) => track(localWorld({ dataDir, ...withS3(s3) } as LocalWorldOptions)) };
      },
    ],
  ];
  if (needsPostgres()) {
    kinds.push([
      'postgresWorld',
      () => {
        const schema = freshSchema();
        return { where: `pg:${schema}`, open: (s3) => track(postgresWorld({ connectionString: postgresUrl()!, schema, ...withS3(s3) } as PostgresWorldOptions)) };
      },
    ]);
  }
  return kinds;
}

const input = (payload: Buffer, extra: { runId?: string; name?: string } = {}): WriteArtifactInput & { payload: Buffer } =>
  ({ runId: 'run_s3', stepPath: 'step/a', name: 'out', contentType: 'application/octet-stream', encoding: 'bytes', payload, ...extra }) as const;

/** The id and hash the world gives the bytes artifact `i` (contract: JCS of the manifest's identity). */
function idOf(i: WriteArtifactInput): { artifactId: string; sha256: string } {
  const payloadHash = `sha256:${sha256hex(i.payload as Buffer)}`;
  const identity = { runId: i.runId, stepPath: i.stepPath, name: i.name, contentType: i.contentType, encoding: i.encoding, payloadHash };
  return { artifactId: `art_${sha256hex(canonicalizeOracle(identity) as string).slice(0, 16)}`, sha256: payloadHash };
}

/** `n` bytes that differ from any other call's. */
function bytes(n: number): Buffer {
  const b = Buffer.alloc(n);
  for (let i = 0; i + 4 <= n; i += 4096) b.writeUInt32LE((i ^ Math.floor(Math.random() * 2 ** 32)) >>> 0, i);
  return b;
}

/** Everything an error says, for checking what it names and never names. */
const told = (e: WorldError) => `${e.message}\n${JSON.stringify(e.details)}\n${e.stack}\n${String((e as { cause?: unknown }).cause)}`;

function expectIoError(e: WorldError, names: string[]): void {
  expect(e, told(e)).toBeInstanceOf(WorldIoError);
  expect(e.code).toBe('WORLD_IO');
  for (const n of names) expect(told(e)).toContain(n);
  const secret = process.env.AWS_SECRET_ACCESS_KEY;
  if (secret) expect(told(e)).not.toContain(secret);
}

describe.runIf(needsS3())('artifacts in an S3 bucket', () => {
  describe.each(stores())('on %s', (_name, makeStore) => {
    it('round-trips small and 5 MiB artifacts through the bucket, under the default prefix or one given', async () => {
      for (const prefix of [undefined, 'team-a/runs/']) {
        const bucket = await createBucket();
        const world = makeStore().open(s3At(bucket, prefix === undefined ? {} : { prefix }));
        const payloads = [Buffer.from('hello, bucket'), bytes(5 * 1024 * 1024)];
        const written: string[] = [];
        for (const p of payloads) {
          const m = await writeArtifact(world, input(p, { name: `out-${p.length}` }));
          expect(m.sha256).toBe(`sha256:${sha256hex(p)}`);
          expect(Buffer.compare((await readArtifact(world, m.artifactRef)).payload as Buffer, p)).toBe(0);
          const stored = await getObject(bucket, OBJECT_KEY(prefix ?? DEFAULT_PREFIX, m));
          expect(stored && Buffer.compare(stored, p), `object of ${m.artifactId}`).toBe(0);
          written.push(OBJECT_KEY(prefix ?? DEFAULT_PREFIX, m));
        }
        expect(await listKeys(bucket)).toEqual(written.sort());
      }
    });

    it('stores an artifact written twice, or by eight writers at once, as one id and one object', async () => {
      const bucket = await createBucket();
      const world = makeStore().open(s3At(bucket));
      const i = input(bytes(300_000));
      const all = await Promise.all(Array.from({ length: 8 }, () => writeArtifact(world, i)));
      for (const m of all) expect(m).toEqual(all[0]);
      expect(await writeArtifact(world, i)).toEqual(all[0]);
      expect(all[0].artifactId).toBe(idOf(i).artifactId);
      expect(await listKeys(bucket)).toEqual([OBJECT_KEY(DEFAULT_PREFIX, all[0])]);
    });

    it('re-hashes every read: a changed object is ArtifactHashMismatchError, a missing one RuntimeIntegrityError; a write repairs both', async () => {
      const bucket = await createBucket();
      const world = makeStore().open(s3At(bucket));
      const i = input(Buffer.from('0123456789abcdef'));
      const m = await writeArtifact(world, i);
      const key = OBJECT_KEY(DEFAULT_PREFIX, m);
      expect((await readArtifact(world, m.artifactRef)).manifest).toEqual(m);

      await putObject(bucket, key, Buffer.from('0123456789ABCDEF'));
      const changed = await rejection(readArtifact(world, m.artifactRef));
      expect(changed).toBeInstanceOf(ArtifactHashMismatchError);
      expect(changed).toBeInstanceOf(RuntimeIntegrityError);
      expect(changed.code).toBe('ARTIFACT_HASH_MISMATCH');
      expect(changed.artifactId).toBe(m.artifactId);
      // An object already there is checked, not trusted: writing the artifact again puts it right.
      expect(await writeArtifact(world, i)).toEqual(m);
      expect((await readArtifact(world, m.artifactRef)).payload).toEqual(i.payload);

      await deleteObject(bucket, key);
      const missing = await rejection(readArtifact(world, m.artifactRef));
      expect(missing).toBeInstanceOf(RuntimeIntegrityError);
      expect(missing).not.toBeInstanceOf(ArtifactHashMismatchError);
      expect(missing.code).toBe('RUNTIME_INTEGRITY');
      expect(missing.artifactId).toBe(m.artifactId);
      expect(await writeArtifact(world, i)).toEqual(m);
      expect(await getObject(bucket, key)).toEqual(i.payload);
    });

    it('keeps manifests in the world: references and listing need no bucket, reading its bytes does', async () => {
      const bucket = await createBucket();
      const store = makeStore();
      const first = store.open(s3At(bucket));
      const m = await writeArtifact(first, input(Buffer.from('kept')));
      await first.close();
      const endpoint = `http://127.0.0.1:${await closedPort()}`;
      const cut = store.open(s3At(bucket, { endpoint }));
      const e = await appendEvent(cut, 'run_s3', { type: 'StepCompleted', payload: { stepPath: 'step/a', outputRef: m.artifactRef } });
      expect(e.sequence).toBe(1);
      expect((await listRuns(cut)).map((r) => r.runId)).toEqual(['run_s3']);
      expectIoError(await rejection(readArtifact(cut, m.artifactRef)), [endpoint.slice('http://'.length), bucket, OBJECT_KEY(DEFAULT_PREFIX, m)]);
      // A bucket that is not there is a failing store (NoSuchBucket), not a missing object (NoSuchKey).
      const wrong = missingBucket();
      expectIoError(await rejection(readArtifact(store.open(s3At(wrong)), m.artifactRef)), [wrong]);
    }, SETTLES_MS);

    it('reads the artifacts a world stored before it had the option, and writes new ones to the bucket', async () => {
      const bucket = await createBucket();
      const store = makeStore();
      const before = store.open();
      const old = await writeArtifact(before, input(Buffer.from('from before the bucket')));
      await before.close();
      const world = store.open(s3At(bucket));
      expect((await readArtifact(world, old.artifactRef)).payload).toEqual(Buffer.from('from before the bucket'));
      const fresh = await writeArtifact(world, input(Buffer.from('into the bucket')));
      expect(await listKeys(bucket)).toEqual([OBJECT_KEY(DEFAULT_PREFIX, fresh)]);
      expect((await verifyWorld(world)).problems).toEqual([]);
      // Moved into the bucket: read from there, and no longer where it was.
      expect(await moveArtifactsToBucket(world)).toEqual({ moved: 1, bytes: old.sizeBytes, left: 0 });
      expect((await listKeys(bucket)).sort()).toEqual([OBJECT_KEY(DEFAULT_PREFIX, old), OBJECT_KEY(DEFAULT_PREFIX, fresh)].sort());
      await world.close();
      const without = store.open();
      expect(await rejection(readArtifact(without, old.artifactRef))).toBeInstanceOf(ArtifactNotFoundError);
      await without.close();
      const again = store.open(s3At(bucket));
      expect((await readArtifact(again, old.artifactRef)).payload).toEqual(Buffer.from('from before the bucket'));
      expect(await moveArtifactsToBucket(again)).toEqual({ moved: 0, bytes: 0, left: 0 });
      expect((await verifyWorld(again)).problems).toEqual([]);
    });

    it('moves older artifacts into the bucket with little move-artifacts, only given --yes', async () => {
      const bucket = await createBucket();
      const store = makeStore();
      if (!store.where.startsWith('/')) return; // the command is the same on PostgreSQL; its API is tested above
      const before = store.open();
      const olds: Awaited<ReturnType<typeof writeArtifact>>[] = [];
      for (let i = 0; i < 3; i++) olds.push(await writeArtifact(before, input(Buffer.from(`old ${i}`))));
      await before.close();
      const args = ['move-artifacts', '--data-dir', store.where, ...LITTLE_S3_ARGS(s3At(bucket))];
      const refused = runLittle(args);
      expect(refused.status, refused.stderr).toBe(2);
      expect(refused.stderr).toMatch(/--yes/);
      expect(await listKeys(bucket)).toEqual([]);
      const moved = runLittle([...args, '--yes']);
      expect(moved.status, moved.stderr).toBe(0);
      expect(JSON.parse(moved.stdout)).toEqual({ moved: 3, bytes: olds.reduce((n, m) => n + m.sizeBytes, 0) });
      expect((await listKeys(bucket)).sort()).toEqual(olds.map((m) => OBJECT_KEY(DEFAULT_PREFIX, m)).sort());
      expect(runLittle(['move-artifacts', '--data-dir', store.where, '--yes']).status).toBe(2); // no bucket named
    });

    it('removes the objects of a deleted run and of a pruned one, and no others', async () => {
      const bucket = await createBucket();
      const world = makeStore().open(s3At(bucket));
      const keyOf: Record<string, string> = {};
      for (const runId of ['run_deleted', 'run_pruned', 'run_kept']) {
        const m = await writeArtifact(world, input(bytes(1000), { runId }));
        keyOf[runId] = OBJECT_KEY(DEFAULT_PREFIX, m);
        await appendEvent(world, runId, { type: 'RunStarted', payload: { out: m.artifactRef } });
        if (runId !== 'run_kept') await appendEvent(world, runId, { type: 'RunCompleted', payload: {} });
      }
      expect(await deleteRun(world, 'run_deleted')).toMatchObject({ deleted: true, artifacts: 1, bytes: 1000 });
      expect(await listKeys(bucket)).toEqual([keyOf.run_kept, keyOf.run_pruned].sort());
      expect(await pruneRuns(world, { endedBefore: new Date(Date.now() + 60_000) })).toMatchObject({ runs: 1, artifacts: 1 });
      expect(await listKeys(bucket)).toEqual([keyOf.run_kept]);
    });

    it('carries the bytes in an export archive, and an import puts them in its own bucket', async () => {
      const [from, to] = [await createBucket(), await createBucket()];
      const source = makeStore().open(s3At(from));
      const m = await writeArtifact(source, input(bytes(100_000), { runId: 'run_moved' }));
      await appendEvent(source, 'run_moved', { type: 'RunStarted', payload: { out: m.artifactRef } });
      const destination = makeStore().open(s3At(to));
      expect(await importRuns(destination, exportRuns(source))).toMatchObject({ runs: 1, artifacts: 1 });
      expect(await listKeys(to)).toEqual([OBJECT_KEY(DEFAULT_PREFIX, m)]);
      expect((await readArtifact(destination, m.artifactRef)).manifest).toEqual(m);
    });

    it('two processes writing one artifact at once end with one intact artifact', async () => {
      const bucket = await createBucket();
      const s3 = s3At(bucket);
      // Two hosts: two local worlds with one bucket, or two processes on one PostgreSQL schema.
      const first = makeStore();
      const second = first.where.startsWith('pg:') ? first : makeStore();
      const outs = await Promise.all([writer(first.where, s3), writer(second.where, s3)]);
      const lines = new Set(outs.flat());
      expect(lines.size).toBe(1);
      const [artifactId, sha] = [...lines][0].split(' ');
      const keys = await listKeys(bucket);
      expect(keys).toEqual([OBJECT_KEY(DEFAULT_PREFIX, { artifactId, sha256: sha })]);
      expect(`sha256:${sha256hex((await getObject(bucket, keys[0]))!)}`).toBe(sha);
      for (const store of new Set([first, second])) expect((await readArtifact(store.open(s3), artifactId)).manifest.sha256).toBe(sha);
    });
  });

  describe('a store that fails', () => {
    const failing: Array<[string, () => Promise<{ s3: S3Options; names: string[]; close?: () => Promise<void> }>]> = [
      ['an endpoint where nothing listens', async () => {
        const port = await closedPort();
        return { s3: s3At('t-unreachable', { endpoint: `http://127.0.0.1:${port}` }), names: [`127.0.0.1:${port}`, 't-unreachable'] };
      }],
      ['a bucket that does not exist', async () => {
        const bucket = missingBucket();
        return { s3: s3At(bucket), names: [new URL(s3Endpoint()!).host, bucket] };
      }],
      ['a server that never answers', async () => {
        const server = await silentServer();
        return { s3: s3At('t-silent', { endpoint: server.endpoint }), names: [new URL(server.endpoint).host, 't-silent'], close: server.close };
      }],
    ];

    it.each(failing)('rejects a write to %s with WorldIoError, naming where and never the secret', async (_name, make) => {
      const { s3, names, close } = await make();
      try {
        const world = track(localWorld({ dataDir: tempDir(), ...withS3(s3) } as LocalWorldOptions));
        const i = input(Buffer.from('nowhere to go'));
        const err = await rejection(writeArtifact(world, i));
        expectIoError(err, [...names, OBJECT_KEY(s3.prefix ?? DEFAULT_PREFIX, idOf(i))]);
        // No manifest without its object; and the world goes on working.
        expect(await rejection(readArtifact(world, idOf(i).artifactId))).toBeInstanceOf(ArtifactNotFoundError);
        expect((await appendEvent(world, 'run_after', { type: 'RunStarted', payload: {} })).sequence).toBe(1);
      } finally {
        await close?.();
      }
    }, SETTLES_MS);
  });

  describe('a slow store', () => {
    it('writes and reads through a link that holds every piece 1.5 s, and a world meanwhile goes on appending', async () => {
      const bucket = await createBucket();
      const proxy = await s3Proxy(() => {}, 1500);
      try {
        const world = track(localWorld({ dataDir: tempDir(), ...withS3(s3At(bucket, { endpoint: proxy.endpoint })) } as LocalWorldOptions));
        const i = input(bytes(2 * 1024 * 1024));
        const started = Date.now();
        const writing = writeArtifact(world, i);
        // Appends do not wait for the bucket.
        expect((await appendEvent(world, 'run_slow', { type: 'RunStarted', payload: {} })).sequence).toBe(1);
        expect(Date.now() - started).toBeLessThan(1500);
        const m = await writing;
        expect(m.artifactId).toBe(idOf(i).artifactId);
        expect(Buffer.from((await readArtifact(world, m.artifactRef)).payload as Uint8Array)).toEqual(i.payload);
        expect(Date.now() - started).toBeGreaterThanOrEqual(3000);
      } finally {
        await proxy.close();
      }
    }, SETTLES_MS);
  });

  describe('orphan objects', () => {
    it('verify and `little verify` report an object without a manifest, and a write of its artifact adopts it', async () => {
      const bucket = await createBucket();
      const s3 = s3At(bucket);
      const dataDir = tempDir();
      const world = track(localWorld({ dataDir, ...withS3(s3) } as LocalWorldOptions));
      await writeArtifact(world, input(Buffer.from('has a manifest')));
      // Left by a crash between the object and the manifest: the right bytes at the right key.
      const i = input(Buffer.from('crashed before its manifest'));
      const orphanKey = OBJECT_KEY(DEFAULT_PREFIX, idOf(i));
      await putObject(bucket, orphanKey, i.payload);

      const report = await verifyWorld(world);
      expect(report.ok).toBe(false);
      const orphans = report.problems.filter((p) => /orphan/.test(p.kind));
      expect(orphans.map((p) => p.artifactId ?? p.message), JSON.stringify(report.problems)).toEqual([expect.stringContaining(idOf(i).artifactId)]);
      const cli = runLittle(['verify', '--data-dir', dataDir, ...LITTLE_S3_ARGS(s3)]);
      expect(cli.status, cli.stderr).toBe(1);
      expect(cli.stderr).toMatch(/orphan/);
      expect(cli.stderr).toContain(idOf(i).artifactId);

      expect((await writeArtifact(world, i)).artifactId).toBe(idOf(i).artifactId);
      expect((await verifyWorld(world)).problems).toEqual([]);
      const clean = runLittle(['verify', '--data-dir', dataDir, ...LITTLE_S3_ARGS(s3)]);
      expect(clean.status, clean.stderr).toBe(0);
    });
  });

  // Last in the file: it kills the server and starts it again, which empties it. Other test files
  // do not use it, and the tests of one file run one after another.
  describe('the server stopped and started again', () => {
    const control = s3Control();
    if (control === undefined && s3Endpoint()) console.warn('SKIPPED: the S3 restart tests need a server that scripts/with-s3.mjs starts; LITTLE_TEST_S3_ENDPOINT names one of its own');
    const MiB = 1024 * 1024;

    /** Run `body` with a world whose bucket is reached through a proxy that calls `kill` on its bytes. */
    async function throughProxy(kill: (up: number, down: number) => boolean, body: (world: World, armed: () => void) => Promise<void>) {
      let armed = false;
      let killing: Promise<void> | undefined;
      const proxy = await s3Proxy((up, down) => {
        if (armed && killing === undefined && kill(up, down)) killing = control!.stop();
      });
      try {
        const world = track(localWorld({ dataDir: tempDir(), ...withS3(s3At(await createBucket(), { endpoint: proxy.endpoint })) } as LocalWorldOptions));
        await body(world, () => (armed = true));
        expect(killing, 'the server was stopped in the middle of the transfer').toBeDefined();
      } finally {
        await proxy.close();
        if (killing) await killing.then(() => control!.start());
      }
      // The restarted server has no bucket: a new one works at once.
      const world = track(localWorld({ dataDir: tempDir(), ...withS3(s3At(await createBucket())) } as LocalWorldOptions));
      const m = await writeArtifact(world, input(bytes(MiB)));
      expect((await readArtifact(world, m.artifactRef)).manifest).toEqual(m);
    }

    it.runIf(control !== undefined)('mid-write: the write rejects with WorldIoError and leaves no manifest', () =>
      throughProxy(
        (up) => up > 4 * MiB,
        async (world, arm) => {
          await writeArtifact(world, input(Buffer.from('before the fault')));
          arm();
          const i = input(bytes(32 * MiB));
          expectIoError(await rejection(writeArtifact(world, i)), []);
          expect(await rejection(readArtifact(world, idOf(i).artifactId))).toBeInstanceOf(ArtifactNotFoundError);
        },
      ), SETTLES_MS);

    it.runIf(control !== undefined)('mid-read: the read rejects with WorldIoError', () =>
      throughProxy(
        (_up, down) => down > 4 * MiB,
        async (world, arm) => {
          const m = await writeArtifact(world, input(bytes(32 * MiB)));
          arm();
          expectIoError(await rejection(readArtifact(world, m.artifactRef)), []);
        },
      ), SETTLES_MS);
  });
});

/**
 * A process writing one artifact four times at once to the world at `where` (a data directory, or
 * pg:<schema>); resolves with its lines, "<artifactId> <sha256 hex>".
 */
function writer(where: string, s3: S3Options): Promise<string[]> {
  const script = `
    const { localWorld, postgresWorld, writeArtifact } = require(${JSON.stringify(join(packageRoot, 'world.js'))});
    const [where, s3] = [process.argv[1], JSON.parse(process.argv[2])];
    const world = where.startsWith('pg:')
      ? postgresWorld({ connectionString: process.env.LITTLE_TEST_DATABASE_URL, schema: where.slice(3), artifacts: { s3 } })
      : localWorld({ dataDir: where, artifacts: { s3 } });
    const payload = Buffer.alloc(2 * 1024 * 1024, 7);
    const input = { runId: 'run_two', stepPath: 's', name: 'shared', contentType: 'application/octet-stream', encoding: 'bytes', payload };
    Promise.all([0, 1, 2, 3].map(() => writeArtifact(world, input))).then(async (ms) => {
      for (const m of ms) process.stdout.write(m.artifactId + ' ' + m.sha256 + '\\n');
      await world.close();
    }, (e) => { process.stderr.write(e.code + ' ' + e.stack + '\\n'); process.exit(1); });`;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['-e', script, where, JSON.stringify(s3)], { cwd: packageRoot });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (code) => (code === 0 ? resolve(out.trim().split('\n')) : reject(new Error(`writer exited ${code}: ${err}`))));
  });
}
