-- The runs catalog (see `crate::catalog`): one row per stream, written in the transaction of its
-- events, read a page at a time by last `recordedAt` (with or without a status) or by id. Streams
-- stored before are filled in by `backfill_catalog`. The fence is raised.
CREATE TABLE runs (
    run_id            TEXT    NOT NULL PRIMARY KEY,
    last_sequence     INTEGER NOT NULL,
    first_recorded_at TEXT    NOT NULL,
    last_recorded_at  TEXT    NOT NULL,
    status            TEXT    NOT NULL
) WITHOUT ROWID;
CREATE INDEX runs_by_time ON runs (last_recorded_at, run_id);
CREATE INDEX runs_by_status ON runs (status, last_recorded_at, run_id);
DROP TRIGGER events_writer;
CREATE TRIGGER events_writer BEFORE INSERT ON events
 WHEN NOT little_world_writer(7)
 BEGIN
    SELECT RAISE(ABORT, 'this world was upgraded by a newer version of @little-workflow/world: append with that version');
 END;
