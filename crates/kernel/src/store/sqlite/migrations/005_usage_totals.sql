-- Each run's token counts so far, summed over what its events add (a vocabulary's usage), so an
-- append can refuse a call that would take a total past 2^53 - 1, which the materializer cannot
-- sum exactly, without a scan. Rows stored before are summed in by `backfill_usage`. The fence is
-- raised to this version (see `store/sqlite/schema.rs`).
CREATE TABLE usage_totals (
    run_id              TEXT    NOT NULL PRIMARY KEY,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cached_input_tokens INTEGER NOT NULL,
    reasoning_tokens    INTEGER NOT NULL
) WITHOUT ROWID;
DROP TRIGGER events_writer;
CREATE TRIGGER events_writer BEFORE INSERT ON events
 WHEN NOT little_world_writer(5)
 BEGIN
    SELECT RAISE(ABORT, 'this world was upgraded by a newer version of @little-workflow/world: append with that version');
 END;
