-- The ends of streams and of their nodes (a vocabulary's terminal effects), one row per ended
-- stream (node_id '') or node, so an append can refuse what follows a stream's end, or a node's
-- second end, without a scan. The
-- primary key is the backstop. Rows stored before this version are backfilled by
-- `backfill_terminals`.
CREATE TABLE terminals (
    run_id   TEXT    NOT NULL,
    node_id  TEXT    NOT NULL,
    sequence INTEGER NOT NULL,
    type     TEXT    NOT NULL,
    PRIMARY KEY (run_id, node_id)
) WITHOUT ROWID;
