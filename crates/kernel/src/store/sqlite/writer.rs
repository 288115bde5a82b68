//! The writer's connection and its write transaction.

use super::checkpoint::{wal_index, Checkpointer, CHECKPOINT_INLINE_AT};
use super::connect::{on, BUSY_TIMEOUT};
use super::files::{OpenedFile, StoreFiles, WAL};
use super::reader::find_by_key;
use super::{exec, last_sequence, schema, terminal};
use crate::catalog::{CatalogNote, CatalogStage, CatalogWrite};
use crate::error::{Result, WorldError};
use crate::store::{KeyedEvent, LogTx, LogWriter, RowRef, Scope};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The writer's connection.
pub struct SqliteWriter {
    /// Closed when the writer is dropped, unless the store's files were replaced in a way that
    /// makes closing it unsafe (see [`Damage::Unsafe`]).
    pub(super) conn: std::mem::ManuallyDrop<Connection>,
    /// What this writer knows of each run's tail: the last sequence, and the run's terminal event.
    /// Valid only while no other connection has committed since this writer's last commit, which
    /// `PRAGMA data_version` tells at the start of each transaction; otherwise it is cleared.
    pub(super) tails: HashMap<String, Tail>,
    pub(super) data_version: Option<i64>,
    /// The database, its `-shm` and its `-wal` (see [`SqliteWriter::check_files`]), shared with
    /// the readers.
    pub(super) files: std::sync::Arc<StoreFiles>,
    /// Set once a file of the store was found deleted or replaced, with the index in `files` of
    /// the first found: nothing is written any more.
    pub(super) damage: Option<(Damage, usize)>,
    pub(super) checkpointer: Option<Checkpointer>,
}

/// What the writer could make safe once a file of its store was deleted or replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Damage {
    /// Only the WAL was: what it held was checkpointed into the database through this writer's
    /// connection, which still reads the deleted WAL, so every commit is in `events.db`.
    Rescued,
    /// The database or its `-shm` was, or the checkpoint failed. Closing the connection could
    /// make SQLite, taking it for the store's last connection, checkpoint into a file no path
    /// leads to and delete the `-wal` and `-shm` now at the paths, which another process may be
    /// using: the connection is left open until the process ends instead.
    Unsafe,
}

/// A run's last sequence and the sequence of its terminal event, if it has one.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tail {
    pub(super) last: u64,
    pub(super) ended: Option<u64>,
}

/// Most runs whose tails the writer remembers; past this it starts over.
pub(super) const MAX_TAILS: usize = 100_000;

impl SqliteWriter {
    pub(super) fn exec(&self, sql: &str, what: &str) -> Result<()> {
        exec(&self.conn, sql, what)
    }

    /// Refuse to write once the database, its `-shm` or its `-wal` has been deleted (or replaced)
    /// while open: a cleaner of old files, an `rm -rf` of the data directory. SQLite would carry
    /// on: commits would go to a file no path leads to any more, lost at close, and other
    /// processes, creating the files anew, would hand out the same sequences (see
    /// [`StoreFiles`] for how each is looked at). Checked at the start of each transaction,
    /// under the write lock: a file deleted in the microseconds before its commit is found by
    /// the next transaction, or the close, and the WAL then rescued (see [`Damage`]). Once this
    /// has failed it keeps failing.
    pub(super) fn check_files(&mut self) -> Result<()> {
        let (damage, changed) = match self.damage {
            Some(d) => d,
            None => match self.files.changed() {
                None => return Ok(()),
                Some(i) => (self.secure(i), i),
            },
        };
        let consequence = if damage == Damage::Rescued {
            ", so appends would be lost and other processes would not see them (every append committed before \
             was copied into the database); close the world before appending"
        } else {
            ", so appends would be lost and other processes would not see them; close the world (and restore the \
             data directory) before appending"
        };
        Err(self.files.files[changed].damaged("appending to the event store", consequence))
    }

    /// A file of the store, `self.files[changed]`, was deleted or replaced: stop writing, and
    /// where only the WAL was, checkpoint it into the database (see [`Damage::Rescued`]).
    pub(super) fn secure(&mut self, changed: usize) -> Damage {
        let wal_only = changed == WAL && self.files.files[..WAL].iter().all(OpenedFile::is_unchanged);
        let rescued = wal_only && {
            let _ = self.exec("ROLLBACK", "rolling back");
            // Every frame of the WAL this connection reads is copied into the database, which is
            // synced (busy is 0 when the checkpoint could finish, and log equals checkpointed).
            match self.conn.query_row("PRAGMA wal_checkpoint(FULL)", [], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            }) {
                Ok((busy, log, done)) => busy == 0 && log == done,
                Err(_) => false,
            }
        };
        let damage = if rescued { Damage::Rescued } else { Damage::Unsafe };
        self.damage = Some((damage, changed));
        self.tails.clear();
        self.data_version = None;
        damage
    }

    /// Refuse to write once a later version has upgraded the world while this writer had it open:
    /// it would append without keeping the tables it does not know. The schema's trigger fences
    /// writers of earlier schemas; this one runs no triggers (see [`schema::fence_writer`]).
    pub(super) fn check_not_upgraded(&self) -> Result<()> {
        match schema::newer_than_this_build(&self.conn)? {
            None => Ok(()),
            Some(version) => Err(WorldError::Path {
                message: format!(
                    "{}: the world was upgraded by a newer version of @little-workflow/world (to schema {version}; this \
                     version writes schema {}) while this one had it open, so this version may not append to it any \
                     more; append with that version",
                    self.conn.path().unwrap_or("the event store"),
                    schema::SCHEMA_VERSION
                ),
            }),
        }
    }

    pub(super) fn data_version(&self) -> Result<i64> {
        self.conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(|e| WorldError::sqlite("reading PRAGMA data_version", e))
    }
}

/// WAL pages short of [`CHECKPOINT_INLINE_AT`] past which a transaction is not committed now
/// (see [`SqliteWriter::transaction_if_immediate`]): more than a transaction of one small append can add,
/// so that its commit never checkpoints inside itself.
pub(super) const NOW_MARGIN: i32 = 256;

impl LogWriter for SqliteWriter {
    fn delete_streams(&mut self, runs: &[&str]) -> Result<Vec<u64>> {
        self.delete_rows(runs).map_err(|e| on(&self.conn, e))
    }

    /// `VACUUM` on the writer's connection, then the WAL truncated: the database is rewritten
    /// without its free pages, holding the write lock meanwhile, so other writers wait.
    fn compact(&mut self) -> Result<()> {
        self.exec("VACUUM", "compacting the event store")
            .and_then(|()| {
                self.conn
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    .map_err(|e| WorldError::sqlite("truncating the WAL", e))
            })
            .map_err(|e| on(&self.conn, e))?;
        self.tails.clear();
        self.data_version = None;
        Ok(())
    }

    fn transaction(&mut self, _scope: &Scope<'_>, body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Result<()> {
        self.exec("BEGIN IMMEDIATE", "beginning a write transaction")
            .and_then(|()| self.begun_version())
            .and_then(|version| self.write(body, version))
            .map_err(|e| on(&self.conn, e))
    }

    /// Only at durability `normal`, where a commit does not sync (the checkpoint thread does), when
    /// no other connection holds the write lock (asked once, without the busy timeout), and when
    /// the wal-index says, under that lock, that the commit neither writes a WAL's first header
    /// (SQLite syncs it, at `normal` too: into an empty WAL, or starting the WAL over once a
    /// checkpoint has copied all of it) nor checkpoints inside itself (near
    /// [`CHECKPOINT_INLINE_AT`]). The WAL's size is read there, not taken from what this
    /// connection's hook was told, since other connections commit too.
    fn transaction_if_immediate(
        &mut self,
        _scope: &Scope<'_>,
        body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>,
    ) -> Option<Result<()>> {
        let wal = self.checkpointer.as_ref()?.wal.clone();
        self.conn.busy_timeout(Duration::ZERO).ok()?;
        let begun = self.exec("BEGIN IMMEDIATE", "beginning a write transaction");
        if let Err(e) = self.conn.busy_timeout(BUSY_TIMEOUT) {
            let _ = self.exec("ROLLBACK", "rolling back");
            return Some(Err(on(&self.conn, WorldError::sqlite("setting busy_timeout", e))));
        }
        // Busy, or failing in a way the writer's thread will meet again and report.
        begun.ok()?;
        // The WAL's size holds still under the write lock; the part checkpointed only grows, and
        // the WAL starts over only if it was all checkpointed when this transaction began.
        let quiet = match wal_index(&self.conn) {
            Some((frames, checkpointed)) => {
                frames > 0 && checkpointed < frames && frames < (CHECKPOINT_INLINE_AT - NOW_MARGIN) as u32
            }
            None => false,
        };
        if !quiet {
            let _ = self.exec("ROLLBACK", "rolling back");
            return None;
        }
        let version = self.begun_version().ok()?;
        wal.now.store(true, Ordering::Relaxed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.write(body, version)));
        wal.now.store(false, Ordering::Relaxed);
        Some(
            result
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
                .map_err(|e| on(&self.conn, e)),
        )
    }
}

impl SqliteWriter {
    /// [`LogWriter::delete_streams`]: one `IMMEDIATE` transaction deleting the stream's rows from
    /// every table, after the checks an append's transaction makes (the files, a newer version's
    /// upgrade).
    fn delete_rows(&mut self, runs: &[&str]) -> Result<Vec<u64>> {
        self.exec("BEGIN IMMEDIATE", "beginning a deletion")?;
        let version = self.begun_version()?;
        if self.check_begun(version)? {
            self.tails.clear();
        }
        let deleted = (|| -> rusqlite::Result<Vec<u64>> {
            let mut removed = Vec::with_capacity(runs.len());
            for run_id in runs {
                removed.push(
                    self.conn
                        .prepare_cached("DELETE FROM events WHERE run_id = ?1")?
                        .execute([run_id])? as u64,
                );
                for table in ["runs", "terminals", "estimates", "usage_totals", "index_entries"] {
                    self.conn
                        .prepare_cached(&format!("DELETE FROM {table} WHERE run_id = ?1"))?
                        .execute([run_id])?;
                }
            }
            Ok(removed)
        })();
        let committed = deleted
            .map_err(|e| WorldError::sqlite("deleting a run", e))
            .and_then(|n| self.exec("COMMIT", "committing a deletion").map(|()| n));
        match committed {
            Ok(n) => {
                for run_id in runs {
                    self.tails.remove(*run_id);
                }
                self.data_version = Some(version);
                Ok(n)
            }
            Err(e) => {
                let _ = self.exec("ROLLBACK", "rolling back");
                self.tails.clear();
                self.data_version = None;
                Err(e)
            }
        }
    }

    /// `PRAGMA data_version` inside a transaction just begun; rolled back if it cannot be read.
    pub(super) fn begun_version(&self) -> Result<i64> {
        self.data_version().inspect_err(|_| {
            let _ = self.exec("ROLLBACK", "rolling back");
        })
    }

    /// The checks at the start of a write transaction begun by the caller, who read `version`:
    /// the files, and a later version's upgrade when another connection has committed since this
    /// writer's last transaction (or this is its first). Rolls back when one fails; else says
    /// whether another connection has committed.
    fn check_begun(&mut self, version: i64) -> Result<bool> {
        let others_committed = self.data_version != Some(version);
        let checked = self.check_files().and_then(|()| {
            if others_committed {
                self.check_not_upgraded()
            } else {
                Ok(())
            }
        });
        if let Err(e) = checked {
            let _ = self.exec("ROLLBACK", "rolling back");
            return Err(e);
        }
        Ok(others_committed)
    }

    /// The body of a write transaction begun by the caller, who read `version`
    /// ([`SqliteWriter::begun_version`]): run `body`, then commit, or roll back.
    pub(super) fn write(&mut self, body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>, version: i64) -> Result<()> {
        let others_committed = self.check_begun(version)?;
        if others_committed || self.tails.len() > MAX_TAILS {
            self.tails.clear();
        }
        let mut tx = SqliteTx {
            conn: &self.conn,
            tails: &self.tails,
            staged: Vec::new(),
            mark: 0,
            catalog: CatalogStage::default(),
            catalog_mark: 0,
        };
        let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut tx))) {
            Ok(result) => result,
            Err(panic) => {
                // Left open, the transaction would keep the database's write lock: every later
                // append here, and every writer in other processes, would fail (after the busy
                // timeout). Roll back, forget what this writer knew, and let the panic go on to
                // the writer loop, which settles the group with it.
                drop(tx);
                let _ = self.exec("ROLLBACK", "rolling back");
                self.tails.clear();
                self.data_version = None;
                std::panic::resume_unwind(panic);
            }
        };
        let staged = std::mem::take(&mut tx.staged);
        // The catalog's rows go in last, once per stream, inside the same transaction.
        let result = result.and_then(|()| put_catalog(&self.conn, &tx.catalog.writes()));
        if let Err(e) = result {
            // Nothing of this transaction stays, so what was remembered before it still holds;
            // and no other connection can have committed while it held the write lock.
            let _ = self.exec("ROLLBACK", "rolling back");
            self.data_version = Some(version);
            return Err(e);
        }
        match self.exec("COMMIT", "committing appends") {
            Ok(()) => {
                for (run, tail) in staged {
                    self.tails.insert(run, tail);
                }
                // Our own commits do not move our data_version; another connection's do.
                self.data_version = Some(version);
                Ok(())
            }
            Err(e) => {
                let _ = self.exec("ROLLBACK", "rolling back");
                self.tails.clear();
                self.data_version = None;
                Err(e)
            }
        }
    }
}

impl Drop for SqliteWriter {
    /// Close the connection, once sure that closing it loses nothing (see [`Damage`]).
    fn drop(&mut self) {
        if self.damage.is_none() {
            let _ = self.check_files();
        }
        if !matches!(self.damage, Some((Damage::Unsafe, _))) {
            // SAFETY: `conn` is dropped once, here, and not used after: this is the writer's drop.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.conn) };
        }
    }
}

pub(super) struct SqliteTx<'c> {
    pub(super) conn: &'c Connection,
    pub(super) tails: &'c HashMap<String, Tail>,
    /// Tails written by this transaction, in order; the latest entry for a run wins.
    pub(super) staged: Vec<(String, Tail)>,
    /// `staged.len()` at the open savepoint.
    pub(super) mark: usize,
    pub(super) catalog: CatalogStage,
    /// `catalog.len()` at the open savepoint.
    pub(super) catalog_mark: usize,
}

/// Write a transaction's catalog rows (see [`crate::catalog`]).
fn put_catalog(conn: &Connection, writes: &[CatalogWrite]) -> Result<()> {
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO runs (run_id, last_sequence, first_recorded_at, last_recorded_at, status)
             VALUES (?1, ?2, coalesce(?3, ?4), ?4, coalesce(?5, 'pending'))
             ON CONFLICT (run_id) DO UPDATE SET
                last_sequence = excluded.last_sequence,
                first_recorded_at = coalesce(?3, first_recorded_at),
                last_recorded_at = excluded.last_recorded_at,
                status = CASE WHEN ?5 IS NOT NULL THEN ?5
                              WHEN ?6 AND status = 'pending' THEN 'running'
                              ELSE status END",
        )
        .map_err(|e| WorldError::sqlite("recording the runs catalog", e))?;
    for w in writes {
        let (set, touch) = w.status.parts();
        stmt.execute(params![
            w.run_id,
            w.last_sequence as i64,
            w.first_recorded_at,
            w.last_recorded_at,
            set,
            touch
        ])
        .map_err(|e| WorldError::sqlite("recording the runs catalog", e))?;
    }
    Ok(())
}

impl SqliteTx<'_> {
    pub(super) fn exec(&self, sql: &str, what: &str) -> Result<()> {
        exec(self.conn, sql, what)
    }

    /// The tail of `run_id`: staged by this transaction, remembered, or read.
    pub(super) fn tail(&self, run_id: &str) -> Result<Tail> {
        if let Some((_, t)) = self.staged.iter().rev().find(|(r, _)| r == run_id) {
            return Ok(*t);
        }
        if let Some(t) = self.tails.get(run_id) {
            return Ok(*t);
        }
        Ok(Tail {
            last: last_sequence(self.conn, run_id)?,
            ended: terminal(self.conn, run_id, "")?,
        })
    }
}

impl LogTx for SqliteTx<'_> {
    fn last_sequence(&mut self, run_id: &str) -> Result<u64> {
        self.tail(run_id).map(|t| t.last)
    }

    fn find_by_key(&mut self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
        find_by_key(self.conn, run_id, key)
    }

    fn insert(&mut self, row: &RowRef<'_>) -> Result<()> {
        let tail = self.tail(row.run_id)?;
        self.conn
            .prepare_cached(
                "INSERT INTO events (run_id, sequence, event_id, type, idempotency_key, request_digest, recorded_at, envelope)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    row.run_id,
                    row.sequence as i64,
                    row.event_id,
                    row.event_type,
                    row.key,
                    row.digest,
                    row.recorded_at,
                    row.envelope
                ])
            })
            .map_err(|e| match &e {
                rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
                    WorldError::RuntimeIntegrity {
                        reason: format!(
                            "{} sequence {} (or its idempotency key) is already taken: a writer bypassed the write lock ({e})",
                            row.run_id, row.sequence
                        ),
                    }
                }
                _ => WorldError::sqlite("inserting an event", e),
            })?;
        self.staged.push((
            row.run_id.to_string(),
            Tail {
                last: row.sequence,
                ..tail
            },
        ));
        Ok(())
    }

    fn terminal(&mut self, run_id: &str, node: &str) -> Result<Option<u64>> {
        if node.is_empty() {
            return self.tail(run_id).map(|t| t.ended);
        }
        terminal(self.conn, run_id, node)
    }

    fn insert_terminal(&mut self, run_id: &str, node: &str, sequence: u64, event_type: &str) -> Result<()> {
        let tail = self.tail(run_id)?;
        self.conn
            .prepare_cached("INSERT INTO terminals (run_id, node_id, sequence, type) VALUES (?1, ?2, ?3, ?4)")
            .and_then(|mut s| s.execute(params![run_id, node, sequence as i64, event_type]))
            .map_err(|e| WorldError::sqlite("recording a terminal event", e))?;
        if node.is_empty() {
            self.staged.push((
                run_id.to_string(),
                Tail {
                    ended: Some(sequence),
                    ..tail
                },
            ));
        }
        Ok(())
    }

    fn estimate(&mut self, run_id: &str, model: &str) -> Result<u64> {
        self.conn
            .prepare_cached("SELECT open FROM estimates WHERE run_id = ?1 AND model = ?2")
            .and_then(|mut s| s.query_row(params![run_id, model], |r| r.get::<_, i64>(0)).optional())
            .map(|v| v.map_or(0, |open| open.max(0) as u64))
            .map_err(|e| WorldError::sqlite("reading a budget estimate", e))
    }

    fn estimate_total(&mut self, run_id: &str) -> Result<u64> {
        // Each open amount is at most 2^53 - 1, and so is their sum: an i64 holds it.
        self.conn
            .prepare_cached("SELECT coalesce(sum(open), 0) FROM estimates WHERE run_id = ?1")
            .and_then(|mut s| s.query_row([run_id], |r| r.get::<_, i64>(0)))
            .map(|t| t.max(0) as u64)
            .map_err(|e| WorldError::sqlite("reading the conservative total", e))
    }

    fn add_estimate(&mut self, run_id: &str, model: &str, amount: u64, released: bool) -> Result<()> {
        let delta = if released { -(amount as i64) } else { amount as i64 };
        self.conn
            .prepare_cached(
                "INSERT INTO estimates (run_id, model, open) VALUES (?1, ?2, ?3)
                 ON CONFLICT (run_id, model) DO UPDATE SET open = open + excluded.open",
            )
            .and_then(|mut s| s.execute(params![run_id, model, delta]))
            .map(|_| ())
            .map_err(|e| WorldError::sqlite("recording a budget estimate", e))
    }

    fn usage(&mut self, run_id: &str) -> Result<[u64; 4]> {
        self.conn
            .prepare_cached(
                "SELECT input_tokens, output_tokens, cached_input_tokens, reasoning_tokens FROM usage_totals WHERE run_id = ?1",
            )
            .and_then(|mut s| {
                s.query_row([run_id], |r| {
                    let n = |i| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                    Ok([n(0)?, n(1)?, n(2)?, n(3)?])
                })
                .optional()
            })
            .map(Option::unwrap_or_default)
            .map_err(|e| WorldError::sqlite("reading a run's token counts", e))
    }

    fn add_usage(&mut self, run_id: &str, tokens: [u64; 4]) -> Result<()> {
        // Each total is at most 2^53 - 1 (the caller checked), so an i64 holds it.
        let [a, b, c, d] = tokens.map(|n| n as i64);
        self.conn
            .prepare_cached(
                "INSERT INTO usage_totals (run_id, input_tokens, output_tokens, cached_input_tokens, reasoning_tokens)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (run_id) DO UPDATE SET
                    input_tokens = input_tokens + excluded.input_tokens,
                    output_tokens = output_tokens + excluded.output_tokens,
                    cached_input_tokens = cached_input_tokens + excluded.cached_input_tokens,
                    reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens",
            )
            .and_then(|mut s| s.execute(params![run_id, a, b, c, d]))
            .map(|_| ())
            .map_err(|e| WorldError::sqlite("adding to a run's token counts", e))
    }

    fn index_holder(&mut self, index: &str, key: &str) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT run_id FROM index_entries WHERE name = ?1 AND key = ?2")
            .and_then(|mut s| s.query_row(params![index, key], |r| r.get::<_, String>(0)).optional())
            .map_err(|e| WorldError::sqlite("reading an index entry", e))
    }

    fn put_index(&mut self, index: &str, key: &str, value: Option<&str>, run_id: &str, sequence: u64) -> Result<()> {
        let written = match value {
            Some(value) => self
                .conn
                .prepare_cached(
                    "INSERT INTO index_entries (name, key, value, run_id, sequence) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (name, key) DO UPDATE SET
                        value = excluded.value, run_id = excluded.run_id, sequence = excluded.sequence",
                )
                .and_then(|mut s| s.execute(params![index, key, value, run_id, sequence as i64])),
            None => self
                .conn
                .prepare_cached("DELETE FROM index_entries WHERE name = ?1 AND key = ?2")
                .and_then(|mut s| s.execute(params![index, key])),
        };
        written
            .map(|_| ())
            .map_err(|e| WorldError::sqlite("writing an index entry", e))
    }

    fn catalog(&mut self, note: CatalogNote) -> Result<()> {
        self.catalog.note(note);
        Ok(())
    }

    fn savepoint(&mut self) -> Result<()> {
        self.mark = self.staged.len();
        self.catalog_mark = self.catalog.len();
        self.exec("SAVEPOINT append", "opening a savepoint")
    }

    fn release(&mut self) -> Result<()> {
        self.exec("RELEASE append", "releasing a savepoint")
    }

    fn rollback_to(&mut self) -> Result<()> {
        self.staged.truncate(self.mark);
        self.catalog.truncate(self.catalog_mark);
        self.exec("ROLLBACK TO append", "rolling back a savepoint")?;
        self.exec("RELEASE append", "releasing a savepoint")
    }
}
