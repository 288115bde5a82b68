-- The runs catalog (see `crate::catalog`): each stream's status beside its last sequence and
-- times, written by the same upsert, and read a page at a time by last `recordedAt` (with or
-- without a status) or by id, compared by bytes (`C`) as SQLite and the virtual store compare
-- them. Streams stored before get their status from `backfill_catalog`. `written_after` is the
-- last sequence the stream's latest group started after: the upsert refuses (by the check on
-- `last_sequence`) a group that started after another, as one from a writer's memory of a stream
-- since deleted would.
ALTER TABLE {s}.runs ADD COLUMN status text;
ALTER TABLE {s}.runs ADD COLUMN written_after bigint;
ALTER TABLE {s}.runs ADD CONSTRAINT runs_last_sequence_known CHECK (last_sequence >= 0);
ALTER TABLE {s}.runs ALTER COLUMN run_id TYPE text COLLATE "C";
ALTER TABLE {s}.runs ALTER COLUMN last_recorded_at TYPE text COLLATE "C";
CREATE INDEX runs_by_time ON {s}.runs (last_recorded_at, run_id) WHERE last_sequence > 0;
CREATE INDEX runs_by_status ON {s}.runs (status, last_recorded_at, run_id) WHERE last_sequence > 0;
