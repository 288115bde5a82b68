// The Jest cases, run by each test file against the package as that file loaded it (`require` or
// `import` of @little-workflow/world). Jest runs a test file in a `vm` context of its own and loads
// the package's JavaScript there, but the native addon in Node's main context: what the package
// hands back must be of the test's realm all the same.
const { mkdirSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');
const vm = require('node:vm');

/** Temporary directories made by `tempDir`, removed after each file. */
const dirs = [];
afterAll(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function tempDir() {
  const d = mkdtempSync(join(tmpdir(), 'little-jest-'));
  dirs.push(d);
  return d;
}

/** What `p` rejects with; a test failure if it resolves. */
async function rejection(p) {
  try {
    await p;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection, got a value');
}

/** What `f` throws; a test failure if it returns. */
function thrown(f) {
  try {
    f();
  } catch (err) {
    return err;
  }
  throw new Error('expected a throw, got a value');
}

/** A value made in a context of its own, as code run by `vm` or a jsdom window makes one. */
const foreign = (code) => vm.runInNewContext(code);

/** That the test file runs in a context of its own, which is what makes these cases matter. */
function checkRunsInItsOwnContext() {
  it("runs in a context that is not Node's main one", () => {
    expect(vm.runInThisContext('Error')).not.toBe(Error);
    expect(vm.runInThisContext('Object')).not.toBe(Object);
  });
}

/** That the test file runs where `scripts/jest.mjs` says: in its own process (workers) or in Jest's (in band). */
function checkProcess() {
  const mode = process.env.LITTLE_JEST_MODE;
  const script = Number(process.env.LITTLE_JEST_SCRIPT_PID);
  if (mode === undefined) return;
  it(`runs ${mode === 'workers' ? "in a worker process of Jest's" : "in Jest's own process"}`, () => {
    // In band, Jest's process is the one the script started; a worker's parent is Jest's process.
    if (mode === 'workers') expect(process.ppid).not.toBe(script);
    else expect(process.ppid).toBe(script);
  });
}

/** An error the package threw: of `Class`, of `WorldError` and of this realm's `Error`, with `code`. */
function expectError(lib, err, Class, code) {
  expect(err).toBeInstanceOf(Class);
  expect(err).toBeInstanceOf(lib.WorldError);
  expect(err).toBeInstanceOf(Error);
  expect(err instanceof Error).toBe(true);
  expect(err.code).toBe(code);
  expect(err.name).toBe(Class.name);
  expect(typeof err.message).toBe('string');
  expect(Object.getPrototypeOf(err.details)).toBe(Object.prototype);
}

/** An error the core raised: as `expectError`, and keeping the core's own error as its cause. */
function expectCoreError(lib, err, Class, code) {
  expectError(lib, err, Class, code);
  expect(err.cause).toBeDefined();
  expect(err.cause.code).toBe(code);
  expect(err.cause.message).toBe(err.message);
}

const step = (stepPath) => ({ type: 'StepStarted', payload: { stepPath } });

/** The errors, each provoked for real through the package's API. */
function errors(lib) {
  checkRunsInItsOwnContext();
  checkProcess();

  describe('every error class', () => {
    it('WorldPathError: a malformed run id, refused by the core', async () => {
      const world = lib.virtualWorld();
      await expect(lib.appendEvent(world, 'bad id', step('a'))).rejects.toBeInstanceOf(lib.WorldPathError);
      await expect(lib.appendEvent(world, 'bad id', step('a'))).rejects.toBeInstanceOf(Error);
      expectCoreError(lib, await rejection(lib.listEvents(world, 'bad id')), lib.WorldPathError, 'WORLD_PATH');
      // Thrown, not rejected: a data directory that is a file.
      const file = join(tempDir(), 'file');
      writeFileSync(file, 'not a world');
      expectCoreError(lib, thrown(() => lib.localWorld({ dataDir: file })), lib.WorldPathError, 'WORLD_PATH');
      await world.close();
    });

    it('WorldClosedError: a call on a closed world', async () => {
      const world = lib.virtualWorld();
      await world.close();
      expectError(lib, await rejection(lib.listEvents(world, 'run_a')), lib.WorldClosedError, 'WORLD_CLOSED');
      expectError(lib, await rejection(lib.appendEvent(world, 'run_a', step('a'))), lib.WorldClosedError, 'WORLD_CLOSED');
    });

    it('EventValidationError: a known type without its required field, refused by the core', async () => {
      const world = lib.virtualWorld();
      const err = await rejection(lib.appendEvent(world, 'run_a', { type: 'StepStarted', payload: {} }));
      expectCoreError(lib, err, lib.EventValidationError, 'EVENT_VALIDATION');
      expect(err.path).toBe('payload.stepPath');
      expect(err.runId).toBe('run_a');
      // And one the package refuses before the core sees it.
      expectError(lib, await rejection(lib.appendEvent(world, 'run_a', { type: 'T', payload: { n: NaN } })), lib.EventValidationError, 'EVENT_VALIDATION');
      await world.close();
    });

    it('EventAppendIdempotencyConflictError: a key reused for other content', async () => {
      const world = lib.virtualWorld();
      await lib.appendEvent(world, 'run_a', { ...step('a'), appendIdempotencyKey: 'k1' });
      const err = await rejection(lib.appendEvent(world, 'run_a', { ...step('b'), appendIdempotencyKey: 'k1' }));
      expectCoreError(lib, err, lib.EventAppendIdempotencyConflictError, 'EVENT_APPEND_IDEMPOTENCY_CONFLICT');
      await world.close();
    });

    it('EventSequenceConflictError: an append expecting another last sequence', async () => {
      const world = lib.virtualWorld();
      await lib.appendEvent(world, 'run_a', step('a'));
      const err = await rejection(lib.appendEvent(world, 'run_a', { ...step('b'), expectedSequence: 0 }));
      expectCoreError(lib, err, lib.EventSequenceConflictError, 'EVENT_SEQUENCE_CONFLICT');
      await world.close();
    });

    it("IndexEntryConflictError: an index entry another run holds", async () => {
      const world = lib.virtualWorld();
      const index = (value) => [{ index: 'hook.token', key: 'tok', value }];
      await lib.appendEvent(world, 'run_owner', { ...step('a'), index: index('h1') });
      const err = await rejection(lib.appendEvent(world, 'run_other', { ...step('b'), index: index('h2') }));
      expectCoreError(lib, err, lib.IndexEntryConflictError, 'INDEX_ENTRY_CONFLICT');
      expect(err.details).toMatchObject({ holderRunId: 'run_owner' });
      await world.close();
    });

    it('ArtifactNotFoundError: a reference to no artifact', async () => {
      const world = lib.virtualWorld();
      const err = await rejection(lib.readArtifact(world, 'artifact://art_0123456789abcdef'));
      expectCoreError(lib, err, lib.ArtifactNotFoundError, 'ARTIFACT_NOT_FOUND');
      await world.close();
    });

    describe('on a damaged artifact', () => {
      /** A local world holding one `bytes` artifact, and the paths of its blob and manifest. */
      async function stored() {
        const world = lib.localWorld({ dataDir: tempDir() });
        const m = await lib.writeArtifact(world, { runId: 'run_art', stepPath: 's', name: 'out', contentType: 'text/plain', encoding: 'bytes', payload: Buffer.from('0123456789abcdef') });
        const dir = join(world.dataDir, 'artifacts');
        return { world, m, blob: join(dir, 'blobs', `${m.artifactId}.bin`), manifest: join(dir, `${m.artifactId}.json`) };
      }

      it('ArtifactHashMismatchError: a blob with a bit flipped', async () => {
        const { world, m, blob } = await stored();
        const bytes = readFileSync(blob);
        bytes[5] ^= 0x40;
        writeFileSync(blob, bytes);
        const err = await rejection(lib.readArtifact(world, m.artifactRef));
        expectCoreError(lib, err, lib.ArtifactHashMismatchError, 'ARTIFACT_HASH_MISMATCH');
        expect(err).toBeInstanceOf(lib.RuntimeIntegrityError);
        await world.close();
      });

      it('ArtifactManifestCorruptError: a manifest that disagrees with its blob', async () => {
        const { world, m, manifest } = await stored();
        writeFileSync(manifest, readFileSync(manifest, 'utf8').replace('"sizeBytes":16', '"sizeBytes":17'));
        const err = await rejection(lib.readArtifact(world, m.artifactRef));
        expectCoreError(lib, err, lib.ArtifactManifestCorruptError, 'ARTIFACT_MANIFEST_CORRUPT');
        expect(err).toBeInstanceOf(lib.RuntimeIntegrityError);
        await world.close();
      });

      it('RuntimeIntegrityError: a manifest whose blob is gone', async () => {
        const { world, m, blob } = await stored();
        unlinkSync(blob);
        const err = await rejection(lib.readArtifact(world, m.artifactRef));
        expectCoreError(lib, err, lib.RuntimeIntegrityError, 'RUNTIME_INTEGRITY');
        expect(err.artifactId).toBe(m.artifactId);
        await world.close();
      });
    });

    it('EventLogCorruptError: a log whose event id does not match its content', async () => {
      const world = lib.virtualWorld();
      const e = await lib.appendEvent(world, 'run_a', step('a'));
      const err = thrown(() => lib.validateEventLogShape([{ ...e, payload: { stepPath: 'changed' } }]));
      expectCoreError(lib, err, lib.EventLogCorruptError, 'EVENT_LOG_CORRUPT');
      expect(err).toBeInstanceOf(lib.RuntimeIntegrityError);
      await world.close();
    });

    it('RunLockedError: a lock a live owner holds', async () => {
      const world = lib.virtualWorld();
      const lock = await lib.acquireRunLock(world, 'run_l');
      expectCoreError(lib, await rejection(lib.acquireRunLock(world, 'run_l')), lib.RunLockedError, 'RUN_LOCKED');
      await lock.release();
      await world.close();
    });

    it('OuterLoopInputMismatchError: a manifest written with another inputHash', async () => {
      const world = lib.localWorld({ dataDir: tempDir() });
      await lib.writeOuterLoopManifest(world, { outerLoopId: 'ol_1', inputHash: 'sha256:abc' });
      const err = await rejection(lib.writeOuterLoopManifest(world, { outerLoopId: 'ol_1', inputHash: 'sha256:other' }));
      expectCoreError(lib, err, lib.OuterLoopInputMismatchError, 'OUTER_LOOP_INPUT_MISMATCH');
      await world.close();
    });

    it("ReplayRefusedError: a replay of a run holding events of the log's own types", async () => {
      const world = lib.virtualWorld();
      await lib.appendEvent(world, 'run_mixed', { type: 'RunStarted', payload: {} });
      await lib.appendRunEvent(world, 'run_mixed', { type: 'node:started', nodeId: 'n1', nodeType: 'agent' });
      const err = await rejection(lib.loadRunEventLogForReplay(world, 'run_mixed'));
      expectCoreError(lib, err, lib.ReplayRefusedError, 'REPLAY_REFUSED');
      expect(err.details.sequences).toEqual([1]);
      await world.close();
    });

    // Windows cannot remove a directory whose database is open.
    (process.platform === 'win32' ? it.skip : it)('WorldIoError: a data directory removed and made again under an open world', async () => {
      const dataDir = tempDir();
      const world = lib.localWorld({ dataDir });
      await lib.appendEvent(world, 'run_a', step('a'));
      rmSync(dataDir, { recursive: true, force: true });
      mkdirSync(dataDir);
      const err = await rejection(lib.listEvents(world, 'run_a'));
      expectCoreError(lib, err, lib.WorldIoError, 'WORLD_IO');
      await world.close();
    });
  });
}

/** Objects and arrays of this realm: its `Object.prototype` or `Array.prototype` all the way down. */
function expectOfThisRealm(value) {
  if (value === null || typeof value !== 'object') return;
  if (Array.isArray(value)) expect(Object.getPrototypeOf(value)).toBe(Array.prototype);
  else expect(Object.getPrototypeOf(value)).toBe(Object.prototype);
  for (const v of Object.values(value)) expectOfThisRealm(v);
}

/** What the package returns, and values of another realm it is given. */
function values(lib) {
  checkRunsInItsOwnContext();
  checkProcess();

  describe('values the package returns', () => {
    it('appends and listings: envelopes, payloads and arrays of this realm', async () => {
      const world = lib.virtualWorld();
      const first = await lib.appendEvent(world, 'run_a', { type: 'RunStarted', payload: { input: { list: [1, 'two'], nested: { ok: true } } } });
      const second = await lib.appendEvent(world, 'run_a', { ...step('s1'), appendIdempotencyKey: 'k' });
      expectOfThisRealm(first);
      const listed = await lib.listEvents(world, 'run_a');
      expect(listed).toBeInstanceOf(Array);
      expect(listed).toEqual([first, second]);
      expect(listed.map((e) => e.sequence)).toEqual([1, 2]);
      expect(listed[0].payload).toBeInstanceOf(Object);
      expect(listed[0].payload.input.list).toBeInstanceOf(Array);
      expectOfThisRealm(listed);
      expect(Object.isFrozen(listed[1])).toBe(true);
      expect(await lib.listEvents(world, 'run_a', { afterSequence: 1 })).toEqual([second]);
      const runs = await lib.listRuns(world);
      expect(runs).toBeInstanceOf(Array);
      expectOfThisRealm(runs);
      expect((await lib.verifyWorld(world)).ok).toBe(true);
      await world.close();
    });

    it('artifacts: manifests of this realm, and bytes any realm reads as a Uint8Array', async () => {
      const world = lib.localWorld({ dataDir: tempDir() });
      const base = { runId: 'run_art', stepPath: 's', name: 'out', contentType: 'application/octet-stream' };
      const json = await lib.writeArtifact(world, { ...base, name: 'json', contentType: 'application/json', encoding: 'json', payload: { a: [1, { b: 2 }] } });
      expectOfThisRealm(json);
      const readJson = await lib.readArtifact(world, json.artifactRef);
      expect(readJson.payload).toEqual({ a: [1, { b: 2 }] });
      expectOfThisRealm(readJson);
      const text = await lib.writeArtifact(world, { ...base, name: 'text', contentType: 'text/plain', encoding: 'utf8', payload: 'héllo' });
      expect((await lib.readArtifact(world, text.artifactRef)).payload).toBe('héllo');
      // Bytes as a Buffer, a Uint8Array of this realm, and one of another context: all the same artifact.
      const fromBuffer = await lib.writeArtifact(world, { ...base, encoding: 'bytes', payload: Buffer.from([1, 2, 3]) });
      const fromArray = await lib.writeArtifact(world, { ...base, encoding: 'bytes', payload: new Uint8Array([1, 2, 3]) });
      const fromElsewhere = await lib.writeArtifact(world, { ...base, encoding: 'bytes', payload: foreign('new Uint8Array([1, 2, 3])') });
      expect(fromArray).toEqual(fromBuffer);
      expect(fromElsewhere).toEqual(fromBuffer);
      const { payload } = await lib.readArtifact(world, fromBuffer.artifactRef);
      expect(Buffer.isBuffer(payload)).toBe(true);
      expect(payload).toBeInstanceOf(Uint8Array);
      expect(ArrayBuffer.isView(payload)).toBe(true);
      expect([...payload]).toEqual([1, 2, 3]);
      expect(payload.toString('hex')).toBe('010203');
      await world.close();
    });

    it('materialize: a run state of this realm, from the world and from events', async () => {
      const world = lib.virtualWorld();
      await lib.appendEvent(world, 'run_m', { type: 'RunStarted', payload: {} });
      await lib.appendEvent(world, 'run_m', step('s1'));
      await lib.appendEvent(world, 'run_m', { type: 'StepCompleted', payload: { stepPath: 's1', output: { n: 1 } } });
      await lib.appendEvent(world, 'run_m', { type: 'RunCompleted', payload: { output: { done: [true] } } });
      const state = await lib.materializeRunState(world, 'run_m');
      expect(state).toMatchObject({ runId: 'run_m', status: 'completed', output: { done: [true] } });
      expectOfThisRealm(state);
      const folded = lib.materializeRunStateFromEvents('run_m', await lib.listEvents(world, 'run_m'));
      expect(folded).toEqual(state);
      expectOfThisRealm(folded);
      await world.close();
    });

    it('locks: acquired, refused while held, released, and acquired again', async () => {
      const world = lib.virtualWorld();
      const lock = await lib.acquireRunLock(world, 'run_l');
      expect(lock).toBeInstanceOf(Object);
      expect(typeof lock.token).toBe('string');
      await expect(lib.acquireRunLock(world, 'run_l')).rejects.toBeInstanceOf(lib.RunLockedError);
      await lock.release();
      await lock.release();
      const again = await lib.acquireOuterLoopLock(world, 'run_l');
      await again.release();
      const relocked = await lib.acquireRunLock(world, 'run_l');
      await relocked.release();
      await world.close();
    });

    it('subscribe: the events there are, then each new one, until the world closes', async () => {
      const world = lib.virtualWorld();
      await lib.appendEvent(world, 'run_s', step('a'));
      await lib.appendEvent(world, 'run_s', step('b'));
      const sub = lib.subscribe(world, 'run_s');
      const seen = [];
      for (let i = 0; i < 2; i++) seen.push((await sub.next()).value);
      const pending = sub.next();
      await lib.appendEvent(world, 'run_s', step('c'));
      seen.push((await pending).value);
      expect(seen.map((e) => e.payload.stepPath)).toEqual(['a', 'b', 'c']);
      expectOfThisRealm(seen);
      const waiting = sub.next();
      await world.close();
      expect(await waiting).toEqual({ done: true, value: undefined });
      // On a world already closed, the first pull is refused.
      expectError(lib, await rejection(lib.subscribe(world, 'run_s').next()), lib.WorldClosedError, 'WORLD_CLOSED');
    });

    it('export and import: an archive of this realm\'s bytes carries runs between worlds, and a damaged one is refused', async () => {
      const from = lib.virtualWorld();
      await lib.appendEvent(from, 'run_x', step('a'));
      await lib.appendEvent(from, 'run_x', step('b'));
      const pieces = [];
      for await (const piece of lib.exportRuns(from)) pieces.push(piece);
      expect(pieces.every((p) => ArrayBuffer.isView(p))).toBe(true);
      // Pieces made in this realm are taken as the package's own are.
      const text = pieces.map((p) => Buffer.from(p).toString('utf8')).join('');
      const to = lib.virtualWorld();
      expect(await lib.importRuns(to, [new TextEncoder().encode(text)])).toEqual({ runs: 1, events: 2, artifacts: 0, unchanged: 0 });
      expect((await lib.listEvents(to, 'run_x')).map((e) => e.eventId)).toEqual((await lib.listEvents(from, 'run_x')).map((e) => e.eventId));
      const damaged = text.replace('"stepPath":"b"', '"stepPath":"c"');
      expectError(lib, await rejection(lib.importRuns(lib.virtualWorld(), [new TextEncoder().encode(damaged)])), lib.EventLogCorruptError, 'EVENT_LOG_CORRUPT');
      await from.close();
      await to.close();
    });

    it("takes values of another context as it takes this realm's", async () => {
      const world = lib.virtualWorld();
      // A boxed number is stored as the number; a Date as its JSON, an ISO string.
      const stored = await lib.appendEvent(world, 'run_v', { type: 'T', payload: { n: foreign('new Number(5)'), at: foreign('new Date(0)') } });
      expect(stored.payload).toEqual({ n: 5, at: '1970-01-01T00:00:00.000Z' });
      // A Map JSON would store as `{}` is refused, whatever its realm.
      const err = await rejection(lib.appendEvent(world, 'run_v', { type: 'T', payload: { m: foreign('new Map([[1, 2]])') } }));
      expectError(lib, err, lib.EventValidationError, 'EVENT_VALIDATION');
      expect(err.message).toContain('a Map cannot be stored in JSON');
      await world.close();
    });
  });
}

module.exports = { errors, values };
