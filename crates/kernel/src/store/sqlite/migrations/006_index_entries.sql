-- Index entries, written in the transaction of the event that sets them (see `IndexEntry`): one
-- row per `(index, key)`, held by the stream that wrote it, listed by key or by value then key.
-- No event before this version wrote one. The fence is raised.
CREATE TABLE index_entries (
    name     TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    value    TEXT    NOT NULL,
    run_id   TEXT    NOT NULL,
    sequence INTEGER NOT NULL,
    PRIMARY KEY (name, key)
) WITHOUT ROWID;
CREATE INDEX index_entries_by_value ON index_entries (name, value, key);
DROP TRIGGER events_writer;
CREATE TRIGGER events_writer BEFORE INSERT ON events
 WHEN NOT little_world_writer(6)
 BEGIN
    SELECT RAISE(ABORT, 'this world was upgraded by a newer version of @little-workflow/world: append with that version');
 END;
