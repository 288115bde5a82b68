// The help of `little` and of each of its commands, as `little --help` and `little <command>
// --help` print it.
'use strict';

const { WORLD_HELP } = require('../server/world-args.js');

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
  backup --to DIR   copy a local world into a new or empty directory (PostgreSQL: pg_dump)
  export [runId…]   write runs as an archive, to stdout or --out FILE (--status,
                    --ended-before: little export --help)

commands that change the world (each needs --yes, and prints what it did as one JSON line):
  import [FILE]     read an archive into the world (from stdin by default)
  delete <runId…>   delete runs (or sessions), their events and the artifacts only they use
  prune             delete the runs that ended before a time (--ended-before 30d; --dry-run
                    lists them and changes nothing)
  compact           give the space deleted runs freed back to the operating system
  move-artifacts    move the artifacts stored before the world had a bucket into it (--s3-bucket)

options:
${WORLD_HELP}
  -h, --help            show help for a command

events, replay, verify, runs, serve, backup and export only read: they open the world read-only
and never change it. import, delete, prune, compact and move-artifacts open it as a writer (a
world an earlier version wrote is upgraded); without --yes they change nothing, say what they would
do and exit 2.

exit codes: 0 ok; 1 problems found, a run id that names no run, a world that cannot be read or
changed (such as a run locked by another process), or a replay refused; 2 a usage error,
including a data directory that holds no world, and a change asked for without --yes.`,
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
  backup: `usage: little backup --to DIR [world options]

Copies a local world into DIR, a new or empty directory, while the world may be written: the
event store as of one commit, then the artifacts and outer-loop manifests. The copy is a world of
its own (little verify --data-dir DIR checks it). Reads the world read-only and changes nothing
in it. Prints {"backup":DIR,"runs":N} (N: the runs in the copy). A PostgreSQL world is backed up
with pg_dump instead.`,
  export: `usage: little export [runId…] [--status S,S] [--ended-before WHEN] [--out FILE]
                    [world options]

Writes the runs named (or those of --status, or those that ended before WHEN; every run when none
is given) as an archive: JSON Lines holding each run's envelopes exactly as stored, its index
entries and its artifacts (the format: docs/archive.md in the package). To standard output, or to
FILE, written whole or not at all. Reads the world read-only and changes nothing in it. With
--out, prints one JSON line: {"export":FILE,"runs":N,"bytes":N}.

  --status S,S          only runs in one of these statuses
  --ended-before WHEN   only runs that ended (completed, failed, cancelled, timed_out, or one of
                        --status) before WHEN: an ISO time, or an age such as 30d
  --out FILE            write the archive to FILE instead of standard output`,
  import: `usage: little import [FILE] --yes [world options]

Changes the world: reads an archive that little export wrote (from FILE, or standard input) into
the world, from any kind of world to any other. Every event is kept byte for byte and re-checked
(event ids, digests, dense sequences, the append rules, artifact hashes). A damaged or cut-short
archive is refused with an error naming the run and the line: nothing of that run is written, and
the runs before it stay imported. Importing an archive again changes nothing; a run the world
holds the start of gets the rest; a run whose events differ is refused and left as it is.
Without --yes it changes nothing, says what it would do and exits 2.
Prints one JSON line: {"runs":N,"events":N,"artifacts":N,"unchanged":N} (unchanged: runs the
world held whole already).`,
  delete: `usage: little delete <runId…> --yes [world options]

Changes the world: deletes each run (or session) and everything it owns, its events, index
entries, catalog row and the artifacts it made that no remaining run refers to. All or nothing
for each run. Without --yes it deletes nothing, says what it would delete and exits 2.
Prints one JSON line: {"deleted":[{runId,deleted,events,artifacts,bytes},…],"runs":N,"events":N,
"artifacts":N,"bytes":N}; a run id the world holds nothing of is listed with deleted:false. A run
whose lock another process holds is not deleted: the error is printed and little exits 1 (after
printing what it deleted before it).`,
  prune: `usage: little prune --ended-before WHEN [--status S,S] [--limit N] (--dry-run | --yes)
                   [world options]

Changes the world: deletes, as little delete does, the runs that have ended and whose last
event was recorded before WHEN. A pending, running or paused run is never deleted, however old,
nor one whose lock another process holds. Interrupted, it finishes when run again.

  --ended-before WHEN   an ISO time (2026-01-31T12:00:00Z, or 2026-01-31 for its midnight UTC),
                        or an age before now: <n>d, <n>h or <n>m (30d, 12h, 15m; 0d is now)
  --status S,S          only runs that ended in one of these statuses (completed, failed,
                        cancelled, timed_out; default: all of them)
  --limit N             delete at most N runs
  --dry-run             delete nothing: print the runs it would delete (runIds, oldest first)
  --yes                 delete them

Prints one JSON line: {"runs":N,"events":N,"artifacts":N,"bytes":N}, and runIds in a dry run.
Without --yes or --dry-run it deletes nothing, says what it would delete and exits 2. A dry run
opens the world read-only, as the commands that only look do.`,
  'move-artifacts': `usage: little move-artifacts --yes --s3-bucket NAME [--s3-endpoint URL ...] [world options]

Changes the world: moves the artifacts it stored in its own store (the data directory, or the
database) before it was given a bucket into that bucket, each verified, its object written, then
its manifest, then removed from where it was; cut short anywhere, every artifact stays readable,
and running it again finishes the move. Shows its progress on standard error when that is a
terminal. Without --yes it changes nothing, says what it would do and exits 2.
Prints one JSON line: {"moved":N,"bytes":B}.`,
  compact: `usage: little compact --yes [world options]

Changes the world: gives the space that deleted runs freed back to the operating system. A local
world's event store is rewritten without its free pages, and its writers wait meanwhile; a
PostgreSQL world's tables are vacuumed, and its writers do not wait. Without --yes it changes
nothing, says what it would do and exits 2.
Prints one JSON line: {"compacted":true}, with, for a local world, bytesBefore and bytesAfter:
the size of its event store (events.db and its write-ahead log).`,
};

module.exports = { HELP };
