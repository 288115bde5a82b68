// `node bench/archive.mjs [--mb N] [--database-url URL]`: export and import throughput, and the
// memory they take. Writes a local world of about N MB of events (default 1024): runs of 10
// events with about 1 KB of payload each, and a 64 KiB artifact for one run in a hundred. Then,
// each in a process of its own so that its peak RSS is its own:
// - `exportRuns` of the whole world to a file;
// - `importRuns` of that file into a new local world;
// - with `--database-url` (or LITTLE_TEST_DATABASE_URL), into a new schema of a PostgreSQL world,
//   and `exportRuns` from it.
// Prints MB/s of archive and each process's peak RSS. Asserts nothing.
import { spawnSync } from 'node:child_process';
import { createReadStream, createWriteStream, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { appendEvent, exportRuns, importRuns, localWorld, postgresWorld, writeArtifact } from '@little-workflow/world';
import { machine } from './lib.mjs';

const { values } = parseArgs({
  options: {
    mb: { type: 'string', default: '1024' },
    'database-url': { type: 'string' },
    child: { type: 'string' },
    from: { type: 'string' },
    to: { type: 'string' },
    schema: { type: 'string' },
  },
});

/** Open the world a child names: a data directory, or `pg:<schema>`. */
function open(where) {
  return where.startsWith('pg:') ? postgresWorld({ connectionString: values['database-url'], schema: where.slice(3) }) : localWorld({ dataDir: where });
}

if (values.child !== undefined) {
  // One transfer, in its own process: prints its time, its peak RSS, and the peak of its
  // anonymous memory (the RSS less the pages of files it maps, such as a local world's database,
  // which its readers map and the kernel drops as it needs), sampled every 20 ms, as JSON.
  let anonKB = 0;
  const sample = () => {
    const m = /RssAnon:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'));
    if (m) anonKB = Math.max(anonKB, Number(m[1]));
  };
  const sampler = setInterval(sample, 20);
  const t = performance.now();
  if (values.child === 'export') {
    const world = open(values.from);
    const out = createWriteStream(values.to);
    for await (const piece of exportRuns(world)) if (!out.write(piece)) await once(out, 'drain');
    out.end();
    await once(out, 'finish');
    await world.close();
  } else {
    const world = open(values.to);
    const counts = await importRuns(world, createReadStream(values.from));
    await world.close();
    if (counts.events === 0) throw new Error('nothing was imported');
  }
  const ms = performance.now() - t;
  clearInterval(sampler);
  sample();
  console.log(JSON.stringify({ ms, maxRssMB: process.resourceUsage().maxRSS / 1024, anonMB: anonKB / 1024 }));
  process.exit(0);
}

function child(args) {
  const r = spawnSync(process.execPath, [fileURLToPath(import.meta.url), ...args, ...(values['database-url'] ? ['--database-url', values['database-url']] : [])], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  if (r.status !== 0) throw new Error(`bench child ${args.join(' ')} failed`);
  return JSON.parse(r.stdout.trim().split('\n').at(-1));
}

values['database-url'] ??= process.env.LITTLE_TEST_DATABASE_URL;
const root = mkdtempSync(join(tmpdir(), 'little-archive-'));
const source = join(root, 'source');
const file = join(root, 'runs.jsonl');
const storeMB = () => (statSync(join(source, 'events', 'events.db')).size + (statSync(join(source, 'events', 'events.db-wal'), { throwIfNoEntry: false })?.size ?? 0)) / 1048576;

try {
  console.log(machine());
  const world = localWorld({ dataDir: source, durability: 'normal' });
  const t0 = performance.now();
  const note = 'x'.repeat(900);
  let runs = 0;
  let events = 0;
  // About 1 KB of envelope an event: a thousand events a megabyte.
  const target = Number(values.mb) * 1024;
  while (events < target) {
    const batch = [];
    for (let r = 0; r < 1_000; r++, runs++) {
      const runId = `run_${String(runs).padStart(8, '0')}`;
      batch.push(
        (async () => {
          const ref = runs % 100 === 0 ? (await writeArtifact(world, { runId, stepPath: 'out', name: 'blob', contentType: 'application/octet-stream', encoding: 'bytes', payload: new Uint8Array(65536).fill(runs % 256) })).artifactRef : undefined;
          for (let i = 0; i < 10; i++) await appendEvent(world, runId, { type: 'note', payload: { i, note, ...(ref && i === 9 ? { ref } : {}) } });
        })(),
      );
    }
    await Promise.all(batch);
    events += 10_000;
  }
  await world.close();
  console.log(`wrote ${runs.toLocaleString('en-US')} runs, ${events.toLocaleString('en-US')} events, ${storeMB().toFixed(0)} MB of event store in ${((performance.now() - t0) / 1000).toFixed(1)} s`);

  const rows = [];
  const exported = child(['--child', 'export', '--from', source, '--to', file]);
  const archiveMB = statSync(file).size / 1048576;
  rows.push(['exportRuns, local world', exported]);
  rows.push(['importRuns, into a new local world', child(['--child', 'import', '--from', file, '--to', join(root, 'imported')])]);
  if (values['database-url']) {
    const schema = `bench_archive_${process.pid}`;
    rows.push(['importRuns, into a new PostgreSQL schema', child(['--child', 'import', '--from', file, '--to', `pg:${schema}`])]);
    rows.push(['exportRuns, PostgreSQL world', child(['--child', 'export', '--from', `pg:${schema}`, '--to', join(root, 'from-pg.jsonl')])]);
    const pg = postgresWorld({ connectionString: values['database-url'], schema });
    await pg.close();
  } else {
    console.log('no PostgreSQL: pass --database-url (or run through scripts/with-postgres.mjs) to measure it too');
  }
  console.log(`archive: ${archiveMB.toFixed(0)} MB`);
  console.log(`${'transfer'.padEnd(44)} ${'seconds'.padStart(9)} ${'MB/s'.padStart(8)} ${'peak RSS MB'.padStart(12)} ${'peak anon MB'.padStart(13)}`);
  for (const [name, r] of rows) {
    console.log(
      `${name.padEnd(44)} ${(r.ms / 1000).toFixed(1).padStart(9)} ${(archiveMB / (r.ms / 1000)).toFixed(1).padStart(8)} ${r.maxRssMB.toFixed(0).padStart(12)} ${r.anonMB.toFixed(0).padStart(13)}`,
    );
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}
