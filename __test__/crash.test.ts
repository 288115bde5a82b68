// Crash safety: real child processes append across several runs and write artifacts, and are
// killed with SIGKILL at random moments, on a local world and on a PostgreSQL world. After each kill, every append whose promise resolved is
// stored as it was reported, every run is dense, every reported artifact reads back, and
// verification is clean.
import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { listEvents, localWorld, postgresWorld, readArtifact, validateEventLogShape, verifyWorld, type World } from '@little-workflow/world';
import { freshSchema, needsPostgres, packageRoot, postgresUrl, tempDir } from './helpers';

const CYCLES = Number(process.env.CRASH_CYCLES ?? 50);
/** A PostgreSQL world's cycles each start a process that connects; fewer of them keep the test short. */
const PG_CYCLES = Number(process.env.CRASH_CYCLES ?? 20);

/** Where the writer writes (`where` as the fixture takes it), and how this test opens it. */
interface Target {
  where: string;
  cycles: number;
  open(): World;
  cliArgs: string[];
}

function localTarget(): Target {
  const dataDir = tempDir();
  return { where: dataDir, cycles: CYCLES, open: () => localWorld({ dataDir }), cliArgs: ['--data-dir', dataDir] };
}

function postgresTarget(): Target {
  const schema = freshSchema();
  const connectionString = postgresUrl()!;
  return { where: `pg:${schema}`, cycles: PG_CYCLES, open: () => postgresWorld({ connectionString, schema }), cliArgs: ['--database-url', connectionString, '--schema', schema] };
}

const targets: Array<[string, () => Target]> = [['localWorld', localTarget], ...(needsPostgres() ? [['postgresWorld', postgresTarget] as [string, () => Target]] : [])];

/** Start a writer, let it run until it has reported `minLines` plus a random delay, then SIGKILL it. */
async function killMidway(dataDir: string, durability: string, seed: number): Promise<string[]> {
  const child = spawn(process.execPath, [join(__dirname, 'fixtures', 'crash-writer.cjs'), dataDir, durability, String(seed)], { cwd: packageRoot });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  await new Promise<void>((resolve, reject) => {
    const started = Date.now();
    const tick = () => {
      if (out.length > 0) {
        setTimeout(() => {
          child.kill('SIGKILL');
          resolve();
        }, Math.floor(Math.random() * 120));
      } else if (Date.now() - started > 20_000) reject(new Error(`the writer never wrote: ${err}`));
      else setTimeout(tick, 5);
    };
    tick();
  });
  await exited;
  if (err) throw new Error(`the writer failed: ${err}`);
  // Only complete lines: a kill can cut the last one short.
  return out.split('\n').slice(0, -1);
}

describe.each(targets)('crash safety under SIGKILL: %s', (_kind, target) => {
  it(`loses nothing that resolved, over its kill cycles (${CYCLES} local, ${PG_CYCLES} PostgreSQL)`, async () => {
    const t = target();
    const dataDir = t.where;
    const CYCLES = t.cycles;
    const reported = new Map<string, string>(); // "runId sequence" -> eventId
    const artifacts = new Map<string, string>();
    for (let cycle = 0; cycle < CYCLES; cycle++) {
      const lines = await killMidway(dataDir, cycle % 2 ? 'normal' : 'full', cycle * 7919 + 1);
      for (const line of lines) {
        const [kind, a, b, c] = line.split(' ');
        if (kind === 'event') reported.set(`${a} ${b}`, c);
        else if (kind === 'artifact') artifacts.set(a, b);
      }
      const world = t.open();
      try {
        for (const runId of ['run_crash_a', 'run_crash_b', 'run_crash_c', 'run_crash_d']) {
          const events = await listEvents(world, runId);
          validateEventLogShape(events);
          const stored = new Map(events.map((e) => [`${runId} ${e.sequence}`, e.eventId]));
          for (const [key, eventId] of reported) {
            if (key.startsWith(`${runId} `)) expect(stored.get(key), `cycle ${cycle}: ${key}`).toBe(eventId);
          }
        }
        for (const [id, sha] of artifacts) expect((await readArtifact(world, id)).manifest.sha256).toBe(sha);
        const report = await verifyWorld(world);
        expect(report.problems, `cycle ${cycle}`).toEqual([]);
      } finally {
        await world.close();
      }
      if (cycle % 10 === 9 || cycle === CYCLES - 1) {
        const cli = spawnSync(process.execPath, [join(packageRoot, 'bin', 'little.js'), 'verify', ...t.cliArgs], { encoding: 'utf8' });
        expect(cli.status, cli.stderr).toBe(0);
      }
    }
    expect(reported.size).toBeGreaterThan(CYCLES);
    expect(artifacts.size).toBeGreaterThan(0);
  }, Math.max(300_000, Math.max(CYCLES, PG_CYCLES) * 5_000));
});
