// Export and import: runs carried between worlds of every kind as an archive, byte for byte, and
// a damaged, cut-short or conflicting archive refused with nothing of its run committed.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  appendRunEvent,
  appendSessionEvent,
  ArtifactHashMismatchError,
  canonicalize,
  EventLogCorruptError,
  EventSequenceConflictError,
  EventValidationError,
  exportRuns,
  importRuns,
  IndexEntryConflictError,
  listEvents,
  localWorld,
  lookupIndexEntry,
  postgresWorld,
  queryRuns,
  readArtifact,
  verifyWorld,
  virtualWorld,
  WorldPathError,
  writeArtifact,
  type RunEventDraft,
  type World,
} from '../world';
import { durableKinds, freshSchema, killedChild, needsPostgres, postgresUrl, rejection, runLittle, tempDir, track, worldKinds } from './helpers';

const UUID = '0f8fad5b-d9cb-469f-a165-70867728950e';

/** A world's archive, whole. */
async function archiveOf(world: World, opts?: Parameters<typeof exportRuns>[1]): Promise<string> {
  const pieces: Buffer[] = [];
  for await (const piece of exportRuns(world, opts)) pieces.push(Buffer.from(piece));
  return Buffer.concat(pieces).toString('utf8');
}

const bytes = (text: string) => [Buffer.from(text)];

/** Every run's events, as `little events` prints them. */
async function eventLines(world: World): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const r of (await queryRuns(world, { order: 'id', limit: 10_000 })).runs) {
    out[r.runId] = (await listEvents(world, r.runId)).map((e) => canonicalize(e)).join('\n');
  }
  return out;
}

/** Runs of every vocabulary, with an artifact, an index entry and keyed appends. */
async function someRuns(world: World): Promise<string> {
  const art = await writeArtifact(world, { runId: 'run_a', stepPath: 'step', name: 'out', contentType: 'text/plain', encoding: 'utf8', payload: 'hello, world' });
  await appendEvent(world, 'run_a', { type: 'RunStarted', payload: { input: { n: 1.5, s: 'é\n\u2028' } }, index: [{ index: 'by-name', key: 'a', value: 'run a' }] });
  await appendEvent(world, 'run_a', { type: 'StepStarted', payload: { stepPath: 'step' } });
  await appendEvent(world, 'run_a', { type: 'StepCompleted', payload: { stepPath: 'step', outputRef: art.artifactRef }, appendIdempotencyKey: 'done-step' });
  await appendEvent(world, 'run_a', { type: 'RunCompleted', payload: {} });
  await appendEvent(world, 'run_b', { type: 'note', payload: { refersTo: art.artifactRef } });
  await appendRunEvent(world, 'run_graph', { type: 'run:started', workflowId: UUID, inputs: {}, executionMode: 'local' });
  await appendRunEvent(world, 'run_graph', { type: 'human_gate:paused', nodeId: 'a', gateId: 'g', gateType: 'approval', message: 'ok?' } as unknown as RunEventDraft);
  await appendSessionEvent(world, 'ses_chat', { type: 'session:turn_started' });
  return art.artifactRef;
}

/** The archive with its line `n` (1-based) replaced by what `edit` makes of it. */
function editLine(text: string, n: number, edit: (line: string) => string): string {
  const lines = text.split('\n');
  lines[n - 1] = edit(lines[n - 1]!);
  return lines.join('\n');
}

/** The 1-based number of the first line that `test` accepts. */
function lineOf(text: string, test: (line: string) => boolean): number {
  return text.split('\n').findIndex(test) + 1;
}

const kinds = worldKinds.filter(([name]) => name !== 'localWorld (durability normal)');

describe.each(kinds)('export and import from %s', (_name, makeWorld) => {
  it.each(kinds)('carries every run byte for byte into %s', async (_to, makeDestination) => {
    const source = makeWorld();
    const ref = await someRuns(source);
    const archive = await archiveOf(source);
    const destination = makeDestination();
    expect(await importRuns(destination, bytes(archive))).toEqual({ runs: 4, events: 8, artifacts: 1, unchanged: 0 });
    expect(await eventLines(destination)).toEqual(await eventLines(source));
    const rows = async (w: World) => (await queryRuns(w, { order: 'id' })).runs.map(({ costUsd: _, ...r }) => r);
    expect(await rows(destination)).toEqual(await rows(source));
    expect((await readArtifact(destination, ref)).manifest).toEqual((await readArtifact(source, ref)).manifest);
    expect((await readArtifact(destination, ref)).payload).toBe('hello, world');
    expect(await lookupIndexEntry(destination, 'by-name', 'a')).toEqual(await lookupIndexEntry(source, 'by-name', 'a'));
    expect((await verifyWorld(destination)).ok).toBe(true);
    // The rules came along with the events: a key stays taken, a paused run's gate stays open.
    const again = await appendEvent(destination, 'run_a', { type: 'StepCompleted', payload: { stepPath: 'step', outputRef: ref }, appendIdempotencyKey: 'done-step' });
    expect(again.sequence).toBe(3);
    // An archive of the destination is the source's, but for the time it was written.
    const exportedAt = /"exportedAt":"[^"]*"/;
    expect((await archiveOf(destination)).replace(exportedAt, '')).toBe(archive.replace(exportedAt, ''));
  });

  it('changes nothing when the same archive is imported again, and completes a run it holds the start of', async () => {
    const source = makeWorld();
    await someRuns(source);
    const first = await archiveOf(source);
    const destination = virtualWorld();
    await importRuns(destination, bytes(first));
    expect(await importRuns(destination, bytes(first))).toEqual({ runs: 0, events: 0, artifacts: 0, unchanged: 4 });
    await appendEvent(source, 'run_b', { type: 'note', payload: { n: 2 } });
    await appendEvent(source, 'run_b', { type: 'note', payload: { n: 3 } });
    expect(await importRuns(destination, bytes(await archiveOf(source)))).toEqual({ runs: 1, events: 2, artifacts: 0, unchanged: 3 });
    expect(await eventLines(destination)).toEqual(await eventLines(source));
    // An archive that holds less of a run than the world does changes nothing either.
    expect(await importRuns(destination, bytes(first))).toMatchObject({ runs: 0, events: 0, unchanged: 4 });
  });

  it('refuses a run whose events differ, keeps it as it is, and keeps the runs imported before it', async () => {
    const source = makeWorld();
    await appendEvent(source, 'run_1', { type: 'note', payload: { n: 1 } });
    await appendEvent(source, 'run_2', { type: 'note', payload: { n: 1 } });
    await appendEvent(source, 'run_2', { type: 'note', payload: { n: 2 } });
    const destination = makeWorld();
    await appendEvent(destination, 'run_2', { type: 'note', payload: { n: 1 } });
    await appendEvent(destination, 'run_2', { type: 'note', payload: { other: true } });
    const held = await eventLines(destination);
    const e = await rejection(importRuns(destination, bytes(await archiveOf(source))));
    expect(e).toBeInstanceOf(EventSequenceConflictError);
    expect(e).toMatchObject({ code: 'EVENT_SEQUENCE_CONFLICT', runId: 'run_2' });
    expect(e.message).toContain('run_2');
    expect((await eventLines(destination)).run_2).toBe(held.run_2);
    expect((await listEvents(destination, 'run_1')).length).toBe(1);
  });

  it('refuses a run that would take an index entry another run of the world holds', async () => {
    const source = makeWorld();
    await someRuns(source);
    const destination = makeWorld();
    await appendEvent(destination, 'run_other', { type: 'note', payload: {}, index: [{ index: 'by-name', key: 'a', value: 'mine' }] });
    expect(await rejection(importRuns(destination, bytes(await archiveOf(source, { runIds: ['run_a'] }))))).toBeInstanceOf(IndexEntryConflictError);
    expect(await listEvents(destination, 'run_a')).toEqual([]);
    expect((await lookupIndexEntry(destination, 'by-name', 'a'))?.runId).toBe('run_other');
    expect((await verifyWorld(destination)).ok).toBe(true);
  });

  it('exports the runs asked for: by id, by status, or ended before a time', async () => {
    const world = makeWorld();
    await someRuns(world);
    const runsIn = (text: string) => [...text.matchAll(/"kind":"run","lastSequence":\d+,"runId":"([^"]+)"/g)].map((m) => m[1]);
    expect(runsIn(await archiveOf(world))).toEqual(['run_a', 'run_b', 'run_graph', 'ses_chat']);
    expect(runsIn(await archiveOf(world, { runIds: ['ses_chat', 'run_a'] }))).toEqual(['ses_chat', 'run_a']);
    expect(runsIn(await archiveOf(world, { status: ['paused', 'pending'] }))).toEqual(['run_b', 'run_graph']);
    expect(runsIn(await archiveOf(world, { endedBefore: new Date(Date.now() + 60_000) }))).toEqual(['run_a']);
    expect(runsIn(await archiveOf(world, { endedBefore: '2000-01-01T00:00:00Z' }))).toEqual([]);
    // An artifact a run refers to comes with it, though another run made it.
    expect(await archiveOf(world, { runIds: ['run_b'] })).toContain('"kind":"artifact"');
    expect(() => exportRuns(world, { runIds: ['run_a'], status: ['completed'] })).toThrow(EventValidationError);
    expect(() => exportRuns(world, { endedBefore: 'yesterday' })).toThrow(EventValidationError);
    expect(() => exportRuns(world, { status: ['running'], endedBefore: new Date() })).toThrow(EventValidationError);
    expect(() => exportRuns(world, { runIds: ['not a run'] })).toThrow(WorldPathError);
    expect(await rejection(archiveOf(world, { runIds: ['run_missing'] }))).toBeInstanceOf(EventValidationError);
  });
});

describe('a damaged archive', () => {
  async function sourceArchive(): Promise<{ archive: string; ref: string }> {
    const source = track(virtualWorld());
    await appendEvent(source, 'run_first', { type: 'note', payload: { n: 1 } });
    const ref = await someRuns(source);
    return { archive: await archiveOf(source, { runIds: ['run_first', 'run_a', 'run_b'] }), ref };
  }

  /** Import `text` into a fresh world: the error, and the world. */
  async function refused(text: string): Promise<{ e: Awaited<ReturnType<typeof rejection>>; world: World }> {
    const world = track(localWorld({ dataDir: tempDir() }));
    const e = await rejection(importRuns(world, bytes(text)));
    return { e, world };
  }

  /** Nothing of run_a in `world`, run_first whole, and the world verifies. */
  async function nothingOfRunA(world: World): Promise<void> {
    expect(await listEvents(world, 'run_a')).toEqual([]);
    expect((await listEvents(world, 'run_first')).length).toBe(1);
    expect(await lookupIndexEntry(world, 'by-name', 'a')).toBeUndefined();
    expect((await verifyWorld(world)).ok).toBe(true);
  }

  it('is refused at a changed payload, naming the run and the line', async () => {
    const { archive } = await sourceArchive();
    const at = lineOf(archive, (l) => l.includes('"n":1.5'));
    const { e, world } = await refused(editLine(archive, at, (l) => l.replace('"n":1.5', '"n":2.5')));
    expect(e).toBeInstanceOf(EventLogCorruptError);
    expect(e).toMatchObject({ runId: 'run_a', sequence: 1 });
    expect(e.message).toContain(`line ${at} of the archive`);
    await nothingOfRunA(world);
  });

  it('is refused at a changed event id, digest or sequence, or a time that is not one', async () => {
    const { archive } = await sourceArchive();
    const keyed = lineOf(archive, (l) => l.includes('"appendIdempotencyKey":"done-step"'));
    const edits: Array<[number, (l: string) => string]> = [
      [keyed, (l) => l.replace(/"eventId":"evt_[0-9a-f]/, '"eventId":"evt_z')],
      [keyed, (l) => l.replace(/"canonicalRequestDigest":"sha256:[0-9a-f]/, '"canonicalRequestDigest":"sha256:z')],
      [keyed, (l) => l.replace(/"recordedAt":"\d{4}/, '"recordedAt":"yesterday, ')],
      [keyed, (l) => l.replace('"sequence":3', '"sequence":4')],
    ];
    for (const [n, edit] of edits) {
      const changed = editLine(archive, n, edit);
      expect(changed).not.toBe(archive);
      const { e, world } = await refused(changed);
      expect(e).toBeInstanceOf(EventLogCorruptError);
      expect(e).toMatchObject({ runId: 'run_a' });
      await nothingOfRunA(world);
    }
  });

  it('is refused where an event is missing from its run', async () => {
    const { archive } = await sourceArchive();
    const lines = archive.split('\n');
    const second = lineOf(archive, (l) => l.includes('"type":"StepStarted"')) - 1;
    lines.splice(second, 1);
    const fixed = lines
      .join('\n')
      .replace('"lastSequence":4,"runId":"run_a"', '"lastSequence":3,"runId":"run_a"')
      .replace('"events":4,"indexEntries":1,"kind":"end","runId":"run_a"', '"events":3,"indexEntries":1,"kind":"end","runId":"run_a"');
    const { e, world } = await refused(fixed);
    expect(e).toBeInstanceOf(EventLogCorruptError);
    expect(e).toMatchObject({ runId: 'run_a' });
    await nothingOfRunA(world);
  });

  it('is refused at an artifact whose bytes were changed, leaving no artifact behind', async () => {
    const { archive, ref } = await sourceArchive();
    const at = lineOf(archive, (l) => l.includes('"kind":"artifact"'));
    const changed = editLine(archive, at, (l) => l.replace(`"bytes":"${Buffer.from('hello, world').toString('base64')}"`, `"bytes":"${Buffer.from('hello, World').toString('base64')}"`));
    expect(changed).not.toBe(archive);
    const { e, world } = await refused(changed);
    expect(e).toBeInstanceOf(ArtifactHashMismatchError);
    await nothingOfRunA(world);
    expect(await rejection(readArtifact(world, ref))).toMatchObject({ code: 'ARTIFACT_NOT_FOUND' });
  });

  it('is refused when cut short anywhere, keeping the runs that ended before the cut', async () => {
    const { archive } = await sourceArchive();
    const whole = Buffer.from(archive);
    const firstEnds = archive.indexOf('"kind":"end","runId":"run_first"}\n') + '"kind":"end","runId":"run_first"}\n'.length;
    for (const cut of [5, 80, firstEnds - 3, firstEnds, firstEnds + 40, Math.floor(whole.length / 2), whole.length - 2]) {
      const { e, world } = await refused(whole.subarray(0, cut).toString('latin1'));
      expect(e, `cut at ${cut}`).toBeInstanceOf(EventLogCorruptError);
      expect(e.message).toMatch(/line \d+ of the archive/);
      expect(await listEvents(world, 'run_a')).toEqual([]);
      expect((await listEvents(world, 'run_first')).length, `cut at ${cut}`).toBe(cut >= firstEnds ? 1 : 0);
      expect((await verifyWorld(world)).ok).toBe(true);
    }
  });

  it('is refused when it is not an archive, or one of another version', async () => {
    const { archive } = await sourceArchive();
    expect((await refused('{"hello":"world"}\n')).e).toBeInstanceOf(EventLogCorruptError);
    expect((await refused(archive.replace('"version":1', '"version":2'))).e.message).toContain('version 2');
    expect((await refused(`${archive}{"kind":"run","lastSequence":1,"runId":"run_more"}\n`)).e.message).toContain('follows the archive-end line');
    const world = track(virtualWorld());
    expect(await rejection(importRuns(world, 'not an iterable of bytes' as unknown as Iterable<Uint8Array>))).toBeInstanceOf(EventValidationError);
    expect(await rejection(importRuns(world, ['text' as unknown as Uint8Array]))).toBeInstanceOf(EventValidationError);
  });
});

describe('import into a world opened read-only', () => {
  it('is refused with WorldPathError', async () => {
    const dir = tempDir();
    const writer = localWorld({ dataDir: dir });
    await appendEvent(writer, 'run_x', { type: 'note', payload: {} });
    const archive = await archiveOf(writer);
    await writer.close();
    const reader = track(localWorld({ dataDir: dir, readOnly: true }));
    expect(await archiveOf(reader)).toContain('"runId":"run_x"');
    expect(await rejection(importRuns(reader, bytes(archive)))).toBeInstanceOf(WorldPathError);
  });
});

describe('an import killed at any moment', () => {
  it.each(durableKinds())('leaves each run whole or absent, verify ok, and finishes when run again (%s)', async (_kind, target) => {
    const source = track(virtualWorld());
    const RUNS = 300;
    await Promise.all(
      Array.from({ length: RUNS }, async (_, i) => {
        const runId = `run_${String(i).padStart(4, '0')}`;
        const art = i % 10 === 0 ? await writeArtifact(source, { runId, stepPath: 's', name: 'b', contentType: 'application/octet-stream', encoding: 'bytes', payload: new Uint8Array(20_000).fill(i) }) : undefined;
        for (let n = 0; n < 5; n++) await appendEvent(source, runId, { type: 'note', payload: { n, text: 'x'.repeat(400), ...(art && n === 4 ? { ref: art.artifactRef } : {}) } });
      }),
    );
    const file = join(tempDir(), 'runs.jsonl');
    writeFileSync(file, await archiveOf(source));
    const { where, open } = target();
    for (const afterMs of [0, 40, 150]) {
      await killedChild('import-child.cjs', [where, file], 'importing', afterMs);
      const world = open();
      const counts = new Set((await queryRuns(world, { order: 'id', limit: 10_000 })).runs.map((r) => r.eventCount));
      expect([...counts].every((c) => c === 5), `after ${afterMs} ms: run lengths ${[...counts]}`).toBe(true);
      expect((await verifyWorld(world)).ok, `after ${afterMs} ms`).toBe(true);
      await world.close();
    }
    const world = track(open());
    const rest = await importRuns(world, [readFileSync(file)]);
    expect(rest.runs + rest.unchanged).toBe(RUNS);
    expect(await eventLines(world)).toEqual(await eventLines(source));
    expect((await verifyWorld(world)).ok).toBe(true);
  });
});

const little = runLittle;

describe('little export and little import', () => {
  it('round-trips a world through a file and through a pipe, and imports only with --yes', async () => {
    const from = tempDir();
    const source = localWorld({ dataDir: from });
    await someRuns(source);
    const before = await eventLines(source);
    await source.close();
    const file = join(tempDir(), 'runs.jsonl');
    const exported = little(['export', '--data-dir', from, '--out', file]);
    expect(exported.status, exported.stderr).toBe(0);
    expect(JSON.parse(exported.stdout)).toEqual({ export: file, runs: 4, bytes: readFileSync(file).length });
    const to = tempDir();
    const refused = little(['import', file, '--data-dir', to]);
    expect(refused.status).toBe(2);
    expect(refused.stderr).toContain('--yes');
    expect(existsSync(join(to, 'events'))).toBe(false);
    const imported = little(['import', file, '--data-dir', to, '--yes']);
    expect(imported.status, imported.stderr).toBe(0);
    expect(JSON.parse(imported.stdout)).toEqual({ runs: 4, events: 8, artifacts: 1, unchanged: 0 });
    for (const runId of Object.keys(before)) {
      expect(little(['events', runId, '--data-dir', to]).stdout).toBe(little(['events', runId, '--data-dir', from]).stdout);
    }
    expect(little(['verify', '--data-dir', to]).status).toBe(0);
    // Through standard output and standard input, one run.
    const piped = little(['export', 'run_a', '--data-dir', from]);
    expect(piped.status).toBe(0);
    const third = tempDir();
    const fromStdin = little(['import', '--data-dir', third, '--yes'], piped.raw);
    expect(fromStdin.status, fromStdin.stderr).toBe(0);
    expect(JSON.parse(fromStdin.stdout)).toMatchObject({ runs: 1, events: 4 });
    // A damaged archive: exit 1, the error names the run and the line.
    writeFileSync(file, readFileSync(file, 'utf8').replace('"n":1.5', '"n":9'));
    const damaged = little(['import', file, '--data-dir', tempDir(), '--yes']);
    expect(damaged.status).toBe(1);
    expect(damaged.stderr).toMatch(/run_a.*line \d+ of the archive.*\[EVENT_LOG_CORRUPT\]/);
    expect(little(['import', join(tempDir(), 'missing.jsonl'), '--data-dir', tempDir(), '--yes']).status).toBe(2);
    expect(little(['export', 'run_a', '--status', 'completed', '--data-dir', from]).status).toBe(2);
  });
});

describe('a round trip local → PostgreSQL → local', () => {
  const url = needsPostgres() ? postgresUrl() : undefined;
  it.runIf(url !== undefined)('keeps every envelope, entry and artifact, as little events and little verify see them', async () => {
    const from = tempDir();
    const source = localWorld({ dataDir: from });
    const ref = await someRuns(source);
    const schema = freshSchema();
    const pgWorld = track(postgresWorld({ connectionString: url!, schema }));
    expect(await importRuns(pgWorld, exportRuns(source))).toMatchObject({ runs: 4, events: 8, artifacts: 1 });
    const to = tempDir();
    const back = localWorld({ dataDir: to });
    expect(await importRuns(back, exportRuns(pgWorld))).toMatchObject({ runs: 4, events: 8, artifacts: 1 });
    expect((await readArtifact(back, ref)).manifest).toEqual((await readArtifact(source, ref)).manifest);
    await source.close();
    await back.close();
    for (const runId of ['run_a', 'run_b', 'run_graph', 'ses_chat']) {
      const local = little(['events', runId, '--data-dir', from]).stdout;
      expect(local.length).toBeGreaterThan(0);
      expect(little(['events', runId, '--database-url', url!, '--schema', schema]).stdout).toBe(local);
      expect(little(['events', runId, '--data-dir', to]).stdout).toBe(local);
    }
    expect(little(['verify', '--database-url', url!, '--schema', schema]).status).toBe(0);
    expect(little(['verify', '--data-dir', to]).status).toBe(0);
  });
});
