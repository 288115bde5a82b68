-- The first tables.
CREATE TABLE {s}.runs (
    run_id            text   PRIMARY KEY,
    last_sequence     bigint NOT NULL DEFAULT 0,
    first_recorded_at text,
    last_recorded_at  text,
    input_tokens      bigint NOT NULL DEFAULT 0,
    output_tokens     bigint NOT NULL DEFAULT 0,
    cached_tokens     bigint NOT NULL DEFAULT 0,
    reasoning_tokens  bigint NOT NULL DEFAULT 0
);
CREATE TABLE {s}.events (
    run_id          text   NOT NULL,
    sequence        bigint NOT NULL CHECK (sequence >= 1),
    event_id        text   NOT NULL,
    type            text   NOT NULL,
    idempotency_key text,
    request_digest  text,
    recorded_at     text   NOT NULL,
    envelope        text   NOT NULL,
    xid             xid8   NOT NULL DEFAULT pg_current_xact_id(),
    PRIMARY KEY (run_id, sequence)
);
CREATE UNIQUE INDEX events_idempotency ON {s}.events (run_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_xid ON {s}.events (xid);
CREATE TABLE {s}.terminals (
    run_id   text   NOT NULL,
    node_id  text   NOT NULL,
    sequence bigint NOT NULL,
    type     text   NOT NULL,
    PRIMARY KEY (run_id, node_id)
);
CREATE TABLE {s}.estimates (
    run_id text   NOT NULL,
    model  text   NOT NULL,
    open   bigint NOT NULL CHECK (open >= 0),
    PRIMARY KEY (run_id, model)
);
CREATE TABLE {s}.artifacts (
    artifact_id text   PRIMARY KEY,
    manifest    text   NOT NULL,
    size_bytes  bigint NOT NULL,
    chunks      int    NOT NULL
);
CREATE TABLE {s}.artifact_chunks (
    artifact_id text  NOT NULL,
    idx         int   NOT NULL,
    data        bytea NOT NULL,
    PRIMARY KEY (artifact_id, idx)
);
ALTER TABLE {s}.artifact_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
CREATE TABLE {s}.leases (
    name        text        PRIMARY KEY,
    owner       text,
    fence       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    holder_pid  int,
    holder_host text,
    taken_at    timestamptz
);
CREATE TABLE {s}.outer_loops (
    outer_loop_id text PRIMARY KEY,
    manifest      text NOT NULL
);
