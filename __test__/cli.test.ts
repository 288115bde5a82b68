// The `little` command, run as a user runs it: spawned, its output parsed.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { acquireRunLock, appendEvent, appendSessionEvent, canonicalize, listEvents, localWorld, postgresWorld, writeArtifact, type World } from '@little-workflow/world';
import { downgradeToSchema2, freshSchema, needsPostgres, postgresUrl, runLittle, schemaVersion, tempDir, withPg } from './helpers';

function little(...args: string[]) {
  const r = runLittle(args);
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

  it('delete needs --yes: without it nothing changes; with it the run, its events and its artifact go', async () => {
    const { dataDir, events } = await seededWorld();
    const refused = little('delete', 'run_cli', '--data-dir', dataDir);
    expect(refused.code).toBe(2);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toMatch(/^little delete: would delete run_cli from .*nothing was changed\. Pass --yes/);
    expect(little('events', 'run_cli', '--data-dir', dataDir).stdout.trimEnd().split('\n')).toEqual(events.map((e) => canonicalize(e)));

    // A run the world holds nothing of is said as not deleted, and is no failure.
    const r = little('delete', 'run_cli', 'run_nothing', '--yes', '--data-dir', dataDir);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.endsWith('\n') && r.stdout.trimEnd().split('\n')).toHaveLength(1);
    expect(JSON.parse(r.stdout)).toEqual({
      deleted: [
        { runId: 'run_cli', deleted: true, events: 4, artifacts: 1, bytes: 5 },
        { runId: 'run_nothing', deleted: false, events: 0, artifacts: 0, bytes: 0 },
      ],
      runs: 1,
      events: 4,
      artifacts: 1,
      bytes: 5,
    });
    expect(little('runs', '--data-dir', dataDir).stdout.trimEnd().split('\n').map((l) => JSON.parse(l).runId)).toEqual(['run_other']);
    expect(little('verify', '--data-dir', dataDir).code).toBe(0);
  });

  it('delete of a run another process holds locked prints the error, exits 1 and deletes it not', async () => {
    const { dataDir } = await seededWorld();
    const world = localWorld({ dataDir });
    try {
      const lock = await acquireRunLock(world, 'run_other');
      const r = little('delete', 'run_other', '--yes', '--data-dir', dataDir);
      expect(r.code).toBe(1);
      expect(r.stdout).toBe('');
      expect(r.stderr).toMatch(/^little: run:run_other is locked .*\[RUN_LOCKED\]\n$/);
      // Those deleted before the locked one stay deleted, and are said first.
      const partial = little('delete', 'run_cli', 'run_other', '--yes', '--data-dir', dataDir);
      expect(partial.code).toBe(1);
      expect(JSON.parse(partial.stdout).deleted.map((d: { runId: string; deleted: boolean }) => [d.runId, d.deleted])).toEqual([['run_cli', true]]);
      expect(partial.stderr).toContain('RUN_LOCKED');
      expect(await listEvents(world, 'run_other')).toHaveLength(1);
      await lock.release();
    } finally {
      await world.close();
    }
  });

  /** A world of runs that ended (completed, failed), one still running and one paused. */
  async function endedWorld(world: World) {
    for (const id of ['run_done1', 'run_done2', 'run_failed', 'run_going']) await appendEvent(world, id, { type: 'RunStarted', payload: {} });
    await appendEvent(world, 'run_done1', { type: 'RunCompleted', payload: {} });
    await appendEvent(world, 'run_done2', { type: 'RunCompleted', payload: {} });
    await appendEvent(world, 'run_failed', { type: 'RunFailed', payload: { error: { message: 'no' } } });
    await world.close();
  }

  it('prune lists with --dry-run, deletes with --yes, and only the runs that ended before the time', async () => {
    const dataDir = tempDir();
    await endedWorld(localWorld({ dataDir }));
    const runIds = () => little('runs', '--data-dir', dataDir).stdout.trimEnd().split('\n').map((l) => JSON.parse(l).runId);
    const all = ['run_done1', 'run_done2', 'run_failed', 'run_going'];
    const prune = (...args: string[]) => {
      const r = little('prune', '--data-dir', dataDir, ...args);
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(0);
      expect(r.stdout.trimEnd().split('\n'), args.join(' ')).toHaveLength(1);
      return JSON.parse(r.stdout);
    };

    const refused = little('prune', '--ended-before', '0d', '--data-dir', dataDir);
    expect(refused.code).toBe(2);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toMatch(/^little prune: would delete every run in .* that has ended .*nothing was changed\. Pass --dry-run to list them, or --yes/);
    expect(runIds()).toEqual(all);

    expect(prune('--ended-before', '0d', '--dry-run')).toEqual({ runs: 3, events: 6, artifacts: 0, bytes: 0, skipped: 0, runIds: ['run_done1', 'run_done2', 'run_failed'] });
    expect(prune('--ended-before', '0h', '--dry-run', '--status', 'failed').runIds).toEqual(['run_failed']);
    expect(prune('--ended-before', '0m', '--dry-run', '--limit', '1').runIds).toEqual(['run_done1']);
    expect(runIds()).toEqual(all);

    // They ended moments ago: not a day, nor an hour, before now, nor before 2000.
    for (const when of ['1d', '1h', '2000-01-01T00:00:00Z', '2000-01-01']) expect(prune('--ended-before', when, '--yes'), when).toEqual({ runs: 0, events: 0, artifacts: 0, bytes: 0, skipped: 0 });
    expect(runIds()).toEqual(all);

    expect(prune('--ended-before', '0d', '--status', 'failed', '--yes')).toEqual({ runs: 1, events: 2, artifacts: 0, bytes: 0, skipped: 0 });
    expect(runIds()).toEqual(['run_done1', 'run_done2', 'run_going']);
    // A running run is never pruned, however late the time.
    expect(prune('--ended-before', '2999-01-01T00:00:00.000Z', '--yes')).toEqual({ runs: 2, events: 4, artifacts: 0, bytes: 0, skipped: 0 });
    expect(runIds()).toEqual(['run_going']);
    expect(little('verify', '--data-dir', dataDir).code).toBe(0);
  });

  it('prune refuses a bad --ended-before, --status or --limit with exit 2 and leaves the world as it was', async () => {
    const dataDir = tempDir();
    await endedWorld(localWorld({ dataDir }));
    downgradeToSchema2(dataDir);
    const cases = [
      [],
      ['--ended-before', 'yesterday'],
      ['--ended-before', '5x'],
      ['--ended-before=-1d'],
      ['--ended-before', '1.5d'],
      ['--ended-before', ''],
      ['--ended-before', '2026-02-30'],
      ['--ended-before', '2026-13-01T00:00:00Z'],
      ['--ended-before', '99999999d'],
      ['--ended-before', '0d', '--limit', '0'],
      ['--ended-before', '0d', '--status', ','],
    ];
    for (const args of cases) {
      for (const mode of ['--yes', '--dry-run']) {
        const r = little('prune', '--data-dir', dataDir, ...args, mode);
        expect(r.code, `${args.join(' ')} ${mode}: ${r.stderr}`).toBe(2);
        expect(r.stdout).toBe('');
        expect(r.stderr).toMatch(/^little: (invalid )?--(ended-before|limit|status)/);
      }
    }
    // Refused before the world was opened: an older world keeps its schema.
    expect(schemaVersion(dataDir)).toBe(2);
    // A dry run reads the world read-only: it lists the ended runs and upgrades nothing.
    const dry = little('prune', '--data-dir', dataDir, '--ended-before', '0d', '--dry-run');
    expect(dry.code, dry.stderr).toBe(0);
    expect(JSON.parse(dry.stdout).skipped).toBe(0);
    expect(schemaVersion(dataDir)).toBe(2);
    // Which statuses a run ends in, the core judges; its refusal is said as the flag.
    const running = little('prune', '--data-dir', dataDir, '--ended-before', '0d', '--status', 'running', '--yes');
    expect(running.code).toBe(2);
    expect(running.stderr).toMatch(/^little: --status: .*"running"/);
    expect(little('runs', '--data-dir', dataDir).stdout.trimEnd().split('\n')).toHaveLength(4);
  });

  it('a change refused for want of --yes leaves even an older world as it was', async () => {
    const { dataDir } = await seededWorld();
    downgradeToSchema2(dataDir);
    for (const args of [['delete', 'run_cli'], ['prune', '--ended-before', '0d'], ['compact']]) {
      const r = little(...args, '--data-dir', dataDir);
      expect(r.code, args[0]).toBe(2);
      expect(r.stdout, args[0]).toBe('');
      expect(r.stderr, args[0]).toMatch(new RegExp(`^little ${args[0]}: would .*Pass .*--yes`));
    }
    expect(schemaVersion(dataDir)).toBe(2);
    expect(little('events', 'run_cli', '--data-dir', dataDir).stdout.trimEnd().split('\n')).toHaveLength(4);
  });

  it('compact needs --yes, and gives back the space deleted runs freed', async () => {
    const dataDir = tempDir();
    const world = localWorld({ dataDir });
    const big = 'x'.repeat(4000);
    for (let i = 0; i < 200; i++) await appendEvent(world, `run_${i}`, { type: 'RunCompleted', payload: { big } });
    await appendEvent(world, 'run_kept', { type: 'RunStarted', payload: {} });
    await world.close();
    expect(little('prune', '--ended-before', '0d', '--yes', '--data-dir', dataDir).code).toBe(0);
    expect(little('compact', '--data-dir', dataDir).code).toBe(2);
    const r = little('compact', '--yes', '--data-dir', dataDir);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.trimEnd().split('\n')).toHaveLength(1);
    const done = JSON.parse(r.stdout) as { compacted: boolean; bytesBefore: number; bytesAfter: number };
    expect(done.compacted).toBe(true);
    expect(done.bytesBefore).toBeGreaterThan(800_000);
    expect(done.bytesAfter).toBeLessThan(done.bytesBefore / 4);
    expect(little('verify', '--data-dir', dataDir).code).toBe(0);
    expect(little('runs', '--data-dir', dataDir).stdout.trimEnd().split('\n').map((l) => JSON.parse(l).runId)).toEqual(['run_kept']);
  });

  it('backup copies a world, read-only, into a new directory that opens as a world; a non-empty one exits 1', async () => {
    const { dataDir, events } = await seededWorld();
    downgradeToSchema2(dataDir);
    const to = join(tempDir(), 'copy');
    const r = little('backup', '--to', to, '--data-dir', dataDir);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(`${JSON.stringify({ backup: to, runs: 2 })}\n`);
    // It only looked: the world keeps the schema an earlier version wrote.
    expect(schemaVersion(dataDir)).toBe(2);
    const verified = little('verify', '--data-dir', to);
    expect(verified.code, verified.stderr).toBe(0);
    expect(JSON.parse(verified.stdout)).toMatchObject({ ok: true, runs: 2, artifacts: 1 });
    expect(little('events', 'run_cli', '--data-dir', to).stdout.trimEnd().split('\n')).toEqual(events.map((e) => canonicalize(e)));

    const again = little('backup', '--to', to, '--data-dir', dataDir);
    expect(again.code).toBe(1);
    expect(again.stdout).toBe('');
    expect(again.stderr).toMatch(/^little: .*is not empty/);
    expect(little('backup', '--data-dir', dataDir).code).toBe(2);
  });

  it('says in --help which commands change the world and that they need --yes', () => {
    const main = little('--help').stdout;
    for (const cmd of ['delete', 'prune', 'compact', 'backup']) expect(main).toMatch(new RegExp(`^  ${cmd} `, 'm'));
    expect(main).toContain('commands that change the world (each needs --yes');
    for (const cmd of ['delete', 'prune', 'compact']) {
      const r = little(cmd, '--help');
      expect(r.code, cmd).toBe(0);
      expect(r.stdout, cmd).toContain(`usage: little ${cmd}`);
      expect(r.stdout, cmd).toContain('Changes the world');
      expect(r.stdout, cmd).toContain('--yes');
    }
    const backup = little('backup', '--help');
    expect(backup.stdout).toContain('usage: little backup --to DIR');
    expect(backup.stdout).toContain('pg_dump');
  });

  describe.runIf(needsPostgres())('on a PostgreSQL world', () => {
    it('prune, delete and compact with --database-url and --schema; backup refers to pg_dump', async () => {
      const url = postgresUrl()!;
      const schema = freshSchema();
      await endedWorld(postgresWorld({ connectionString: url, schema }));
      const pg = (...args: string[]) => little(...args, '--database-url', url, '--schema', schema);
      const runIds = () => pg('runs').stdout.trimEnd().split('\n').map((l) => JSON.parse(l).runId);

      const refused = pg('prune', '--ended-before', '0d');
      expect(refused.code).toBe(2);
      expect(refused.stderr).toContain(`schema ${schema}`);
      const dry = pg('prune', '--ended-before', '0d', '--dry-run');
      expect(dry.code, dry.stderr).toBe(0);
      expect(JSON.parse(dry.stdout)).toEqual({ runs: 3, events: 6, artifacts: 0, bytes: 0, skipped: 0, runIds: ['run_done1', 'run_done2', 'run_failed'] });
      expect(runIds()).toEqual(['run_done1', 'run_done2', 'run_failed', 'run_going']);
      const iso = new Date(Date.now() + 1000).toISOString();
      const done = pg('prune', '--ended-before', iso, '--status', 'completed', '--yes');
      expect(done.code, done.stderr).toBe(0);
      expect(JSON.parse(done.stdout)).toEqual({ runs: 2, events: 4, artifacts: 0, bytes: 0, skipped: 0 });
      expect(runIds()).toEqual(['run_failed', 'run_going']);

      const del = pg('delete', 'run_going', '--yes');
      expect(del.code, del.stderr).toBe(0);
      expect(JSON.parse(del.stdout)).toMatchObject({ runs: 1, events: 1 });
      const compact = pg('compact', '--yes');
      expect(compact.code, compact.stderr).toBe(0);
      expect(JSON.parse(compact.stdout)).toEqual({ compacted: true });
      expect(runIds()).toEqual(['run_failed']);

      const backup = pg('backup', '--to', join(tempDir(), 'copy'));
      expect(backup.code).toBe(1);
      expect(backup.stderr).toContain('pg_dump');

      // A schema that holds no world is not made one by a command that would change it.
      const typo = freshSchema();
      const r = little('prune', '--ended-before', '0d', '--yes', '--database-url', url, '--schema', typo);
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`no world in schema ${typo}`);
      const made = await withPg((c) => c.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [typo]));
      expect(made.rowCount).toBe(0);
    });
  });
});
