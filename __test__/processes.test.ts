// Several processes on one data directory, reopening, and data directories that are not worlds.
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import {
  appendEvent,
  EventAppendIdempotencyConflictError,
  EventLogCorruptError,
  listEvents,
  localWorld,
  validateEventLogShape,
  WorldError,
  WorldPathError,
} from '@little-workflow/world';
import { packageRoot, tempDir, track } from './helpers';

function runChild(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [join(__dirname, 'fixtures', 'append-child.cjs'), ...args], { cwd: packageRoot });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('two processes, one data directory', () => {
  it('keeps a run dense when two child processes append to it at once', async () => {
    const dataDir = tempDir();
    const [a, b] = await Promise.all([
      runChild([dataDir, 'run_shared', '400', 'a']),
      runChild([dataDir, 'run_shared', '400', 'b', 'normal']),
    ]);
    expect(a.code, a.stderr).toBe(0);
    expect(b.code, b.stderr).toBe(0);
    const world = track(localWorld({ dataDir }));
    const events = await listEvents(world, 'run_shared');
    expect(events.length).toBe(800);
    validateEventLogShape(events);
    // Each child's appends are in its own call order.
    for (const label of ['a', 'b']) {
      const mine = events.filter((e) => String(e.payload.stepPath).startsWith(`${label}-`));
      expect(mine.map((e) => e.payload.stepPath)).toEqual(Array.from({ length: 400 }, (_, i) => `${label}-${i}`));
    }
    // Every sequence a child was told about is the one stored for its payload.
    const reported = new Set([...a.stdout.split('\n'), ...b.stdout.split('\n')].filter((l) => /^[ab] \d+$/.test(l)));
    expect(reported.size).toBe(800);
  });
});

describe('reopening a world', () => {
  it('answers an idempotent retry identically across a close and a reopen', async () => {
    const dataDir = tempDir();
    const input = {
      type: 'harness.tool_call.started',
      payload: { callId: 'call_1', caller: 'model', toolName: 'search', args: { q: 'x' }, turn: 1 },
      appendIdempotencyKey: 'tool-start-1',
    };
    const first = localWorld({ dataDir });
    const original = await appendEvent(first, 'run_retry', input);
    await first.close();
    const second = track(localWorld({ dataDir, durability: 'normal' }));
    const retried = await appendEvent(second, 'run_retry', input);
    expect(retried).toEqual(original);
    let conflict: unknown;
    try {
      await appendEvent(second, 'run_retry', { ...input, payload: { ...input.payload, args: { q: 'y' } } });
    } catch (e) {
      conflict = e;
    }
    expect(conflict).toBeInstanceOf(EventAppendIdempotencyConflictError);
    expect((conflict as WorldError).code).toBe('EVENT_APPEND_IDEMPOTENCY_CONFLICT');
    expect(await listEvents(second, 'run_retry')).toEqual([original]);
  });
});

describe('data directories that are not worlds', () => {
  function openError(dataDir: string): unknown {
    try {
      track(localWorld({ dataDir }));
    } catch (e) {
      return e;
    }
    return undefined;
  }

  it('refuses a corrupt events.db with EventLogCorruptError', () => {
    const dataDir = tempDir();
    mkdirSync(join(dataDir, 'events'));
    writeFileSync(join(dataDir, 'events', 'events.db'), Buffer.alloc(4096, 0x5a));
    const err = openError(dataDir);
    expect(err).toBeInstanceOf(EventLogCorruptError);
    expect((err as WorldError).code).toBe('EVENT_LOG_CORRUPT');
  });

  it('refuses a SQLite database of another application with WorldPathError, leaving it untouched', () => {
    const dataDir = tempDir();
    mkdirSync(join(dataDir, 'events'));
    // A database of another application, made by another SQLite client.
    const db = new Database(join(dataDir, 'events', 'events.db'));
    db.exec('CREATE TABLE invoices (id INTEGER PRIMARY KEY); INSERT INTO invoices VALUES (1);');
    db.close();
    const before = readFileSync(join(dataDir, 'events', 'events.db'));
    const err = openError(dataDir);
    expect(err).toBeInstanceOf(WorldPathError);
    expect((err as WorldError).code).toBe('WORLD_PATH');
    expect(readFileSync(join(dataDir, 'events', 'events.db')).equals(before)).toBe(true);
  });

  it('refuses a data directory that is a file', () => {
    const file = join(tempDir(), 'not-a-dir');
    writeFileSync(file, 'x');
    const err = openError(file);
    expect(err).toBeInstanceOf(WorldError);
  });
});
