-- What each stream has committed and not released of each model's budget estimates, so an append
-- can refuse a release of more than that, which the cost restore would read as a damaged log,
-- without a scan. Only the open amount is kept: the checks keep it within 0 ..= 2^53 - 1, where
-- gross sums could overflow. Rows stored before are summed in by `backfill_estimates`.
CREATE TABLE estimates (
    run_id TEXT    NOT NULL,
    model  TEXT    NOT NULL,
    open   INTEGER NOT NULL,
    PRIMARY KEY (run_id, model)
) WITHOUT ROWID;
