#!/usr/bin/env node
// `little`: look into a world from the command line, prune it, and carry runs between worlds.
//
//   little events <runId>    one canonical JSON envelope per line (for jq)
//   little replay <runId>    the materialized state as JSON
//   little verify [runId]    re-check the store, density, event ids, payloads, artifact hashes
//   little runs              the runs in the world, one JSON object per line, read a page at a
//                            time (--status, --before, --after, --order, --limit)
//   little serve             the inspector page and a read-only API (Server-Sent Events)
//   little backup --to DIR   copy a local world into a new or empty directory
//   little export [runId…]   write runs as an archive (JSON Lines), to stdout or --out FILE
//   little import [FILE]     read an archive (stdin by default)         (changes the world)
//   little delete <runId…>   delete runs and what they own             (changes the world)
//   little prune             delete the runs that ended before a time  (changes the world)
//   little compact           give the space deleted runs freed back    (changes the world)
//   little move-artifacts    move older artifacts into the bucket      (changes the world)
//
// Every command takes --data-dir DIR (default ./.little-workflow), or --database-url URL (or
// LITTLE_DATABASE_URL) and --schema NAME for a PostgreSQL world, the --s3-* options of a world that
// keeps its artifacts' bytes in a bucket, and --help. All but import, delete, prune, compact and
// move-artifacts open the world read-only. Those five print what they did as one JSON line, and
// without --yes (or prune's --dry-run) change nothing, say what they would do and exit 2: they
// never prompt, so that a script or CI job cannot hang on them.
// Exit codes: 0 ok; 1 problems found, a run id that names no run, a world that cannot be read or
// changed (a run locked by another process), or a replay refused; 2 a usage error, including a
// data directory that holds no world, and a change asked for without --yes.
'use strict';

const { statSync } = require('node:fs');
const { join, resolve } = require('node:path');
const { parseArgs } = require('node:util');
const { WORLD_OPTIONS, UsageError, worldTarget, openWorld, openWritableWorld } = require('../server/world-args.js');
const { HELP } = require('./little-help.js');

function out(line) {
  return new Promise((res) => {
    if (process.stdout.write(`${line}\n`)) res();
    else process.stdout.once('drain', res);
  });
}

function runIdArg(lib, positionals, required) {
  const runId = positionals[0];
  if (runId === undefined) {
    if (required) throw new UsageError('a run id is required');
    return undefined;
  }
  if (positionals.length > 1) throw new UsageError(`unexpected argument: ${positionals[1]}`);
  if (!lib.isRunId(runId) && !lib.isSessionId(runId)) {
    throw new UsageError(`invalid run id ${JSON.stringify(runId)}: expected run_ (or ses_ for a session) followed by 1-80 of [A-Za-z0-9_-]`);
  }
  return runId;
}

/** Thrown for a run id that names nothing in the world (most often a typo): exit 1, said on stderr. */
class NoSuchRun extends Error {}

/** A run (or session) must have at least one event: a mistyped id gets a message, not silence. */
async function requireRun(lib, world, runId, label) {
  const first = await lib.listEvents(world, runId, { limit: 1 });
  if (first.length === 0) throw new NoSuchRun(`${runId} has no events in ${label} (see little runs)`);
}

/** Thrown for a change asked for without --yes: exit 2, saying what would change, on stderr. */
class NeedsYes extends Error {}

/** The commands that change a world: they open it as a writer, and run only with --yes. */
const CHANGES = new Set(['import', 'delete', 'prune', 'compact', 'move-artifacts']);

/** The run ids `little delete` names, each once, in the order given. */
function deleteIds(lib, positionals) {
  if (positionals.length === 0) throw new UsageError('a run id is required');
  for (const id of positionals) runIdArg(lib, [id], true);
  return [...new Set(positionals)];
}

/** Milliseconds per unit of a `--ended-before` age. */
const AGE_UNITS = { d: 86_400_000, h: 3_600_000, m: 60_000 };

/**
 * The time `--ended-before` names, as an ISO time: an ISO date or time, or an age `<n>d`,
 * `<n>h` or `<n>m` before `now`. A date that is not in the calendar (2026-02-30) is refused
 * rather than rolled over.
 */
function endedBeforeArg(text, now = Date.now()) {
  const bad = (why) => new UsageError(`invalid --ended-before ${JSON.stringify(text)}: ${why}`);
  const age = /^(\d{1,9})([dhm])$/.exec(text);
  if (age) {
    const t = new Date(now - Number(age[1]) * AGE_UNITS[age[2]]);
    // An ISO time has a year of four digits: an age past the year 0 has none.
    if (Number.isNaN(t.getTime()) || t.getUTCFullYear() < 0) throw bad('that age reaches back before the year 0');
    return t.toISOString();
  }
  const date = /^(\d{4})-(\d{2})-(\d{2})(T.*)?$/.exec(text);
  const t = date ? Date.parse(text) : NaN;
  if (Number.isNaN(t)) throw bad('expected an ISO time (2026-01-31T12:00:00Z or 2026-01-31), or an age such as 30d, 12h or 15m');
  const day = new Date(0);
  day.setUTCFullYear(Number(date[1]), Number(date[2]) - 1, Number(date[3]));
  if (day.getUTCMonth() !== Number(date[2]) - 1 || day.getUTCDate() !== Number(date[3])) throw bad('no such day');
  return new Date(t).toISOString();
}

/** The statuses a `--status S,S` flag names. */
function statusArg(text) {
  const statuses = text.split(',').map((s) => s.trim());
  if (statuses.some((s) => s === '')) throw new UsageError(`invalid --status ${JSON.stringify(text)}: expected status names separated by commas (completed,failed)`);
  return statuses;
}

/** The count a `--limit N` flag names: a positive integer. */
function limitArg(text) {
  const limit = /^\d{1,15}$/.test(text) ? Number(text) : 0;
  if (limit < 1) throw new UsageError(`invalid --limit ${JSON.stringify(text)}: expected a positive integer`);
  return limit;
}

/** The pruneRuns options `little prune`'s flags ask for. */
function pruneOptions(values) {
  if (values['ended-before'] === undefined) {
    throw new UsageError('--ended-before is required: prune deletes only the runs that ended before it (an ISO time, or an age such as 30d)');
  }
  const opts = { endedBefore: endedBeforeArg(values['ended-before']), dryRun: values['dry-run'] === true };
  if (values.status !== undefined) opts.statuses = statusArg(values.status);
  if (values.limit !== undefined) opts.limit = limitArg(values.limit);
  return opts;
}

/** The exportRuns options `little export`'s flags and arguments ask for. */
function exportOptions(lib, values, positionals) {
  const opts = {};
  if (positionals.length > 0) {
    if (values.status !== undefined || values['ended-before'] !== undefined) throw new UsageError('name runs, or give --status / --ended-before, not both');
    for (const id of positionals) runIdArg(lib, [id], true);
    opts.runIds = [...new Set(positionals)];
  }
  if (values.status !== undefined) opts.status = statusArg(values.status);
  if (values['ended-before'] !== undefined) opts.endedBefore = endedBeforeArg(values['ended-before']);
  if (values.out === '') throw new UsageError('--out needs a file name');
  return opts;
}

/** Reports a long transfer's progress on standard error, when that is a terminal. */
function progress(verb) {
  if (!process.stderr.isTTY) return { add() {}, done() {} };
  let bytes = 0;
  let said = Date.now();
  return {
    add(n) {
      bytes += n;
      if (Date.now() - said >= 1000) {
        said = Date.now();
        process.stderr.write(`\rlittle: ${verb} ${(bytes / 1048576).toFixed(1)} MB`);
      }
    },
    done() {
      if (bytes > 0) process.stderr.write('\n');
    },
  };
}

/** `a`, `a and b`, `a, b and c`. */
function listed(items) {
  return items.length < 2 ? items.join('') : `${items.slice(0, -1).join(', ')} and ${items[items.length - 1]}`;
}

/** What a command that changes the world would do, said when it is run without --yes. */
function wouldChange(command, values, positionals, label) {
  switch (command) {
    case 'delete': {
      const ids = [...new Set(positionals)];
      return `would delete ${listed(ids)} from ${label}, with ${ids.length === 1 ? 'its' : 'their'} events and the artifacts no other run refers to; nothing was changed. Pass --yes to delete ${ids.length === 1 ? 'it' : 'them'}`;
    }
    case 'import':
      return `would read the archive ${positionals[0] === undefined ? 'on standard input' : JSON.stringify(positionals[0])} into ${label}; nothing was read or changed. Pass --yes to import it`;
    case 'prune': {
      const o = pruneOptions(values);
      const which = o.statuses === undefined ? 'that has ended' : `that ended as ${o.statuses.join(' or ')}`;
      const most = o.limit === undefined ? 'every run' : `at most ${o.limit} run${o.limit === 1 ? '' : 's'}`;
      return `would delete ${most} in ${label} ${which} and whose last event was recorded before ${o.endedBefore}, with its events and the artifacts no other run refers to; nothing was changed. Pass --dry-run to list them, or --yes to delete them`;
    }
    case 'move-artifacts':
      return `would move the artifacts ${label} stored before it had a bucket into bucket ${values['s3-bucket'] ?? process.env.LITTLE_S3_BUCKET}; nothing was changed. Pass --yes to move them`;
    default:
      return `would rewrite ${label} to give the space deleted runs freed back (a local world's writers wait meanwhile); nothing was changed. Pass --yes to compact it`;
  }
}

/** The size in bytes of a local world's event store: events.db and its write-ahead log. */
function storeBytes(dir) {
  let bytes = 0;
  for (const name of ['events.db', 'events.db-wal']) {
    try {
      bytes += statSync(join(dir, 'events', name)).size;
    } catch (err) {
      if (err.code !== 'ENOENT') throw err;
    }
  }
  return bytes;
}

/** Runs read per page by `little runs`. */
const RUNS_PAGE = 1000;
/** The options of `little runs`, besides the world's. */
const RUNS_OPTIONS = {
  status: { type: 'string' },
  before: { type: 'string' },
  after: { type: 'string' },
  order: { type: 'string' },
  limit: { type: 'string' },
};

/**
 * The queryRuns options `little runs`'s flags ask for, in id order unless --order says otherwise,
 * and how many runs to print at most (Infinity: every run). Times are judged by queryRuns.
 */
function runsOptions(values) {
  const query = { order: values.order ?? 'id' };
  if (!['id', 'newest', 'oldest'].includes(query.order)) throw new UsageError(`invalid --order ${JSON.stringify(values.order)}: expected id, newest or oldest`);
  if (values.status !== undefined) query.status = statusArg(values.status);
  if (values.before !== undefined) query.lastRecordedBefore = values.before;
  if (values.after !== undefined) query.lastRecordedAfter = values.after;
  return { query, limit: values.limit === undefined ? Infinity : limitArg(values.limit) };
}

/** How many runs a world holds, counted a page at a time. */
async function countRuns(lib, world) {
  let count = 0;
  let cursor;
  for (;;) {
    const page = await lib.queryRuns(world, { limit: RUNS_PAGE, ...(cursor === undefined ? {} : { cursor }) });
    count += page.runs.length;
    if (page.cursor === null) return count;
    cursor = page.cursor;
  }
}

/** The options of each command, besides the world's and --help. */
const COMMAND_OPTIONS = {
  verify: { thorough: { type: 'boolean' } },
  runs: RUNS_OPTIONS,
  backup: { to: { type: 'string' } },
  export: { status: { type: 'string' }, 'ended-before': { type: 'string' }, out: { type: 'string' } },
  import: { yes: { type: 'boolean' } },
  delete: { yes: { type: 'boolean' } },
  prune: {
    'ended-before': { type: 'string' },
    status: { type: 'string' },
    limit: { type: 'string' },
    'dry-run': { type: 'boolean' },
    yes: { type: 'boolean' },
  },
  compact: { yes: { type: 'boolean' } },
  'move-artifacts': { yes: { type: 'boolean' } },
};

/**
 * Judges a command's flags and arguments before the world is opened: a bad one is a usage error
 * whatever the world, and the world is not touched.
 */
function checkArgs(lib, command, values, positionals) {
  if (command === 'runs') runsOptions(values);
  if (command === 'prune') {
    pruneOptions(values);
    if (positionals.length > 0) throw new UsageError(`unexpected argument: ${positionals[0]}`);
  }
  if (command === 'delete') deleteIds(lib, positionals);
  if (command === 'export') exportOptions(lib, values, positionals);
  if (command === 'import') {
    if (positionals.length > 1) throw new UsageError(`unexpected argument: ${positionals[1]}`);
    if (positionals[0] !== undefined && !statSync(positionals[0], { throwIfNoEntry: false })?.isFile()) {
      throw new UsageError(`${positionals[0]} is not a file: name an archive that little export wrote, or give none to read standard input`);
    }
  }
  if ((command === 'compact' || command === 'move-artifacts') && positionals.length > 0) throw new UsageError(`unexpected argument: ${positionals[0]}`);
  if (command === 'move-artifacts' && values['s3-bucket'] === undefined && !process.env.LITTLE_S3_BUCKET) {
    throw new UsageError('move-artifacts needs the bucket to move them into: --s3-bucket NAME (or LITTLE_S3_BUCKET)');
  }
  if (command === 'backup') {
    if (values.to === undefined || values.to === '') throw new UsageError('--to DIR is required: the new or empty directory to copy the world into');
    if (positionals.length > 0) throw new UsageError(`unexpected argument: ${positionals[0]}`);
  }
}

const COMMANDS = {
  async events(lib, world, positionals, _values, label) {
    const runId = runIdArg(lib, positionals, true);
    await requireRun(lib, world, runId, label);
    let after = 0;
    for (;;) {
      const page = await lib.listEvents(world, runId, { afterSequence: after, limit: 1000 });
      for (const e of page) await out(lib.canonicalize(e));
      if (page.length < 1000) return 0;
      after = page[page.length - 1].sequence;
    }
  },
  async replay(lib, world, positionals, _values, label) {
    const runId = runIdArg(lib, positionals, true);
    await requireRun(lib, world, runId, label);
    const runEvents = await lib.listRunEvents(world, runId);
    if (runEvents.length === 0) {
      await out(JSON.stringify(await lib.materializeRunState(world, runId), null, 2));
    } else if (runId.startsWith('ses_')) {
      // A session has no fold: what its stream holds, with the status the world's listing gives it.
      const row = (await lib.listRuns(world)).find((r) => r.runId === runId);
      await out(JSON.stringify({ sessionId: runId, vocabulary: 'session-events', eventCount: runEvents.length, status: row?.status }, null, 2));
    } else {
      // A run of run events: the strict replay read, then its fold and cost restore.
      const events = await lib.loadRunEventLogForReplay(world, runId);
      await out(JSON.stringify({ runId, vocabulary: 'run-events', eventCount: events.length, ...lib.foldRunEvents(events) }, null, 2));
    }
    return 0;
  },
  async verify(lib, world, positionals, values, label) {
    const runId = runIdArg(lib, positionals, false);
    if (runId !== undefined) await requireRun(lib, world, runId, label);
    const report = await lib.verifyWorld(world, runId, { thorough: values.thorough === true });
    // The verdict and the problems come first: a reader that leaves early (| head) ends the
    // process, and must not turn a failed check into success.
    if (!report.ok) {
      process.exitCode = 1;
      for (const p of report.problems) {
        const where = [p.runId, p.sequence !== undefined ? `sequence ${p.sequence}` : undefined, p.artifactId].filter(Boolean).join(' ');
        process.stderr.write(`little verify: ${p.kind}${where ? ` (${where})` : ''}: ${p.message}\n`);
      }
    }
    await out(JSON.stringify(report, null, 2));
    return report.ok ? 0 : 1;
  },
  async runs(lib, world, positionals, values) {
    if (positionals.length > 0) throw new UsageError(`unexpected argument: ${positionals[0]}`);
    const { query, limit } = runsOptions(values);
    // A page at a time, each printed before the next is read: output starts at once, and memory
    // holds one page however many runs the world has.
    let left = limit;
    let cursor;
    for (;;) {
      let page;
      try {
        page = await lib.queryRuns(world, { ...query, limit: Math.min(RUNS_PAGE, left), ...(cursor === undefined ? {} : { cursor }) });
      } catch (err) {
        // A time the core refuses (on the first page, before anything is printed) is said as the
        // flag that gave it.
        if (cursor === undefined && err && err.code === 'EVENT_VALIDATION') throw new UsageError(String(err.message).replace(/^lastRecorded(Before|After):/, (_, w) => `--${w.toLowerCase()}:`));
        throw err;
      }
      for (const r of page.runs) await out(JSON.stringify(r));
      left -= page.runs.length;
      if (page.cursor === null || left <= 0) return 0;
      cursor = page.cursor;
    }
  },
  async backup(lib, world, _positionals, values) {
    const dir = resolve(values.to);
    await lib.backupWorld(world, dir);
    // The runs of the copy, which is the world as of one commit.
    const copy = lib.localWorld({ dataDir: dir, readOnly: true });
    let runs;
    try {
      runs = await countRuns(lib, copy);
    } finally {
      await copy.close();
    }
    await out(JSON.stringify({ backup: dir, runs }));
    return 0;
  },
  async export(lib, world, positionals, values) {
    const opts = exportOptions(lib, values, positionals);
    const shown = progress('exported');
    if (values.out === undefined) {
      for await (const piece of lib.exportRuns(world, opts)) {
        shown.add(piece.byteLength);
        if (!process.stdout.write(piece)) await new Promise((res) => process.stdout.once('drain', res));
      }
      shown.done();
      return 0;
    }
    // Written beside the file and renamed over it once whole: FILE is the whole archive or absent.
    const file = resolve(values.out);
    const temp = `${file}.${process.pid}.tmp`;
    const { open, rename, rm } = require('node:fs/promises');
    const handle = await open(temp, 'w');
    let bytes = 0;
    let last;
    try {
      for await (const piece of lib.exportRuns(world, opts)) {
        await handle.write(piece);
        bytes += piece.byteLength;
        last = piece;
        shown.add(piece.byteLength);
      }
      await handle.sync();
      await handle.close();
      await rename(temp, file);
    } catch (err) {
      await handle.close().catch(() => {});
      await rm(temp, { force: true });
      throw err;
    }
    shown.done();
    // The archive's last line counts its runs.
    const tail = Buffer.from(last).toString('utf8').trimEnd();
    const runs = JSON.parse(tail.slice(tail.lastIndexOf('\n') + 1)).runs;
    await out(JSON.stringify({ export: file, runs, bytes }));
    return 0;
  },
  async import(lib, world, positionals) {
    const { createReadStream } = require('node:fs');
    const source = positionals[0] === undefined ? process.stdin : createReadStream(resolve(positionals[0]));
    const shown = progress('imported');
    const counted = (async function* () {
      for await (const piece of source) {
        shown.add(piece.byteLength);
        yield piece;
      }
    })();
    try {
      await out(JSON.stringify(await lib.importRuns(world, counted)));
    } finally {
      shown.done();
    }
    return 0;
  },
  async delete(lib, world, positionals) {
    const deleted = [];
    const said = () => {
      const sum = (k) => deleted.reduce((n, d) => n + d[k], 0);
      return out(JSON.stringify({ deleted, runs: deleted.filter((d) => d.deleted).length, events: sum('events'), artifacts: sum('artifacts'), bytes: sum('bytes') }));
    };
    try {
      for (const runId of deleteIds(lib, positionals)) deleted.push(await lib.deleteRun(world, runId));
    } catch (err) {
      // What was deleted before the failure stays deleted: it is said before the error.
      if (deleted.length > 0) await said();
      throw err;
    }
    await said();
    return 0;
  },
  async prune(lib, world, _positionals, values) {
    let result;
    try {
      result = await lib.pruneRuns(world, pruneOptions(values));
    } catch (err) {
      // A status the core refuses is said as the flag that gave it.
      if (err && err.code === 'EVENT_VALIDATION') throw new UsageError(String(err.message).replace(/^statuses:/, '--status:').replace(/^endedBefore:/, '--ended-before:'));
      throw err;
    }
    await out(JSON.stringify(result));
    return 0;
  },
  async 'move-artifacts'(lib, world) {
    let moved = 0;
    let bytes = 0;
    for (;;) {
      const step = await lib.moveArtifactsToBucket(world, { limit: 100 });
      moved += step.moved;
      bytes += step.bytes;
      if (process.stderr.isTTY && step.left > 0) process.stderr.write(`\rlittle: moved ${moved} artifacts, ${step.left} left`);
      if (step.left === 0 || step.moved === 0) break;
    }
    if (process.stderr.isTTY && moved > 0) process.stderr.write('\n');
    await out(JSON.stringify({ moved, bytes }));
    return 0;
  },
  async compact(lib, world, _positionals, _values, _label, target) {
    if (target.kind !== 'local') {
      await lib.compactWorld(world);
      await out(JSON.stringify({ compacted: true }));
      return 0;
    }
    const bytesBefore = storeBytes(target.dir);
    await lib.compactWorld(world);
    await out(JSON.stringify({ compacted: true, bytesBefore, bytesAfter: storeBytes(target.dir) }));
    return 0;
  },
};

async function main(argv) {
  const [command, ...rest] = argv;
  if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
    await out(HELP.main);
    return command === undefined ? 2 : 0;
  }
  if (command === 'serve') {
    return await require('../server/serve.js').main(rest);
  }
  const run = COMMANDS[command];
  if (!run) throw new UsageError(`unknown command: ${command}`);
  let parsed;
  try {
    parsed = parseArgs({
      args: rest,
      options: {
        ...WORLD_OPTIONS,
        help: { type: 'boolean', short: 'h' },
        ...COMMAND_OPTIONS[command],
      },
      allowPositionals: true,
    });
  } catch (err) {
    throw new UsageError(err.message);
  }
  if (parsed.values.help) {
    await out(HELP[command]);
    return 0;
  }
  const lib = require('..');
  const { values, positionals } = parsed;
  checkArgs(lib, command, values, positionals);
  if (!CHANGES.has(command)) {
    const { world, label } = openWorld(lib, values);
    try {
      return await run(lib, world, positionals, values, label);
    } finally {
      await world.close();
    }
  }
  // A dry run changes nothing: the world is opened read-only, as for the commands that only look.
  if (values['dry-run'] === true && values.yes !== true) {
    const { world, label } = openWorld(lib, values);
    try {
      return await run(lib, world, positionals, values, label);
    } finally {
      await world.close();
    }
  }
  // A change without --yes is refused before the world is opened, so that the refusal cannot
  // change it either, not even by upgrading its schema.
  if (values.yes !== true && values['dry-run'] !== true) {
    throw new NeedsYes(`${command}: ${wouldChange(command, values, positionals, worldTarget(values, process.env, { create: command === 'import' }).label)}`);
  }
  // An import may start a world: into a new data directory, or a new schema.
  const { world, label, target } = await openWritableWorld(lib, values, process.env, { create: command === 'import' });
  try {
    return await run(lib, world, positionals, values, label, target);
  } finally {
    await world.close();
  }
}

// A reader that goes away (`little events run_x | head`) is not an error in itself: the exit code
// is what the command had found so far. Any other failure to write is said in one line.
process.stdout.on('error', (err) => {
  if (err.code === 'EPIPE') process.exit(process.exitCode ?? 0);
  process.stderr.write(`little: cannot write the output: ${err.message}${err.code ? ` [${err.code}]` : ''}\n`);
  process.exit(1);
});

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err) => {
    if (err instanceof NoSuchRun) {
      process.stderr.write(`little: ${err.message}\n`);
      process.exitCode = 1;
    } else if (err instanceof NeedsYes) {
      process.stderr.write(`little ${err.message}\n`);
      process.exitCode = 2;
    } else if (err instanceof UsageError) {
      process.stderr.write(`little: ${err.message}\n(see little --help)\n`);
      process.exitCode = 2;
    } else {
      const code = err && err.code ? ` [${err.code}]` : '';
      process.stderr.write(`little: ${err && err.message ? err.message : String(err)}${code}\n`);
      process.exitCode = 1;
    }
  },
);
