-- The event log.
CREATE TABLE events (
    run_id          TEXT    NOT NULL,
    sequence        INTEGER NOT NULL CHECK (sequence >= 1),
    event_id        TEXT    NOT NULL,
    type            TEXT    NOT NULL,
    idempotency_key TEXT,
    request_digest  TEXT,
    recorded_at     TEXT    NOT NULL,
    envelope        TEXT    NOT NULL,
    UNIQUE (run_id, sequence)
);
CREATE UNIQUE INDEX events_idempotency
    ON events (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
