-- The manifests of artifacts whose bytes are in an object store (see `artifacts::objects`), by
-- run for deleting a run's.
CREATE TABLE {s}.artifact_objects (
    artifact_id text   PRIMARY KEY,
    run_id      text   NOT NULL,
    manifest    text   NOT NULL,
    size_bytes  bigint NOT NULL
);
CREATE INDEX artifact_objects_by_run ON {s}.artifact_objects (run_id);
