// The `little` command, run as a user runs it: spawned, its output parsed.
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { appendEvent, appendSessionEvent, canonicalize, listEvents, localWorld, writeArtifact } from '@little-workflow/world';
import { downgradeToSchema2, packageRoot, schemaVersion, tempDir } from './helpers';

function little(...args: string[]) {
  const r = spawnSync(process.execPath, [join(packageRoot, 'bin', 'little.js'), ...args], { cwd: packageRoot, encoding: 'utf8' });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

async function seededWorld() {
  const dataDir = tempDir();
  const world = localWorld({ dataDir });
  const art = await writeArtifact(world, { runId: 'run_cli', stepPath: 's', name: 'o', contentType: 'text/plain', encoding: 'utf8', payload: 'hello' });
  await appendEvent(world, 'run_cli', { type: 'RunStarted', payload: { input: { '10': 'x', '9': 'y' } } });
  await appendEvent(world, 'run_cli', { type: 'StepStarted', payload: { stepPath: 's' } });
  await appendEvent(world, 'run_cli', {
    type: 'harness.model.responded',
    appendIdempotencyKey: 'k1',
    payload: { turn: 1, callId: 'c', stepPath: 's', model: { provider: 'openai', modelId: 'gpt-5' }, response: { usage: { inputTokens: 1000, outputTokens: 100 } } },
  });
  await appendEvent(world, 'run_cli', { type: 'StepCompleted', payload: { stepPath: 's', outputRef: art.artifactRef } });
  await appendEvent(world, 'run_other', { type: 'RunStarted', payload: {} });
  const events = await listEvents(world, 'run_cli');
  await world.close();
  return { dataDir, art, events };
}

describe('little', () => {
  it('events prints one canonical envelope per line', async () => {
    const { dataDir, events } = await seededWorld();
    const r = little('events', 'run_cli', '--data-dir', dataDir);
    expect(r.code).toBe(0);
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines).toEqual(events.map((e) => canonicalize(e)));
    // Canonical, so integer-like keys sort as strings: "10" before "9".
    expect(lines[0]).toContain('{"10":"x","9":"y"}');
    expect(lines.map((l) => JSON.parse(l))).toEqual(events);
  });

  it('replay prints the materialized state', async () => {
    const { dataDir } = await seededWorld();
    const r = little('replay', 'run_cli', '--data-dir', dataDir);
    expect(r.code).toBe(0);
    const state = JSON.parse(r.stdout);
    expect(state.status).toBe('running');
    expect(state.eventCount).toBe(4);
    expect(state.steps.s.status).toBe('completed');
    expect(state.usage.costUsd).toBe(0.00225);
  });

  it('replay of a session prints its event count and the status the world lists it with', async () => {
    const dataDir = tempDir();
    const world = localWorld({ dataDir });
    await appendSessionEvent(world, 'ses_open', { type: 'session:turn_started' });
    await appendSessionEvent(world, 'ses_done', { type: 'session:turn_started' });
    await appendSessionEvent(world, 'ses_done', { type: 'session:cancelled' });
    await world.close();
    for (const [sessionId, eventCount, status] of [['ses_open', 1, 'open'], ['ses_done', 2, 'cancelled']] as const) {
      const r = little('replay', sessionId, '--data-dir', dataDir);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toEqual({ sessionId, vocabulary: 'session-events', eventCount, status });
    }
  });

  it('runs prints each run as a JSON line', async () => {
    const { dataDir } = await seededWorld();
    const r = little('runs', '--data-dir', dataDir);
    expect(r.code).toBe(0);
    const runs = r.stdout.trimEnd().split('\n').map((l) => JSON.parse(l));
    expect(runs.map((x) => [x.runId, x.eventCount, x.status])).toEqual([
      ['run_cli', 4, 'running'],
      ['run_other', 1, 'running'],
    ]);
  });

  it('runs takes --status, --limit, --order, --before and --after, and pages through every run', async () => {
    const dataDir = tempDir();
    const world = localWorld({ dataDir });
    // 2,500 runs: more than two pages of 1,000. Every 1,000th is completed, run_1001 failed.
    const ids = Array.from({ length: 2500 }, (_, i) => `run_${String(i).padStart(4, '0')}`);
    await Promise.all(ids.map((id) => appendEvent(world, id, { type: 'RunStarted', payload: {} })));
    // A few milliseconds apart, so that each has a time of its own.
    const later = () => new Promise((r) => setTimeout(r, 3));
    for (const id of ['run_2000', 'run_0000', 'run_1000']) {
      await later();
      await appendEvent(world, id, { type: 'RunCompleted', payload: {} });
    }
    await later();
    await appendEvent(world, 'run_1001', { type: 'RunFailed', payload: { error: { message: 'no' } } });
    await world.close();
    const lines = (...args: string[]) => {
      const r = little('runs', '--data-dir', dataDir, ...args);
      expect(r.code, r.stderr).toBe(0);
      return r.stdout.trimEnd().split('\n').map((l) => JSON.parse(l) as { runId: string; status: string; lastRecordedAt: string });
    };
    // Without flags: every run once, by id, as before.
    expect(lines().map((r) => r.runId)).toEqual(ids);
    const one = lines('--status', 'completed', '--limit', '1');
    expect(one.map((r) => [r.runId, r.status])).toEqual([['run_0000', 'completed']]);
    expect(Object.keys(one[0]!).sort()).toEqual(['costUsd', 'eventCount', 'firstRecordedAt', 'lastRecordedAt', 'lastSequence', 'runId', 'status']);
    expect(lines('--status', 'completed,failed').map((r) => r.runId)).toEqual(['run_0000', 'run_1000', 'run_1001', 'run_2000']);
    // Newest first: the last appended first.
    expect(lines('--status', 'completed,failed', '--order', 'newest', '--limit', '2').map((r) => r.runId)).toEqual(['run_1001', 'run_1000']);
    expect(lines('--limit', '1500')).toHaveLength(1500);
    const cut = lines('--status', 'completed', '--order', 'oldest')[1]!.lastRecordedAt;
    expect(lines('--status', 'completed', '--before', cut).map((r) => r.runId)).toEqual(['run_2000']);
    expect(lines('--status', 'completed', '--after', cut).map((r) => r.runId)).toEqual(['run_0000', 'run_1000']);

    const help = little('runs', '--help');
    for (const flag of ['--status', '--limit', '--order', '--before', '--after']) expect(help.stdout).toContain(flag);
    for (const args of [['--limit', '0'], ['--limit', 'ten'], ['--order', 'sideways'], ['--status', ','], ['--before', 'yesterday'], ['--after', '2026-13-45T00:00:00Z']]) {
      const r = little('runs', '--data-dir', dataDir, ...args);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.stderr, args.join(' ')).toMatch(new RegExp(`^little: (invalid )?${args[0]}`));
      expect(r.stdout).toBe('');
    }
  });

  it('verify is clean on an intact world and exits 0', async () => {
    const { dataDir } = await seededWorld();
    for (const args of [['verify'], ['verify', 'run_cli']]) {
      const r = little(...args, '--data-dir', dataDir);
      expect(r.code, r.stderr).toBe(0);
      const report = JSON.parse(r.stdout);
      expect(report.ok).toBe(true);
      expect(report.problems).toEqual([]);
    }
  });

  it('verify finds a hole, an eventId that does not match its row, a non-canonical payload and a bad artifact', async () => {
    const { dataDir, art } = await seededWorld();
    const db = new Database(join(dataDir, 'events', 'events.db'));
    db.prepare("DELETE FROM events WHERE run_id = 'run_cli' AND sequence = 2").run();
    const row = db.prepare("SELECT envelope FROM events WHERE run_id = 'run_cli' AND sequence = 3").get() as { envelope: string };
    db.prepare("UPDATE events SET event_id = 'evt_0000000000000000', envelope = ? WHERE run_id = 'run_cli' AND sequence = 3").run(
      row.envelope.replace(/"eventId":"evt_[0-9a-f]{16}"/, '"eventId":"evt_0000000000000000"'),
    );
    const first = db.prepare("SELECT envelope FROM events WHERE run_id = 'run_cli' AND sequence = 1").get() as { envelope: string };
    db.prepare("UPDATE events SET envelope = ? WHERE run_id = 'run_cli' AND sequence = 1").run(first.envelope.replace('{"input":', '{ "input": '));
    db.close();
    const blob = join(dataDir, 'artifacts', 'blobs', `${art.artifactId}.bin`);
    writeFileSync(blob, Buffer.from('HELLO'));

    const r = little('verify', '--data-dir', dataDir);
    expect(r.code).toBe(1);
    const report = JSON.parse(r.stdout);
    expect(report.ok).toBe(false);
    const kinds = report.problems.map((p: { kind: string; runId?: string; sequence?: number }) => `${p.kind}@${p.runId ?? ''}:${p.sequence ?? ''}`);
    expect(kinds).toContain('hole@run_cli:2');
    expect(kinds).toContain('event-id@run_cli:3');
    expect(kinds).toContain('not-canonical@run_cli:1');
    expect(report.problems.find((p: { kind: string }) => p.kind === 'artifact-hash').artifactId).toBe(art.artifactId);
    expect(r.stderr).toContain('hole');

    // A size that disagrees with the manifest is named too.
    writeFileSync(blob, Buffer.from('hello'));
    const manifest = join(dataDir, 'artifacts', `${art.artifactId}.json`);
    writeFileSync(manifest, readFileSync(manifest, 'utf8').replace('"sizeBytes":5', '"sizeBytes":6'));
    const r2 = little('verify', 'run_cli', '--data-dir', dataDir);
    expect(r2.code).toBe(1);
    expect(JSON.parse(r2.stdout).problems.map((p: { kind: string }) => p.kind)).toContain('artifact-manifest');
  });

  it('verify reports what SQLite finds wrong with the database, fast and --thorough', async () => {
    const { dataDir } = await seededWorld();
    const file = join(dataDir, 'events', 'events.db');
    const db = new Database(file, { readonly: true });
    const page = (db.prepare("SELECT pageno FROM dbstat WHERE name = 'sqlite_autoindex_events_1'").get() as { pageno: number }).pageno;
    const pageSize = db.pragma('page_size', { simple: true }) as number;
    db.close();
    // The index entry of (run_other, 1) made to name a run that has no rows.
    const bytes = readFileSync(file);
    const at = bytes.indexOf('run_other', (page - 1) * pageSize);
    expect(at).toBeGreaterThan(0);
    bytes[at + 4] ^= 0x01;
    writeFileSync(file, bytes);
    for (const args of [['verify'], ['verify', '--thorough'], ['verify', 'run_cli', '--thorough']]) {
      const r = little(...args, '--data-dir', dataDir);
      expect(r.code, args.join(' ')).toBe(1);
      const report = JSON.parse(r.stdout);
      expect(report.problems.some((p: { kind: string }) => p.kind === 'store'), args.join(' ')).toBe(true);
    }
  });

  it('explains usage, with exit code 2 for usage errors', async () => {
    const { dataDir } = await seededWorld();
    for (const cmd of ['events', 'replay', 'verify', 'runs']) {
      const r = little(cmd, '--help');
      expect(r.code, cmd).toBe(0);
      expect(r.stdout).toContain(`usage: little ${cmd}`);
    }
    expect(little('--help').code).toBe(0);
    expect(little().code).toBe(2);
    const cases = [
      little('frobnicate'),
      little('events', '--data-dir', dataDir),
      little('events', 'not-a-run', '--data-dir', dataDir),
      little('runs', '--bogus-flag', '--data-dir', dataDir),
      little('runs', '--data-dir', join(dataDir, 'nothing-here')),
    ];
    for (const r of cases) {
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toMatch(/^little: /);
    }
    expect(cases[2].stderr).toContain('invalid run id "not-a-run": expected run_ (or ses_ for a session) followed by 1-80 of [A-Za-z0-9_-]');
  });

  it('only looks: a world an earlier version wrote keeps its schema, so that version still opens it', async () => {
    const { dataDir } = await seededWorld();
    downgradeToSchema2(dataDir);
    for (const args of [['runs'], ['events', 'run_cli'], ['replay', 'run_cli'], ['verify']]) {
      const r = little(...args, '--data-dir', dataDir);
      expect(r.code, `${args[0]}: ${r.stderr}`).toBe(0);
    }
    expect(schemaVersion(dataDir)).toBe(2);
  });

  it('says so, exiting 1, when a run id names no run (a typo is not an empty run)', async () => {
    const { dataDir } = await seededWorld();
    for (const cmd of ['events', 'replay', 'verify']) {
      const r = little(cmd, 'run_typo', '--data-dir', dataDir);
      expect(r.code, cmd).toBe(1);
      expect(r.stdout, cmd).toBe('');
      expect(r.stderr, cmd).toMatch(/^little: run_typo has no events in .* \(see little runs\)\n$/);
    }
  });
});
