// The options that name a world on the command line, shared by every `little` command:
//
//   --data-dir DIR        a local world (default ./.little-workflow)
//   --database-url URL    a PostgreSQL world (or the LITTLE_DATABASE_URL environment variable)
//   --schema NAME         the PostgreSQL world's schema (default little_workflow)
//   --s3-bucket NAME      where the world keeps its artifacts' bytes, with --s3-prefix,
//                         --s3-endpoint, --s3-region and --s3-path-style (LITTLE_S3_BUCKET and so on)
//
// The world is opened read-only, except by the commands that change it (openWritableWorld).
'use strict';

const { existsSync } = require('node:fs');
const { join, resolve } = require('node:path');

const WORLD_OPTIONS = {
  'data-dir': { type: 'string' },
  'database-url': { type: 'string' },
  schema: { type: 'string' },
  's3-bucket': { type: 'string' },
  's3-prefix': { type: 'string' },
  's3-endpoint': { type: 'string' },
  's3-region': { type: 'string' },
  's3-path-style': { type: 'boolean' },
};

const WORLD_HELP = `  --data-dir DIR        a local world's data directory (default: ./.little-workflow)
  --database-url URL    a PostgreSQL world instead (default: $LITTLE_DATABASE_URL)
  --schema NAME         the PostgreSQL world's schema (default: little_workflow)
  --s3-bucket NAME      the bucket of a world that keeps its artifacts' bytes in one (default:
                        $LITTLE_S3_BUCKET), with --s3-prefix P, --s3-endpoint URL, --s3-region R
                        and --s3-path-style (or LITTLE_S3_PREFIX, _ENDPOINT, _REGION, _PATH_STYLE=1);
                        credentials from the AWS environment variables`;

class UsageError extends Error {}

/**
 * The world the parsed options name, not yet opened. `--database-url` (or LITTLE_DATABASE_URL
 * when no --data-dir is given) selects a PostgreSQL world; otherwise the data directory must hold
 * a local world, unless `create` (a command that may start a world, such as import). The label,
 * for messages, never holds a password.
 */
function worldTarget(values, env = process.env, { create = false } = {}) {
  const url = values['database-url'] ?? (values['data-dir'] === undefined ? env.LITTLE_DATABASE_URL : undefined);
  if (values['database-url'] !== undefined && values['data-dir'] !== undefined) {
    throw new UsageError('--data-dir and --database-url name two worlds: give one');
  }
  const artifacts = artifactsOf(values, env);
  if (url !== undefined && url !== '') {
    return { kind: 'postgres', url, schema: values.schema, artifacts, label: `${describeUrl(url)} schema ${values.schema ?? 'little_workflow'}` };
  }
  if (values.schema !== undefined) throw new UsageError('--schema needs --database-url (or LITTLE_DATABASE_URL)');
  const dir = resolve(values['data-dir'] ?? '.little-workflow');
  if (!create && !existsSync(join(dir, 'events', 'events.db'))) {
    throw new UsageError(`no world at ${dir} (use --data-dir or --database-url to point at one)`);
  }
  return { kind: 'local', dir, artifacts, label: dir };
}

/** The `artifacts` option the parsed options (or the LITTLE_S3_* variables) give, if any. */
function artifactsOf(values, env) {
  const pick = (flag, name) => values[`s3-${flag}`] ?? (env[`LITTLE_S3_${name}`] || undefined);
  const bucket = pick('bucket', 'BUCKET');
  const others = ['prefix', 'endpoint', 'region'].filter((f) => values[`s3-${f}`] !== undefined || values['s3-path-style']);
  if (bucket === undefined) {
    if (others.length > 0) throw new UsageError('--s3-prefix, --s3-endpoint, --s3-region and --s3-path-style need --s3-bucket');
    return undefined;
  }
  const pathStyle = values['s3-path-style'] ?? env.LITTLE_S3_PATH_STYLE === '1';
  return {
    s3: {
      bucket,
      prefix: pick('prefix', 'PREFIX'),
      endpoint: pick('endpoint', 'ENDPOINT'),
      region: pick('region', 'REGION'),
      ...(pathStyle ? { forcePathStyle: true } : {}),
    },
  };
}

function openTarget(lib, target, readOnly) {
  const artifacts = target.artifacts ? { artifacts: target.artifacts } : {};
  return target.kind === 'postgres'
    ? lib.postgresWorld({ connectionString: target.url, schema: target.schema, readOnly, ...artifacts })
    : lib.localWorld({ dataDir: target.dir, readOnly, ...artifacts });
}

/**
 * Opens the world the parsed options name, read-only (see worldTarget). Returns the world and a
 * label for messages.
 */
function openWorld(lib, values, env = process.env) {
  const target = worldTarget(values, env);
  return { world: openTarget(lib, target, true), label: target.label };
}

/**
 * Opens the world the parsed options name as a writer, for the commands that change it; also
 * returns its target (worldTarget). A PostgreSQL world is first read through a read-only
 * connection: a writer creates the schema it names when it is absent, and a mistyped --schema
 * must fail as it does for the read-only commands, not make an empty world. With `create`, the
 * world is made when it is not there.
 */
async function openWritableWorld(lib, values, env = process.env, { create = false } = {}) {
  const target = worldTarget(values, env, { create });
  if (target.kind === 'postgres' && !create) {
    const probe = openTarget(lib, target, true);
    try {
      await lib.queryRuns(probe, { limit: 1 });
    } finally {
      await probe.close();
    }
  }
  return { world: openTarget(lib, target, false), label: target.label, target };
}

/** A connection string with any password left out. */
function describeUrl(url) {
  try {
    const u = new URL(url);
    if (u.protocol === 'postgres:' || u.protocol === 'postgresql:') {
      u.password = '';
      return u.toString();
    }
  } catch {
    // A libpq key=value string: keep every key but the password.
  }
  return url.replace(/password\s*=\s*('(?:[^'\\]|\\.)*'|\S*)/gi, 'password=…');
}

module.exports = { WORLD_OPTIONS, WORLD_HELP, UsageError, worldTarget, openWorld, openWritableWorld, describeUrl };
