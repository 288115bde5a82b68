-- Fold snapshots, a cache beside the log (see `vocabulary::Materializer`).
CREATE TABLE {s}.fold_snapshots (
    run_id   text   NOT NULL,
    fold_key text   NOT NULL,
    sequence bigint NOT NULL,
    state    text   NOT NULL,
    PRIMARY KEY (run_id, fold_key)
);
