#!/usr/bin/env node
// `little`: look into a world from the command line.
//
//   little events <runId>    one canonical JSON envelope per line (for jq)
//   little replay <runId>    the materialized state as JSON
//   little verify [runId]    re-check the store, density, event ids, payloads, artifact hashes
//   little runs              the runs in the world, one JSON object per line, read a page at a
//                            time (--status, --before, --after, --order, --limit)
//   little serve             the inspector page and a read-only API (Server-Sent Events)
//
// Every command takes --data-dir DIR (default ./.little-workflow), or --database-url URL (or
// LITTLE_DATABASE_URL) and --schema NAME for a PostgreSQL world, and --help.
// Exit codes: 0 ok; 1 problems found, a run id that names no run, a world that cannot be read, or
// a replay refused; 2 a usage error, including a data directory that holds no world.
'use strict';

const { parseArgs } = require('node:util');
const { WORLD_HELP, WORLD_OPTIONS, UsageError, openWorld } = require('../server/world-args.js');

const HELP = {
  main: `usage: little <command> [--data-dir DIR | --database-url URL [--schema NAME]] [args]

commands:
  events <runId>    print a run's events, one canonical JSON envelope per line
  replay <runId>    print a run's materialized state as JSON
  verify [runId]    re-check a run, or the whole world; exit 1 when problems are found
                    (--thorough: the store's full integrity check)
  runs              print the runs in the world, one JSON object per line
                    (--status, --before, --after, --order, --limit: little runs --help)
  serve             serve the inspector and a read-only API of every run: on loopback only,
                    or with a token (little serve --help)

options:
${WORLD_HELP}
  -h, --help            show help for a command

little only reads: it opens the world read-only and never changes it.

exit codes: 0 ok; 1 problems found, a run id that names no run, a world that cannot be read,
or a replay refused; 2 a usage error, including a data directory that holds no world.`,
  events: `usage: little events <runId> [world options]

Prints every committed event of <runId> in sequence order, one canonical JSON envelope per line.`,
  replay: `usage: little replay <runId> [world options]

Folds <runId>'s events and prints the materialized state (status, steps, usage, cost) as JSON.
For a run of run events (run:started, node:completed, ...) it prints the run-event fold instead
(status, nodes, pending gates and media jobs, budget, timeout, restored costs), after the strict
replay read; a session (ses_...) shows its event count and its status (open, or cancelled).`,
  verify: `usage: little verify [runId] [--thorough] [world options]

Re-checks a run (or every run and every artifact): the store's own check of its database (SQLite's
quick_check, or with --thorough its integrity_check, which also compares every index with its
table), dense sequences, event ids, canonical payloads, rows that agree with their envelopes,
stored run-event bodies, referenced artifacts, artifact hashes and sizes.
Prints a JSON report; exits 1 when it finds a problem.`,
  runs: `usage: little runs [--status S,S] [--before ISO] [--after ISO] [--order O] [--limit N]
                  [world options]

Prints each run in the world as one JSON object per line: runId, eventCount, lastSequence,
firstRecordedAt, lastRecordedAt, status, costUsd. Reads the runs a page at a time, printing as it
goes.

  --status S,S          only runs in one of these statuses (pending, running, paused, completed,
                        failed, cancelled; open for a session; unreadable)
  --before ISO          only runs whose last event was recorded before this time
                        (2026-01-31T12:00:00Z)
  --after ISO           only runs whose last event was recorded at or after this time
  --order O             id (the default), newest (by last event, latest first) or oldest
  --limit N             print at most N runs (default: every run)`,
};

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
  if (values.status !== undefined) {
    query.status = values.status.split(',').map((s) => s.trim());
    if (query.status.some((s) => s === '')) throw new UsageError(`invalid --status ${JSON.stringify(values.status)}: expected status names separated by commas (completed,failed)`);
  }
  if (values.before !== undefined) query.lastRecordedBefore = values.before;
  if (values.after !== undefined) query.lastRecordedAfter = values.after;
  let limit = Infinity;
  if (values.limit !== undefined) {
    limit = /^\d{1,15}$/.test(values.limit) ? Number(values.limit) : 0;
    if (limit < 1) throw new UsageError(`invalid --limit ${JSON.stringify(values.limit)}: expected a positive integer`);
  }
  return { query, limit };
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
        ...(command === 'verify' ? { thorough: { type: 'boolean' } } : {}),
        ...(command === 'runs' ? RUNS_OPTIONS : {}),
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
  // Flags are judged before the world is opened: a bad one is a usage error whatever the world.
  if (command === 'runs') runsOptions(parsed.values);
  const lib = require('..');
  const { world, label } = openWorld(lib, parsed.values);
  try {
    return await run(lib, world, parsed.positionals, parsed.values, label);
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
