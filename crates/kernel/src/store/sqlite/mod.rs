//! The local world's event store: bundled SQLite in WAL mode at `<dataDir>/events/events.db`.
//!
//! One writer connection, owned by the world's writer thread, takes `BEGIN IMMEDIATE` for each
//! group of appends, so the sequence it reads with `MAX(sequence)` cannot change under it, even
//! with another process appending to the same file. Readers take connections of their own from a
//! small pool; in WAL mode they never wait for the writer.
//!
//! - `connect`: opening a connection, for writing or for reading only;
//! - `files`: the store's files as the world opened them, and telling that one went;
//! - `schema`: the schema, its version and the migrations;
//! - `writer`: the writer's connection and its transaction;
//! - `checkpoint`: at durability `normal`, the checkpoint thread and the WAL's writeback;
//! - `wal_vfs`: the VFS that gathers the writer's WAL frames into large writes;
//! - `reader`: the pool of read connections.

mod checkpoint;
mod connect;
mod error;
mod files;
mod reader;
pub mod schema;
mod wal_vfs;
mod writer;

pub use files::check_data_dir_length;
pub use reader::SqliteReader;
pub use writer::SqliteWriter;

use crate::error::{Result, WorldError};
use checkpoint::Checkpointer;
use connect::{cannot_write, connect_as, enable_wal, on, read_only_access, Access};
use files::{beside, check_path_length, OpenedFile, StoreFiles};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::path::Path;

pub use crate::store::Durability;

/// Open (creating if needed) the event store of `data_dir`.
pub fn open(data_dir: &Path, durability: Durability) -> Result<(SqliteWriter, SqliteReader)> {
    let dir = data_dir.join("events");
    let path = dir.join("events.db");
    check_path_length(&path)?;
    crate::durable::create_dir_synced(&dir, "the events directory")?;
    let mut conn = connect_as(&path, Access::ReadWrite, true)?;
    let checkpointer = prepare_writer(&mut conn, &path, durability).map_err(|e| on(&conn, e))?;
    // All three exist now (the connection has read the database in WAL mode); SQLite keeps the
    // -shm and the -wal beside the database's real path, the target of a symlinked database.
    let db = OpenedFile::at(&path)?;
    let files = std::sync::Arc::new(StoreFiles::new(vec![
        db.clone(),
        OpenedFile::at(&beside(&db.path, "-shm"))?,
        OpenedFile::at(&beside(&db.path, "-wal"))?,
    ]));
    let mut reader = SqliteReader::new(path.clone(), Access::ReadWrite);
    reader.identity = files.clone();
    Ok((
        SqliteWriter {
            conn: std::mem::ManuallyDrop::new(conn),
            tails: HashMap::new(),
            data_version: None,
            files,
            damage: None,
            checkpointer,
        },
        reader,
    ))
}

/// Check, upgrade and configure the writer's connection; at `normal`, start its checkpoint thread.
fn prepare_writer(conn: &mut Connection, path: &Path, durability: Durability) -> Result<Option<Checkpointer>> {
    let shown = path.display().to_string();
    schema::check(conn, &shown)?;
    schema::fence_writer(conn)?;
    let mode = enable_wal(conn)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(WorldError::Path {
            message: format!("{shown}: cannot use WAL mode (journal_mode is {mode})"),
        });
    }
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)
        .map_err(|e| WorldError::sqlite("setting synchronous", e))?;
    schema::migrate(conn, &shown)?;
    Ok(match durability {
        Durability::Normal => Some(Checkpointer::start(conn, path)?),
        Durability::Full => None,
    })
}

/// Open the event store of `data_dir` for reading only: nothing is created, upgraded or written,
/// so a world written by an earlier version stays openable by it. The store must hold a world of
/// this build's schema version or an earlier one (reads use the table every version has).
pub fn open_read_only(data_dir: &Path) -> Result<SqliteReader> {
    let path = data_dir.join("events").join("events.db");
    check_path_length(&path)?;
    if !path.is_file() {
        return Err(WorldError::Path {
            message: format!("no world at {}: {} does not exist", data_dir.display(), path.display()),
        });
    }
    let access = read_only_access(&path);
    let mut reader = SqliteReader::new(path.clone(), access);
    reader.identity = std::sync::Arc::new(StoreFiles::new(vec![OpenedFile::at(&path)?]));
    let shown = path.display().to_string();
    let version = reader.with_conn(|conn| schema::check(conn, &shown)).map_err(|e| match e {
        // SQLite says only that it cannot write: the reason is that the WAL holds commits that
        // must be recovered into the store's index (the -shm), which takes write access.
        WorldError::Sqlite { source, .. }
            if access == Access::ReadOnly && source.downcast_ref::<rusqlite::Error>().is_some_and(cannot_write) => WorldError::Path {
            message: format!(
                "{shown} cannot be read without write access to {}: its WAL holds commits that no process has open, and \
                 reading them takes recovering them, which writes the -shm beside it. Open the world once where it can be \
                 written (any little command there does), and it can be read from here",
                path.parent().unwrap_or(&path).display()
            ),
        },
        e => e,
    })?;
    if version == 0 {
        return Err(WorldError::Path {
            message: format!("{shown} holds no world yet: open it once for writing to create one"),
        });
    }
    Ok(reader)
}

/// Run a statement that takes no parameters and returns no rows, such as `COMMIT`.
fn exec(conn: &Connection, sql: &str, what: &str) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute([]))
        .map(|_| ())
        .map_err(|e| WorldError::sqlite(what.to_string(), e))
}

fn terminal(conn: &Connection, run_id: &str, node: &str) -> Result<Option<u64>> {
    conn.prepare_cached("SELECT sequence FROM terminals WHERE run_id = ?1 AND node_id = ?2")
        .and_then(|mut s| s.query_row(params![run_id, node], |r| r.get::<_, i64>(0)).optional())
        .map(|v| v.map(|s| s as u64))
        .map_err(|e| WorldError::sqlite("looking up a terminal event", e))
}

fn last_sequence(conn: &Connection, run_id: &str) -> Result<u64> {
    conn.prepare_cached("SELECT MAX(sequence) FROM events WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get::<_, Option<i64>>(0)))
        .map(|v| v.unwrap_or(0) as u64)
        .map_err(|e| WorldError::sqlite("reading the last sequence", e))
}

#[cfg(test)]
mod tests;
