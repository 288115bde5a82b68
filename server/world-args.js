// The options that name a world on the command line, shared by every `little` command:
//
//   --data-dir DIR        a local world (default ./.little-workflow)
//   --database-url URL    a PostgreSQL world (or the LITTLE_DATABASE_URL environment variable)
//   --schema NAME         the PostgreSQL world's schema (default little_workflow)
//
// The world is always opened read-only.
'use strict';

const { existsSync } = require('node:fs');
const { join, resolve } = require('node:path');

const WORLD_OPTIONS = {
  'data-dir': { type: 'string' },
  'database-url': { type: 'string' },
  schema: { type: 'string' },
};

const WORLD_HELP = `  --data-dir DIR        a local world's data directory (default: ./.little-workflow)
  --database-url URL    a PostgreSQL world instead (default: $LITTLE_DATABASE_URL)
  --schema NAME         the PostgreSQL world's schema (default: little_workflow)`;

class UsageError extends Error {}

/**
 * Opens the world the parsed options name, read-only. `--database-url` (or LITTLE_DATABASE_URL
 * when no --data-dir is given) selects a PostgreSQL world; otherwise the data directory must hold
 * a local world. Returns the world and a label for messages that never holds a password.
 */
function openWorld(lib, values, env = process.env) {
  const url = values['database-url'] ?? (values['data-dir'] === undefined ? env.LITTLE_DATABASE_URL : undefined);
  if (values['database-url'] !== undefined && values['data-dir'] !== undefined) {
    throw new UsageError('--data-dir and --database-url name two worlds: give one');
  }
  if (url !== undefined && url !== '') {
    const world = lib.postgresWorld({ connectionString: url, schema: values.schema, readOnly: true });
    return { world, label: `${describeUrl(url)} schema ${values.schema ?? 'little_workflow'}` };
  }
  if (values.schema !== undefined) throw new UsageError('--schema needs --database-url (or LITTLE_DATABASE_URL)');
  const dir = resolve(values['data-dir'] ?? '.little-workflow');
  if (!existsSync(join(dir, 'events', 'events.db'))) {
    throw new UsageError(`no world at ${dir} (use --data-dir or --database-url to point at one)`);
  }
  return { world: lib.localWorld({ dataDir: dir, readOnly: true }), label: dir };
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

module.exports = { WORLD_OPTIONS, WORLD_HELP, UsageError, openWorld, describeUrl };
