// Artifacts in an S3-compatible bucket against artifacts kept in PostgreSQL, on one server and in
// one run: two schemas of a PostgreSQL world, one keeping its artifacts' bytes as bytea chunks (the
// default) and one with `artifacts: { s3 }` (a bucket of its own, path-style, prefix `bench/`).
// Prints figures and ratios; asserts nothing.
//
//   node scripts/with-postgres.mjs "node scripts/with-s3.mjs 'node bench/s3.mjs [--quick] [--growth-mb N]'"
//   (or `npm run bench:s3`)
//
// The PostgreSQL server is LITTLE_TEST_DATABASE_URL's, the S3 server LITTLE_TEST_S3_ENDPOINT's (with
// the AWS_* credentials of the environment); with-s3.mjs starts moto's server on this machine, so
// the S3 figures are of that local, in-memory Python server, not of AWS S3 or any real store.
// 1. `writeArtifact` and `readArtifact` (which re-hashes) of one `bytes` artifact of 1, 16 and 64 MiB
//    of random bytes, a new one each round, the two worlds taking turns: medians of 5 rounds (3 for
//    64 MiB; --quick: 3 and 1), in ms and MB/s, and the ratio of the times, s3/bytea.
// 2. The database's growth for each world: pg_total_relation_size (tables, TOAST and indexes)
//    summed over the schema's tables, before and after writing N MiB (default 256) of distinct
//    1 MiB artifacts, scaled to MB per GiB of artifacts. WAL is not counted.
// MB here are MiB (2^20 bytes). A 1 KiB artifact is written and read on each world first, so that
// connecting, migrating and the S3 client's setup are not timed. The schemas are dropped, and the
// bucket emptied and deleted, at the end.
import { createHash, createHmac, randomBytes, randomFillSync } from 'node:crypto';
import { parseArgs } from 'node:util';
import { postgresWorld, readArtifact, writeArtifact } from '@little-workflow/world';
import pg from 'pg';
import { machine, median } from './lib.mjs';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    'growth-mb': { type: 'string', default: '256' },
  },
});
const url = process.env.LITTLE_TEST_DATABASE_URL;
const endpoint = process.env.LITTLE_TEST_S3_ENDPOINT;
if (!url || !endpoint) {
  console.error(`LITTLE_TEST_DATABASE_URL and LITTLE_TEST_S3_ENDPOINT must both be set. Run it as
  node scripts/with-postgres.mjs "node scripts/with-s3.mjs 'node bench/s3.mjs'"    (npm run bench:s3)
or point them at servers you may create schemas and buckets on (with the AWS_* credentials set).`);
  process.exit(1);
}

const MiB = 1024 * 1024;
const SIZES = [
  [1, values.quick ? 3 : 5],
  [16, values.quick ? 3 : 5],
  [64, values.quick ? 1 : 3],
];
const GROWTH_MB = Number(values['growth-mb']);
const region = process.env.AWS_REGION || process.env.AWS_DEFAULT_REGION || 'us-east-1';
const PREFIX = 'bench/';

// A request to the S3 server, path-style, signed with SigV4 (moto refuses anonymous requests).
const sha256 = (data) => createHash('sha256').update(data).digest('hex');
const hmac = (key, data) => createHmac('sha256', key).update(data).digest();
async function s3(method, path) {
  const at = new URL(endpoint);
  const amzDate = new Date().toISOString().replace(/[-:]|\.\d{3}/g, '');
  const day = amzDate.slice(0, 8);
  const headers = { host: at.host, 'x-amz-content-sha256': sha256(''), 'x-amz-date': amzDate };
  if (process.env.AWS_SESSION_TOKEN) headers['x-amz-security-token'] = process.env.AWS_SESSION_TOKEN;
  const names = Object.keys(headers).sort();
  const canonical = [method, path, '', ...names.map((n) => `${n}:${headers[n]}`), '', names.join(';'), headers['x-amz-content-sha256']].join('\n');
  const scope = `${day}/${region}/s3/aws4_request`;
  const key = ['s3', 'aws4_request'].reduce(hmac, hmac(hmac(`AWS4${process.env.AWS_SECRET_ACCESS_KEY ?? ''}`, day), region));
  const signature = createHmac('sha256', key).update(['AWS4-HMAC-SHA256', amzDate, scope, sha256(canonical)].join('\n')).digest('hex');
  const { host: _, ...sent } = headers;
  const authorization = `AWS4-HMAC-SHA256 Credential=${process.env.AWS_ACCESS_KEY_ID ?? ''}/${scope}, SignedHeaders=${names.join(';')}, Signature=${signature}`;
  const res = await fetch(`${at.origin}${path}`, { method, headers: { ...sent, authorization } });
  const body = await res.text();
  if (res.status < 200 || res.status > 299) throw new Error(`${method} ${path}: HTTP ${res.status} ${body.slice(0, 300)}`);
}

const tag = randomBytes(4).toString('hex');
const bucket = `bench-s3-${tag}`;
const schemas = { bytea: `bench_s3_${tag}_bytea`, s3: `bench_s3_${tag}_s3` };
const admin = new pg.Client({ connectionString: url });
await admin.connect();
let bucketMade = false;
const objects = []; // artifact ids in the bucket, to delete at the end
const worlds = {};

/** pg_total_relation_size summed over the schema's tables: with their TOAST and indexes. */
async function schemaBytes(schema) {
  const r = await admin.query(
    `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint AS bytes
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'm')`,
    [schema],
  );
  return Number(r.rows[0].bytes);
}

let n = 0;
/** A new artifact of `bytes` random bytes (incompressible, and never one stored before). */
async function write(kind, bytes, name = 'blob') {
  const payload = randomFillSync(Buffer.allocUnsafe(bytes));
  const t = performance.now();
  const m = await writeArtifact(worlds[kind], { runId: `run_bench_${kind}`, stepPath: `step/${n++}`, name, contentType: 'application/octet-stream', encoding: 'bytes', payload });
  const ms = performance.now() - t;
  if (kind === 's3') objects.push(m.artifactId);
  return [ms, m];
}
async function read(kind, m) {
  const t = performance.now();
  const { payload } = await readArtifact(worlds[kind], m.artifactRef);
  const ms = performance.now() - t;
  if (payload.length !== m.sizeBytes) throw new Error(`read ${payload.length} bytes of ${m.sizeBytes}`);
  return ms;
}

try {
  const settings = await admin.query("SELECT name, setting FROM pg_settings WHERE name IN ('server_version', 'fsync', 'synchronous_commit', 'shared_buffers')");
  console.log(`machine: ${machine()}`);
  console.log(`PostgreSQL: ${settings.rows.map((r) => `${r.name}=${r.setting}`).join(', ')}`);
  console.log(
    process.env.LITTLE_TEST_S3_CTL
      ? `S3: ${endpoint}, bucket ${bucket}: a LOCAL MOTO SERVER started by scripts/with-s3.mjs (Python, objects in memory,\non this same machine), NOT A REAL S3: the s3 figures are moto's and say nothing of AWS S3, R2 or MinIO.`
      : `S3: ${endpoint}, bucket ${bucket}: the server LITTLE_TEST_S3_ENDPOINT names (if it is moto, a local test server, not a real S3).`,
  );

  await s3('PUT', `/${bucket}`);
  bucketMade = true;
  worlds.bytea = postgresWorld({ connectionString: url, schema: schemas.bytea });
  worlds.s3 = postgresWorld({ connectionString: url, schema: schemas.s3, artifacts: { s3: { bucket, prefix: PREFIX, endpoint, region, forcePathStyle: true } } });
  for (const kind of ['bytea', 's3']) await read(kind, (await write(kind, 1024, 'warm-up'))[1]);

  // 1. Write and read, the two worlds taking turns (which goes first alternates by round).
  const times = {}; // `${mb} ${kind}` -> { write: [ms], read: [ms] }
  for (const [mb, rounds] of SIZES) {
    for (let round = 0; round < rounds; round++) {
      for (const kind of round % 2 ? ['s3', 'bytea'] : ['bytea', 's3']) {
        const [writeMs, m] = await write(kind, mb * MiB);
        const readMs = await read(kind, m);
        const t = (times[`${mb} ${kind}`] ??= { write: [], read: [] });
        t.write.push(writeMs);
        t.read.push(readMs);
      }
    }
    process.stderr.write(`s3 bench: ${mb} MiB done\n`);
  }

  // 2. The database's growth per GiB of artifacts.
  const growth = {};
  for (const kind of ['bytea', 's3']) {
    const before = await schemaBytes(schemas[kind]);
    const t = performance.now();
    for (let i = 0; i < GROWTH_MB; i++) await write(kind, MiB, 'growth');
    const s = (performance.now() - t) / 1000;
    growth[kind] = { bytes: (await schemaBytes(schemas[kind])) - before, s };
    process.stderr.write(`s3 bench: ${GROWTH_MB} MiB written to ${kind}\n`);
  }

  const rows = (label, key) =>
    SIZES.map(([mb, rounds]) => {
      const b = median(times[`${mb} bytea`][key]);
      const s = median(times[`${mb} s3`][key]);
      const mbps = (ms) => (mb / (ms / 1000)).toFixed(0);
      return `| ${label} ${mb} MiB | ${rounds} | ${b.toFixed(1)} | ${mbps(b)} | ${s.toFixed(1)} | ${mbps(s)} | ${(s / b).toFixed(2)}x |`;
    });
  console.log(`\nwriteArtifact / readArtifact of one \`bytes\` artifact: medians${values.quick ? ' (--quick)' : ''}`);
  console.log('(s3/bytea: time with the bucket over time with bytea chunks; above 1x the bucket is slower)\n');
  console.log('| operation | rounds | bytea ms | bytea MB/s | s3 ms | s3 MB/s | s3/bytea |');
  console.log('| --- | --- | --- | --- | --- | --- | --- |');
  for (const line of [...rows('write', 'write'), ...rows('read', 'read')]) console.log(line);

  console.log(`\ndatabase growth (pg_total_relation_size over the schema's tables) after ${GROWTH_MB} MiB of distinct 1 MiB artifacts\n`);
  console.log('| backend | artifacts written | DB growth MB | DB MB per GiB of artifacts | write MB/s |');
  console.log('| --- | --- | --- | --- | --- |');
  for (const kind of ['bytea', 's3']) {
    const g = growth[kind];
    console.log(`| ${kind} | ${GROWTH_MB} x 1 MiB | ${(g.bytes / MiB).toFixed(2)} | ${((g.bytes / MiB) * (1024 / GROWTH_MB)).toFixed(2)} | ${(GROWTH_MB / g.s).toFixed(0)} |`);
  }
  console.log(`s3/bytea database growth: ${(growth.s3.bytes / growth.bytea.bytes).toFixed(4)}x`);
} finally {
  for (const w of Object.values(worlds)) await w.close().catch((e) => console.error(`could not close a world: ${e.message}`));
  for (const schema of Object.values(schemas)) await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch((e) => console.error(`could not drop schema ${schema}: ${e.message}`));
  await admin.end().catch(() => undefined);
  if (bucketMade) {
    try {
      for (const id of objects) await s3('DELETE', `/${bucket}/${PREFIX}${id}`);
      await s3('DELETE', `/${bucket}`);
    } catch (e) {
      console.error(`could not empty and delete bucket ${bucket}: ${e.message}`);
    }
  }
}
