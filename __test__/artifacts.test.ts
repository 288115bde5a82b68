// Content-addressed artifacts, their integrity checks, references from events, and the
// inline-vs-ref rule for large outputs.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import canonicalizeOracle from 'canonicalize';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  ArtifactHashMismatchError,
  ArtifactManifestCorruptError,
  ArtifactNotFoundError,
  EventValidationError,
  listEvents,
  localWorld,
  readArtifact,
  RuntimeIntegrityError,
  writeArtifact,
  type World,
  type WorldError,
} from '@little-workflow/world';
import { packageRoot, tempDir, track, worldKinds, rejection } from './helpers';

const sha256hex = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');


const base = { runId: 'run_art', stepPath: 'step/a', name: 'out', contentType: 'text/plain' };

describe.each(worldKinds)('artifacts on %s', (_name, makeWorld) => {
  it('round-trips each encoding, including empty payloads and non-ASCII text', async () => {
    const world = makeWorld();
    const cases = [
      { encoding: 'json', payload: { b: [1, 2.5, 'é'], a: null } },
      { encoding: 'json', payload: {} },
      { encoding: 'json', payload: 'just a string' },
      { encoding: 'utf8', payload: 'héllo wörld — 😀 \u0000 end' },
      { encoding: 'utf8', payload: '' },
      // Long text crosses in one write when it is ASCII; past 16 Mi units, as N-API measures it.
      { encoding: 'utf8', payload: 'a'.repeat(100_000) },
      { encoding: 'utf8', payload: `${'a'.repeat(100_000)}é` },
      { encoding: 'utf8', payload: `${'b'.repeat(16 * 1024 * 1024)}€` },
      { encoding: 'bytes', payload: Buffer.from([0, 1, 2, 255, 254]) },
      { encoding: 'bytes', payload: new Uint8Array(0) },
      { encoding: 'bytes', payload: new Uint8Array([9, 8, 7]).subarray(1) },
    ] as const;
    for (const c of cases) {
      const manifest = await writeArtifact(world, { ...base, ...c } as never);
      const stored =
        c.encoding === 'json' ? Buffer.from(canonicalizeOracle(c.payload) as string) : c.encoding === 'utf8' ? Buffer.from(c.payload) : Buffer.from(c.payload);
      expect(manifest.sha256).toBe(`sha256:${sha256hex(stored)}`);
      expect(manifest.sizeBytes).toBe(stored.length);
      const id = `art_${sha256hex(canonicalizeOracle({ ...base, encoding: c.encoding, payloadHash: manifest.sha256 }) as string).slice(0, 16)}`;
      expect(manifest.artifactId).toBe(id);
      expect(manifest.artifactRef).toBe(`artifact://${id}`);
      expect(Object.isFrozen(manifest)).toBe(true);
      const read = await readArtifact(world, manifest.artifactRef);
      expect(read.manifest).toEqual(manifest);
      if (c.encoding === 'bytes') {
        expect(Buffer.isBuffer(read.payload)).toBe(true);
        expect(Buffer.compare(read.payload as Buffer, Buffer.from(c.payload))).toBe(0);
      } else {
        expect(read.payload).toEqual(c.payload);
        // A JSON payload is deep-frozen, as every value the world returns.
        if (c.encoding === 'json' && typeof c.payload === 'object') {
          expect(Object.isFrozen(read.payload)).toBe(true);
          if ('b' in c.payload) expect(Object.isFrozen((read.payload as { b: unknown[] }).b)).toBe(true);
        }
      }
      expect((await readArtifact(world, manifest.artifactId)).manifest).toEqual(manifest);
    }
  });

  it('returns the stored manifest when the same artifact is written again, even concurrently', async () => {
    const world = makeWorld();
    const input = { ...base, encoding: 'utf8' as const, payload: 'same' };
    const all = await Promise.all(Array.from({ length: 8 }, () => writeArtifact(world, input)));
    for (const m of all) expect(m).toEqual(all[0]);
    expect(await writeArtifact(world, input)).toEqual(all[0]);
  });

  it('refuses bad input with typed errors', async () => {
    const world = makeWorld();
    const bad: Array<[() => Promise<unknown>, Function, string]> = [
      [() => writeArtifact(world, { ...base, encoding: 'utf8', payload: 3 as never }), EventValidationError, 'input.payload'],
      [() => writeArtifact(world, { ...base, encoding: 'bytes', payload: 'x' as never }), EventValidationError, 'input.payload'],
      [() => writeArtifact(world, { ...base, encoding: 'json', payload: { x: NaN } }), EventValidationError, 'input.payload.x'],
      [() => writeArtifact(world, { ...base, encoding: 'xml' as never, payload: '' }), EventValidationError, 'input.encoding'],
      [() => writeArtifact(world, { ...base, name: '', encoding: 'utf8', payload: '' }), EventValidationError, 'input.name'],
      // A lone surrogate would reach the core as U+FFFD: 'x\ud800' and 'x\udc00' would be one artifact.
      [() => writeArtifact(world, { ...base, name: 'x\ud800', encoding: 'utf8', payload: '' }), EventValidationError, 'input.name'],
      [() => writeArtifact(world, { ...base, stepPath: 's\udc00', encoding: 'utf8', payload: '' }), EventValidationError, 'input.stepPath'],
      [() => readArtifact(world, 'artifact://nope'), EventValidationError, 'ref'],
    ];
    for (const [p, cls, path] of bad) {
      const err = await rejection(p());
      expect(err, path).toBeInstanceOf(cls);
      expect(err.path, path).toBe(path);
    }
    expect(await rejection(readArtifact(world, 'art_0123456789abcdef'))).toBeInstanceOf(ArtifactNotFoundError);
  });

  it('rejects an append that references a missing artifact, writing nothing', async () => {
    const world = makeWorld();
    await appendEvent(world, 'run_refs', { type: 'StepStarted', payload: { stepPath: 'a' } });
    const err = await rejection(
      appendEvent(world, 'run_refs', { type: 'StepCompleted', payload: { stepPath: 'a', outputRef: 'artifact://art_00000000000000ff' } }),
    );
    expect(err).toBeInstanceOf(ArtifactNotFoundError);
    expect(err.code).toBe('ARTIFACT_NOT_FOUND');
    expect(err.artifactId).toBe('art_00000000000000ff');
    const m = await writeArtifact(world, { ...base, runId: 'run_refs', encoding: 'json', payload: { ok: true } });
    const e = await appendEvent(world, 'run_refs', { type: 'StepCompleted', payload: { stepPath: 'a', outputRef: m.artifactRef, seeAlso: [m.artifactRef] } });
    expect(e.sequence).toBe(2);
  });

  it('stores outputs, args and results of 256,000 bytes or more as artifacts, and smaller ones inline', async () => {
    const world = makeWorld();
    // A string of n characters is n + 2 bytes of canonical JSON.
    const ofSize = (bytes: number) => 'a'.repeat(bytes - 2);
    const cases = [
      { type: 'StepCompleted', field: 'output', ref: 'outputRef', extra: { stepPath: 'big' } },
      { type: 'RunCompleted', field: 'output', ref: 'outputRef', extra: {} },
      { type: 'harness.tool_call.started', field: 'args', ref: 'argsRef', extra: { callId: 'c1', caller: 'code', toolName: 't' } },
      { type: 'harness.tool_call.succeeded', field: 'result', ref: 'resultRef', extra: { callId: 'c1', durationMs: 5 } },
    ];
    let k = 0;
    for (const c of cases) {
      for (const size of [255_999, 256_000]) {
        const value = ofSize(size);
        expect(Buffer.byteLength(JSON.stringify(value))).toBe(size);
        const runId = `run_inline_${k++}`;
        const env = await appendEvent(world, runId, {
          type: c.type,
          payload: { ...c.extra, [c.field]: value },
          ...(c.type.startsWith('harness.') ? { appendIdempotencyKey: `key-${size}` } : {}),
        });
        if (size < 256_000) {
          expect(env.payload[c.field]).toBe(value);
          expect(env.payload[c.ref]).toBeUndefined();
        } else {
          expect(env.payload[c.field]).toBeUndefined();
          const ref = env.payload[c.ref] as string;
          expect(ref).toMatch(/^artifact:\/\/art_[0-9a-f]{16}$/);
          const read = await readArtifact(world, ref);
          expect(read.payload).toBe(value);
          expect(read.manifest.encoding).toBe('json');
          expect(read.manifest.runId).toBe(runId);
          expect(read.manifest.sizeBytes).toBe(size);
        }
      }
    }
    // A keyed retry of a large result comes back identical.
    const big = { callId: 'c9', durationMs: 1, result: { rows: ofSize(300_000) } };
    const a = await appendEvent(world, 'run_inline_retry', { type: 'harness.tool_call.succeeded', payload: big, appendIdempotencyKey: 'r' });
    const b = await appendEvent(world, 'run_inline_retry', { type: 'harness.tool_call.succeeded', payload: big, appendIdempotencyKey: 'r' });
    expect(b).toEqual(a);
    expect((await listEvents(world, 'run_inline_retry')).length).toBe(1);
  });

  it('stores no artifact for a large output whose append is refused', async () => {
    const world = makeWorld();
    // The id the world would give the spilled output (contract: JCS of the manifest's identity).
    const wouldBe = (runId: string, stepPath: string, value: unknown) => {
      const payloadHash = `sha256:${sha256hex(canonicalizeOracle(value) as string)}`;
      const identity = { runId, stepPath, name: 'output', contentType: 'application/json', encoding: 'json', payloadHash };
      return `artifact://art_${sha256hex(canonicalizeOracle(identity) as string).slice(0, 16)}`;
    };
    const first = { data: 'y'.repeat(300_000) };
    const env = await appendEvent(world, 'run_spill', { type: 'StepCompleted', appendIdempotencyKey: 'k', payload: { stepPath: 's', output: first } });
    expect(env.payload.outputRef).toBe(wouldBe('run_spill', 's', first));
    expect((await readArtifact(world, env.payload.outputRef as string)).payload).toEqual(first);
    // Same key, other content: an idempotency conflict, which must write nothing at all.
    const other = { data: 'z'.repeat(300_000) };
    const conflict = await rejection(
      appendEvent(world, 'run_spill', { type: 'StepCompleted', appendIdempotencyKey: 'k', payload: { stepPath: 's', output: other } }),
    );
    expect(conflict.code).toBe('EVENT_APPEND_IDEMPOTENCY_CONFLICT');
    expect((await rejection(readArtifact(world, wouldBe('run_spill', 's', other)))).code).toBe('ARTIFACT_NOT_FOUND');
    // After the run's terminal event: refused, and nothing stored either.
    const completed = { durationMs: 5, outputs: {}, totalCostMicrocents: 0, totalTokensUsed: { input: 1, output: 1 } };
    await appendEvent(world, 'run_spill_end', { type: 'run:completed', payload: completed });
    const late = { data: 'w'.repeat(300_000) };
    const refused = await rejection(appendEvent(world, 'run_spill_end', { type: 'StepCompleted', payload: { stepPath: 's', output: late } }));
    expect(refused.code).toBe('EVENT_VALIDATION');
    expect((await rejection(readArtifact(world, wouldBe('run_spill_end', 's', late)))).code).toBe('ARTIFACT_NOT_FOUND');
    expect((await listEvents(world, 'run_spill')).length).toBe(1);
  });

  it('hands each read its own bytes: changing them changes nothing stored', async () => {
    const world = makeWorld();
    for (const size of [11, 3 * 1024 * 1024]) {
      const payload = Buffer.alloc(size, 0x68);
      const m = await writeArtifact(world, { ...base, contentType: 'application/octet-stream', encoding: 'bytes', payload });
      const first = (await readArtifact(world, m.artifactRef)).payload as Buffer;
      first[0] = 0x4a;
      first[size - 1] = 0x4a;
      const second = (await readArtifact(world, m.artifactRef)).payload as Buffer;
      expect(Buffer.compare(second, payload)).toBe(0);
    }
  });

  it('writes, reads and verifies a 64 MiB artifact', async () => {
    const world = makeWorld();
    const payload = Buffer.alloc(64 * 1024 * 1024);
    for (let i = 0; i < payload.length; i += 4096) payload.writeUInt32LE(i, i);
    const manifest = await writeArtifact(world, { ...base, contentType: 'application/octet-stream', encoding: 'bytes', payload });
    expect(manifest.sizeBytes).toBe(payload.length);
    expect(manifest.sha256).toBe(`sha256:${sha256hex(payload)}`);
    const read = await readArtifact(world, manifest.artifactRef);
    expect(Buffer.compare(read.payload as Buffer, payload)).toBe(0);
  });
});

describe('artifact integrity on disk', () => {
  async function stored(world: World) {
    const m = await writeArtifact(world, { ...base, encoding: 'bytes', payload: Buffer.from('0123456789abcdef') });
    const dir = join(world.dataDir!, 'artifacts');
    return { m, blob: join(dir, 'blobs', `${m.artifactId}.bin`), manifest: join(dir, `${m.artifactId}.json`) };
  }

  it('raises a typed error for each kind of tampering', async () => {
    const world = track(localWorld({ dataDir: tempDir() }));
    const { m, blob, manifest } = await stored(world);
    const original = readFileSync(manifest, 'utf8');

    const bytes = readFileSync(blob);
    bytes[5] ^= 0x40;
    writeFileSync(blob, bytes);
    const flipped = await rejection(readArtifact(world, m.artifactRef));
    expect(flipped).toBeInstanceOf(ArtifactHashMismatchError);
    expect(flipped).toBeInstanceOf(RuntimeIntegrityError);
    expect(flipped.code).toBe('ARTIFACT_HASH_MISMATCH');
    bytes[5] ^= 0x40;
    writeFileSync(blob, bytes);
    expect((await readArtifact(world, m.artifactRef)).manifest).toEqual(m);

    writeFileSync(manifest, original.replace('"sizeBytes":16', '"sizeBytes":17'));
    const size = await rejection(readArtifact(world, m.artifactRef));
    expect(size).toBeInstanceOf(ArtifactManifestCorruptError);
    expect(size).toBeInstanceOf(RuntimeIntegrityError);
    expect(size.code).toBe('ARTIFACT_MANIFEST_CORRUPT');

    writeFileSync(manifest, original.slice(0, 40));
    const truncated = await rejection(readArtifact(world, m.artifactRef));
    expect(truncated).toBeInstanceOf(ArtifactManifestCorruptError);

    writeFileSync(manifest, original);
    unlinkSync(blob);
    const deleted = await rejection(readArtifact(world, m.artifactRef));
    expect(deleted).toBeInstanceOf(RuntimeIntegrityError);
    expect(deleted.code).toBe('RUNTIME_INTEGRITY');
    expect(deleted.artifactId).toBe(m.artifactId);
    // The missing file is named: the blob, not the manifest.
    expect(deleted.path).toBe(blob);

    // Writing the artifact again publishes the right bytes over the damage.
    await writeArtifact(world, { ...base, encoding: 'bytes', payload: Buffer.from('0123456789abcdef') });
    expect((await readArtifact(world, m.artifactRef)).manifest.sha256).toBe(m.sha256);
  });

  it('ignores and cleans up temporary files left by a crash', async () => {
    const dataDir = tempDir();
    const first = localWorld({ dataDir });
    const { m } = await stored(first);
    await first.close();
    const leftover = join(dataDir, 'artifacts', 'blobs', 'incoming.2147483646.0-1.tmp');
    const halfManifest = join(dataDir, 'artifacts', `${m.artifactId}.2147483646.1-2.tmp`);
    writeFileSync(leftover, 'half a blob');
    writeFileSync(halfManifest, '{"artifactId":');
    const world = track(localWorld({ dataDir }));
    expect(existsSync(leftover)).toBe(false);
    expect(existsSync(halfManifest)).toBe(false);
    expect((await readArtifact(world, m.artifactRef)).manifest).toEqual(m);
  });
});

function child(args: string[]) {
  const proc = spawn(process.execPath, [join(__dirname, 'fixtures', 'artifact-child.cjs'), ...args], { cwd: packageRoot });
  let stdout = '';
  let stderr = '';
  proc.stdout.on('data', (d) => (stdout += d));
  proc.stderr.on('data', (d) => (stderr += d));
  const done = new Promise<number | null>((resolve) => proc.on('close', (code) => resolve(code)));
  return { proc, done, out: () => stdout, err: () => stderr };
}

describe('artifacts across processes', () => {
  it('two processes writing the same artifact end with one intact artifact', async () => {
    const dataDir = tempDir();
    const [a, b] = [child([dataDir, '50', 'same']), child([dataDir, '50', 'same'])];
    expect(await a.done, a.err()).toBe(0);
    expect(await b.done, b.err()).toBe(0);
    const lines = new Set([...a.out().split('\n'), ...b.out().split('\n')].filter((l) => l.startsWith('art_')));
    expect(lines.size).toBe(1);
    const world = track(localWorld({ dataDir }));
    const [id] = [...lines][0].split(' ');
    await readArtifact(world, id);
    expect(readdirSync(join(dataDir, 'artifacts')).filter((f) => f.endsWith('.json'))).toEqual([`${id}.json`]);
  });

  it('a writer killed with SIGKILL leaves every published artifact readable and no manifest without its blob', async () => {
    const dataDir = tempDir();
    const c = child([dataDir, '1000', 'distinct']);
    // Kill it somewhere in the middle of its writes: once more than 100 (101 to 400) are published.
    const killAfter = 101 + Math.floor(Math.random() * 300);
    await new Promise<void>((resolve) => {
      const check = () => {
        if (c.out().split('\n').length > killAfter) {
          c.proc.kill('SIGKILL');
          resolve();
        } else setTimeout(check, 2);
      };
      check();
    });
    await c.done;
    const published = c.out().split('\n').filter((l) => l.startsWith('art_'));
    expect(published.length).toBeGreaterThan(100);
    expect(published.length).toBeLessThan(1000);
    const world = track(localWorld({ dataDir }));
    for (const line of published) {
      const [id, sha] = line.split(' ');
      expect((await readArtifact(world, id)).manifest.sha256).toBe(sha);
    }
    const manifests = readdirSync(join(dataDir, 'artifacts')).filter((f) => f.endsWith('.json'));
    expect(manifests.length).toBeGreaterThanOrEqual(published.length);
    for (const f of manifests) {
      const id = f.replace(/\.json$/, '');
      expect(existsSync(join(dataDir, 'artifacts', 'blobs', `${id}.bin`)), id).toBe(true);
      await readArtifact(world, id);
    }
    expect(readdirSync(join(dataDir, 'artifacts')).filter((f) => f.endsWith('.tmp'))).toEqual([]);
  });
});

describe('a bytes payload whose memory is taken away while the write is pending', () => {
  const cases = [
    ['transferred away and collected', 'transfer'],
    ['shrunk to nothing', 'shrink'],
  ] as const;
  it.each(cases)('is stored as it was at the call when %s', async (_name, how) => {
    for (const kind of ['local', 'virtual']) {
      for (let i = 0; i < 2; i++) {
        const out = await new Promise<{ code: number | null; signal: string | null; stdout: string; stderr: string }>((resolve) => {
          const child = spawn(process.execPath, ['--expose-gc', join(__dirname, 'fixtures', 'detach-child.cjs'), how, kind, tempDir()], { cwd: packageRoot });
          let stdout = '';
          let stderr = '';
          child.stdout.on('data', (d) => (stdout += d));
          child.stderr.on('data', (d) => (stderr += d));
          child.on('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
        });
        expect(out.signal, out.stderr).toBeNull();
        expect(out.code, out.stderr).toBe(0);
        const result = JSON.parse(out.stdout) as { stored: string; reread: string; expected: string };
        expect(result.stored).toBe(result.expected);
        expect(result.reread).toBe(result.expected);
      }
    }
  });
});
