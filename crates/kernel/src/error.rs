//! The one error type of the world.
//!
//! Every failure the package can report is a variant of [`WorldError`]. Each variant carries the
//! context a person needs to act on it (run id, sequence, field path, artifact id) and maps to a
//! stable string [`code`](WorldError::code) that the binding hands to JavaScript, where `world.ts`
//! turns it into the matching error class. Messages never include payload values, so a secret in
//! a payload can never leak through an error.

use std::path::PathBuf;
use std::sync::Arc;

/// Result alias used throughout the core.
pub type Result<T, E = WorldError> = std::result::Result<T, E>;

/// Everything that can go wrong in the world, one variant per contract error (plus I/O).
#[derive(Debug, Clone, thiserror::Error)]
pub enum WorldError {
    /// A run id, session id, data directory or other path-like input is malformed, or the data
    /// directory is not a world this version can open.
    #[error("{message}")]
    Path { message: String },

    /// A call was made on a world after `close()`.
    #[error("the world is closed")]
    Closed,

    /// An append (or other input) failed validation. `path` names the offending field, such as
    /// `payload.response.usage.inputTokens`.
    #[error("{path}: {message}")]
    Validation {
        run_id: Option<String>,
        path: String,
        message: String,
    },

    /// An idempotency key was reused for different canonical content.
    #[error(
        "appendIdempotencyKey {key:?} of run {run_id} was already used at sequence {sequence} \
         for different content (stored digest {stored_digest}, this request {request_digest})"
    )]
    IdempotencyConflict {
        run_id: String,
        key: String,
        sequence: u64,
        stored_digest: String,
        request_digest: String,
    },

    /// An append said which sequence it expected its run to end at, and the run ends elsewhere:
    /// another writer appended first.
    #[error("{run_id} ends at sequence {last}, not at the expected {expected}: another append came first")]
    SequenceConflict { run_id: String, expected: u64, last: u64 },

    /// An archive holds a run that the world holds too, with other events: importing it would
    /// change what the world recorded.
    #[error("{run_id} differs from the archive's at sequence {sequence}: the world keeps its own run, and the archive's is not imported")]
    ImportConflict { run_id: String, sequence: u64 },

    /// An append wrote or removed an index entry that another run holds.
    #[error("index {index:?} entry {key:?} is held by {holder}")]
    IndexConflict {
        run_id: String,
        index: String,
        key: String,
        holder: String,
    },

    /// No artifact with this id exists in the world.
    #[error("artifact {artifact_id} not found{}", referenced_at(path.as_deref()))]
    ArtifactNotFound {
        artifact_id: String,
        /// The run of the append whose payload refers to it, if one does.
        run_id: Option<String>,
        /// Where that payload refers to it (`payload.x`).
        path: Option<String>,
    },

    /// A blob's bytes do not hash to the manifest's `sha256`.
    #[error("artifact {artifact_id}: blob hashes to {actual}, manifest says {expected}")]
    ArtifactHashMismatch {
        artifact_id: String,
        expected: String,
        actual: String,
    },

    /// A manifest is unreadable, or disagrees with its blob (size) or its own id.
    #[error("artifact {artifact_id}: {reason}")]
    ArtifactManifestCorrupt { artifact_id: String, reason: String },

    /// The event log is damaged: a hole in a sequence, an id that does not match its row, a
    /// store that is not a database, a known event whose stored body does not parse.
    #[error("event log corrupt{}: {reason}", location(run_id, sequence))]
    EventLogCorrupt {
        run_id: Option<String>,
        sequence: Option<u64>,
        reason: String,
    },

    /// Another integrity failure (the base class of the three above in JavaScript).
    #[error("runtime integrity: {reason}")]
    RuntimeIntegrity { reason: String },

    /// An artifact whose manifest is published has no blob (a `RuntimeIntegrityError` that names
    /// the artifact and the missing file).
    #[error("runtime integrity: artifact {artifact_id}: its manifest exists but its blob {} is missing", path.display())]
    ArtifactBlobMissing { artifact_id: String, path: PathBuf },

    /// A lock is held by a live owner and `waitMs` ran out.
    #[error("{name} is locked {holder}")]
    RunLocked {
        name: String,
        /// The owner's pid; 0 when its owner file is not written yet or unreadable.
        owner_pid: u32,
        /// Who holds it, for the message: `by pid 123 since …`, or why that is not known.
        holder: String,
    },

    /// An outer-loop manifest write carried another `inputHash` than the stored one.
    #[error("outer loop {outer_loop_id}: inputHash {given} does not match the stored {stored}")]
    OuterLoopInputMismatch {
        outer_loop_id: String,
        stored: String,
        given: String,
    },

    /// A replay read found rows it would have to drop.
    #[error("replay of {run_id} refused: {reason}")]
    ReplayRefused {
        run_id: String,
        reason: String,
        sequences: Vec<u64>,
    },

    /// The file system failed.
    #[error("{context}{}: {source}", .path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Io {
        context: String,
        path: Option<PathBuf>,
        #[source]
        source: Arc<std::io::Error>,
    },

    /// The PostgreSQL server failed, refused, or could not be reached. Names the server (host,
    /// port, database), never the password.
    #[error("{context} ({server}): {message}")]
    Database {
        context: String,
        server: Box<Server>,
        message: String,
        /// The server's SQLSTATE, when it answered with an error.
        sqlstate: Option<String>,
    },

    /// An object store (S3, R2, MinIO) failed, refused, or could not be reached. Names the
    /// endpoint, bucket and key, never a credential.
    #[error("{context} (bucket {bucket} at {endpoint}, key {key}): {message}")]
    ObjectStore {
        context: String,
        endpoint: String,
        bucket: String,
        key: String,
        message: String,
    },

    /// SQLite failed in a way that is not corruption (made by `store::sqlite`, which carries
    /// SQLite's own error as the source).
    #[error("{context}{}: {source}{}", .path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default(), .os.as_ref().map(|o| format!(" ({o})")).unwrap_or_default())]
    Sqlite {
        context: String,
        /// The database file, once known (see [`WorldError::in_database`]).
        path: Option<PathBuf>,
        /// What the operating system said, when SQLite's own message ("disk I/O error", "unable
        /// to open database file") hides it.
        os: Option<String>,
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

fn location(run_id: &Option<String>, sequence: &Option<u64>) -> String {
    match (run_id, sequence) {
        (Some(r), Some(s)) => format!(" ({r} sequence {s})"),
        (Some(r), None) => format!(" ({r})"),
        (None, Some(s)) => format!(" (sequence {s})"),
        (None, None) => String::new(),
    }
}

/// Where a world's database server is, as messages name it: never with the password.
#[derive(Debug, Clone)]
pub struct Server {
    pub host: String,
    pub port: u16,
    pub database: String,
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}/{}", self.host, self.port, self.database)
    }
}

impl WorldError {
    /// The stable code JavaScript sees as `error.code`.
    pub fn code(&self) -> &'static str {
        match self {
            WorldError::Path { .. } => "WORLD_PATH",
            WorldError::Closed => "WORLD_CLOSED",
            WorldError::Validation { .. } => "EVENT_VALIDATION",
            WorldError::IdempotencyConflict { .. } => "EVENT_APPEND_IDEMPOTENCY_CONFLICT",
            WorldError::SequenceConflict { .. } | WorldError::ImportConflict { .. } => "EVENT_SEQUENCE_CONFLICT",
            WorldError::IndexConflict { .. } => "INDEX_ENTRY_CONFLICT",
            WorldError::ArtifactNotFound { .. } => "ARTIFACT_NOT_FOUND",
            WorldError::ArtifactHashMismatch { .. } => "ARTIFACT_HASH_MISMATCH",
            WorldError::ArtifactManifestCorrupt { .. } => "ARTIFACT_MANIFEST_CORRUPT",
            WorldError::EventLogCorrupt { .. } => "EVENT_LOG_CORRUPT",
            WorldError::RuntimeIntegrity { .. } | WorldError::ArtifactBlobMissing { .. } => "RUNTIME_INTEGRITY",
            WorldError::RunLocked { .. } => "RUN_LOCKED",
            WorldError::OuterLoopInputMismatch { .. } => "OUTER_LOOP_INPUT_MISMATCH",
            WorldError::ReplayRefused { .. } => "REPLAY_REFUSED",
            WorldError::Io { .. }
            | WorldError::Sqlite { .. }
            | WorldError::Database { .. }
            | WorldError::ObjectStore { .. } => "WORLD_IO",
        }
    }

    /// Structured context for JavaScript (`error.runId`, `error.path`, …), as a JSON object.
    pub fn details(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            WorldError::Validation { run_id, path, .. } => json!({ "runId": run_id, "path": path }),
            WorldError::IdempotencyConflict {
                run_id, key, sequence, ..
            } => json!({ "runId": run_id, "appendIdempotencyKey": key, "sequence": sequence }),
            WorldError::SequenceConflict { run_id, expected, last } => {
                json!({ "runId": run_id, "expectedSequence": expected, "lastSequence": last })
            }
            WorldError::IndexConflict {
                run_id,
                index,
                key,
                holder,
            } => json!({ "runId": run_id, "index": index, "key": key, "holderRunId": holder }),
            WorldError::ArtifactNotFound {
                artifact_id,
                run_id,
                path: Some(path),
            } => json!({ "artifactId": artifact_id, "runId": run_id, "path": path }),
            WorldError::ArtifactNotFound { artifact_id, .. }
            | WorldError::ArtifactHashMismatch { artifact_id, .. }
            | WorldError::ArtifactManifestCorrupt { artifact_id, .. } => {
                json!({ "artifactId": artifact_id })
            }
            WorldError::EventLogCorrupt { run_id, sequence, .. } => json!({ "runId": run_id, "sequence": sequence }),
            WorldError::ImportConflict { run_id, sequence } => json!({ "runId": run_id, "sequence": sequence }),
            WorldError::RunLocked { name, owner_pid, .. } => json!({ "lockName": name, "ownerPid": owner_pid }),
            WorldError::OuterLoopInputMismatch { outer_loop_id, .. } => {
                json!({ "outerLoopId": outer_loop_id })
            }
            WorldError::ReplayRefused { run_id, sequences, .. } => json!({ "runId": run_id, "sequences": sequences }),
            WorldError::Io { path, .. } | WorldError::Sqlite { path, .. } => json!({ "path": path }),
            WorldError::ArtifactBlobMissing { artifact_id, path } => json!({ "artifactId": artifact_id, "path": path }),
            WorldError::ObjectStore {
                endpoint, bucket, key, ..
            } => {
                json!({ "endpoint": endpoint, "bucket": bucket, "key": key })
            }
            WorldError::Database { server, sqlstate, .. } => json!({
                "host": server.host, "port": server.port, "database": server.database, "sqlstate": sqlstate
            }),
            _ => json!({}),
        }
    }

    /// A validation error at `path`.
    pub fn validation(path: impl Into<String>, message: impl Into<String>) -> Self {
        WorldError::Validation {
            run_id: None,
            path: path.into(),
            message: message.into(),
        }
    }

    /// Attach the run id to a validation error that does not carry one yet.
    pub fn for_run(mut self, run: &str) -> Self {
        if let WorldError::Validation { run_id, .. } | WorldError::ArtifactNotFound { run_id, .. } = &mut self {
            if run_id.is_none() {
                *run_id = Some(run.to_string());
            }
        }
        self
    }

    /// Whether this is an error of the moment on this machine (out of file descriptors or memory,
    /// interrupted, busy) rather than of what was read: the same read may well succeed later.
    pub fn is_transient(&self) -> bool {
        let WorldError::Io { source, .. } = self else {
            return false;
        };
        matches!(
            source.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EINTR | libc::EAGAIN | libc::EBUSY)
        )
    }

    /// An I/O error with what was being done and where.
    pub fn io(context: impl Into<String>, path: Option<PathBuf>, source: std::io::Error) -> Self {
        WorldError::Io {
            context: context.into(),
            path,
            source: Arc::new(source),
        }
    }
}

/// `" (referenced at payload.x)"` for an artifact error found in a payload, else nothing.
fn referenced_at(path: Option<&str>) -> String {
    path.map(|p| format!(" (referenced at {p})")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable() {
        assert_eq!(WorldError::Closed.code(), "WORLD_CLOSED");
        assert_eq!(WorldError::validation("payload.a", "bad").code(), "EVENT_VALIDATION");
        let e = WorldError::validation("payload.a[3].b", "must be a string").for_run("run_x");
        assert_eq!(e.to_string(), "payload.a[3].b: must be a string");
        assert_eq!(e.details()["runId"], "run_x");
    }
}
