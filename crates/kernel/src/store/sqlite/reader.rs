//! The pool of read connections, and the reads a backend answers.

use super::connect::{connect, on, Access};
use super::files::{beside, StoreFiles};
use super::last_sequence;
use crate::catalog::{CatalogRow, RunOrder, RunQuery};
use crate::error::{Result, WorldError};
use crate::store::{Changes, IndexEntry, IndexQuery, KeyedEvent, LogReader, RowRef, StreamSummary};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// How much of the database a reader maps into memory.
pub(super) const READER_MMAP: i64 = 1 << 30;

/// Most new rows whose streams [`SqliteReader::changes`] lists; past this, anything may have changed.
pub(super) const CHANGES_LISTED: i64 = 100_000;

/// Read connections, pooled until the world closes.
pub struct SqliteReader {
    pub(super) path: PathBuf,
    pub(super) access: Access,
    pub(super) pool: Mutex<Pool>,
    /// The store's files as the world opened them (the database, and for a writable world its
    /// `-shm` and `-wal`): every read is refused once the file at one of their paths is another
    /// (the data directory deleted and made again, by another world perhaps). A pooled
    /// connection would go on reading the deleted store; a new one would read a store this world
    /// does not own, or a WAL that is not the one the wal-index describes.
    pub(super) identity: std::sync::Arc<StoreFiles>,
}

/// The reader's idle connections; none are kept once it is closed.
#[derive(Default)]
pub(super) struct Pool {
    pub(super) idle: Vec<Connection>,
    pub(super) closed: bool,
}

impl SqliteReader {
    pub(super) fn new(path: PathBuf, access: Access) -> SqliteReader {
        SqliteReader {
            path,
            access,
            pool: Mutex::new(Pool::default()),
            identity: std::sync::Arc::new(StoreFiles::new(Vec::new())),
        }
    }

    pub(super) fn with_conn<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.identity.check(
            "reading the event store",
            "; close the world and open the data directory again",
        )?;
        if self.access == Access::Immutable
            && std::fs::metadata(beside(&self.identity.files[0].path, "-wal")).is_ok_and(|m| m.len() > 0)
        {
            // Read as a file nothing changes, the store now has a writer: its pages may change
            // under a read.
            return Err(WorldError::Path {
                message: format!(
                    "{}: another process has begun writing the world since this read-only world opened it; open it again to read what it writes",
                    self.path.display()
                ),
            });
        }
        let pooled = self.pool.lock().expect("reader pool").idle.pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let c = connect(&self.path, self.access)?;
                // Readers map the database instead of copying each page through read(2).
                c.pragma_update(None, "query_only", true)
                    .and_then(|_| c.pragma_update(None, "mmap_size", READER_MMAP))
                    .map_err(|e| on(&c, WorldError::sqlite("opening a reader", e)))?;
                c
            }
        };
        let out = f(&conn).map_err(|e| on(&conn, e));
        let mut pool = self.pool.lock().expect("reader pool");
        if !pool.closed {
            pool.idle.push(conn);
        }
        out
    }
}

impl LogReader for SqliteReader {
    fn envelopes(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        self.with_conn(|conn| {
            let limit = limit.map(|l| l.min(i64::MAX as u64) as i64).unwrap_or(-1);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT envelope FROM events WHERE run_id = ?1 AND sequence > ?2 ORDER BY sequence LIMIT ?3",
                )
                .map_err(|e| WorldError::sqlite("listing events", e))?;
            let mut rows = stmt
                .query(params![run_id, after.min(i64::MAX as u64) as i64, limit])
                .map_err(|e| WorldError::sqlite("listing events", e))?;
            while let Some(row) = rows.next().map_err(|e| WorldError::sqlite("listing events", e))? {
                let text = row
                    .get_ref(0)
                    .and_then(|v| v.as_str().map_err(Into::into))
                    .map_err(|e| WorldError::sqlite("reading an envelope", e))?;
                sink(text)?;
            }
            Ok(())
        })
    }

    fn rows(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
    ) -> Result<()> {
        self.with_conn(|conn| rows_on(conn, run_id, after, limit, sink))
    }

    /// Read without the connection's map of the database (and unmap what it held), then map it
    /// again for the reads after: a pass over the whole store would otherwise leave every page of
    /// it resident in the process.
    fn rows_once(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
    ) -> Result<()> {
        self.with_conn(|conn| {
            let map = |size: i64| {
                conn.pragma_update(None, "mmap_size", size)
                    .map_err(|e| WorldError::sqlite("setting how much of the database a reader maps", e))
            };
            map(0)?;
            let read = rows_on(conn, run_id, after, limit, sink);
            map(READER_MMAP)?;
            read
        })
    }

    fn streams(&self) -> Result<Vec<StreamSummary>> {
        self.with_conn(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT run_id, count(*), max(sequence), min(recorded_at), max(recorded_at)
                     FROM events GROUP BY run_id ORDER BY run_id",
                )
                .map_err(|e| WorldError::sqlite("listing runs", e))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(StreamSummary {
                        run_id: r.get(0)?,
                        event_count: r.get::<_, i64>(1)? as u64,
                        last_sequence: r.get::<_, i64>(2)? as u64,
                        first_recorded_at: r.get(3)?,
                        last_recorded_at: r.get(4)?,
                    })
                })
                .map_err(|e| WorldError::sqlite("listing runs", e))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .map_err(|e| WorldError::sqlite("listing runs", e))
        })
    }

    /// SQLite's online backup, in one step: every page is copied inside one read transaction of
    /// this reader's connection, so the copy is the database as of one commit, and writers go on
    /// meanwhile. The copy is then made durable before it counts.
    fn copy_into(&self, path: &std::path::Path) -> Result<()> {
        let err = |e| WorldError::sqlite("copying the event store", e);
        let mut target = Connection::open(path).map_err(err)?;
        self.with_conn(|conn| {
            let backup = rusqlite::backup::Backup::new(conn, &mut target).map_err(err)?;
            match backup.step(-1).map_err(err)? {
                rusqlite::backup::StepResult::Done => Ok(()),
                other => Err(WorldError::RuntimeIntegrity {
                    reason: format!("copying the event store stopped before its end ({other:?})"),
                }),
            }
        })?;
        target
            .execute_batch("PRAGMA synchronous = FULL; PRAGMA journal_mode = DELETE;")
            .map_err(err)?;
        target.close().map_err(|(_, e)| err(e))?;
        std::fs::File::open(path)
            .and_then(|f| f.sync_all())
            .map_err(|e| WorldError::io("syncing the copied event store", Some(path.to_path_buf()), e))
    }

    fn artifact_mentions(&self, sink: &mut dyn FnMut(&str, &str) -> Result<()>) -> Result<()> {
        self.with_conn(|conn| {
            let err = |e| WorldError::sqlite("looking for references to artifacts", e);
            let mut stmt = conn
                .prepare_cached("SELECT run_id, envelope FROM events WHERE instr(envelope, '\"artifact://') > 0")
                .map_err(err)?;
            let mut rows = stmt.query([]).map_err(err)?;
            while let Some(row) = rows.next().map_err(err)? {
                let run: &str = row.get_ref(0).and_then(|v| Ok(v.as_str()?)).map_err(err)?;
                let envelope: &str = row.get_ref(1).and_then(|v| Ok(v.as_str()?)).map_err(err)?;
                sink(run, envelope)?;
            }
            Ok(())
        })
    }

    fn catalog_page(&self, query: &RunQuery<'_>) -> Result<Vec<CatalogRow>> {
        let (sql, values) = catalog_sql(query);
        self.with_conn(|conn| {
            let err = |e| WorldError::sqlite("reading the runs catalog", e);
            if !has_catalog(conn)? {
                let mut rows = Vec::new();
                super::schema::catalog_from_events(conn, None, |r| {
                    if query.wants(&r) {
                        rows.push(r);
                    }
                    Ok(())
                })
                .map_err(err)?;
                crate::catalog::sort(&mut rows, query.order);
                rows.truncate(query.limit.min(usize::MAX as u64) as usize);
                return Ok(rows);
            }
            let mut stmt = conn.prepare_cached(&sql).map_err(err)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(values.iter()), catalog_row)
                .map_err(err)?;
            rows.collect::<rusqlite::Result<Vec<_>>>().map_err(err)
        })
    }

    fn catalog_row(&self, run_id: &str) -> Result<Option<CatalogRow>> {
        self.with_conn(|conn| {
            if !has_catalog(conn)? {
                let mut found = None;
                super::schema::catalog_from_events(conn, Some(run_id), |r| {
                    found = Some(r);
                    Ok(())
                })
                .map_err(|e| WorldError::sqlite("reading the runs catalog", e))?;
                return Ok(found);
            }
            conn.prepare_cached(
                "SELECT run_id, last_sequence, first_recorded_at, last_recorded_at, status FROM runs WHERE run_id = ?1",
            )
            .and_then(|mut s| s.query_row([run_id], catalog_row).optional())
            .map_err(|e| WorldError::sqlite("reading the runs catalog", e))
        })
    }

    fn last_sequence(&self, run_id: &str) -> Result<u64> {
        self.with_conn(|conn| last_sequence(conn, run_id))
    }

    /// By rowid, which only grows while rows are only added: the streams of the rows after the
    /// mark, up to the greatest rowid read first (so a row committed between the two statements
    /// is left for the next call).
    fn changes(&self, since: Option<i64>) -> Result<Changes> {
        self.with_conn(|conn| {
            let err = |e| WorldError::sqlite("looking for new events", e);
            let mark: i64 = conn
                .prepare_cached("SELECT coalesce(max(rowid), 0) FROM events")
                .and_then(|mut s| s.query_row([], |r| r.get(0)))
                .map_err(err)?;
            let streams = match since {
                None => Some(Vec::new()),
                Some(since) if mark == since => Some(Vec::new()),
                Some(since) if mark < since || mark - since > CHANGES_LISTED => None,
                Some(since) => Some(
                    conn.prepare_cached("SELECT DISTINCT run_id FROM events WHERE rowid > ?1 AND rowid <= ?2")
                        .and_then(|mut s| {
                            s.query_map([since, mark], |r| r.get::<_, String>(0))?
                                .collect::<rusqlite::Result<Vec<_>>>()
                        })
                        .map_err(err)?,
                ),
            };
            Ok(Changes { mark, streams })
        })
    }

    fn find_by_key(&self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
        self.with_conn(|conn| find_by_key(conn, run_id, key))
    }

    fn index_entry(&self, index: &str, key: &str) -> Result<Option<IndexEntry>> {
        self.with_conn(|conn| {
            conn.prepare_cached(
                "SELECT name, key, value, run_id, sequence FROM index_entries WHERE name = ?1 AND key = ?2",
            )
            .and_then(|mut s| s.query_row([index, key], index_entry).optional())
            .map_err(|e| WorldError::sqlite("reading an index entry", e))
        })
    }

    fn held_index_entries(&self, run_id: &str) -> Result<Vec<IndexEntry>> {
        self.with_conn(|conn| {
            conn.prepare_cached(
                "SELECT name, key, value, run_id, sequence FROM index_entries WHERE run_id = ?1 ORDER BY name, key",
            )
            .and_then(|mut s| {
                s.query_map([run_id], index_entry)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| WorldError::sqlite("reading a run's index entries", e))
        })
    }

    fn index_entries(&self, q: &IndexQuery<'_>) -> Result<Vec<IndexEntry>> {
        // One statement per order, each walking the primary key or the value index.
        let (cmp, order) = if q.descending { ("<", "DESC") } else { (">", "ASC") };
        let sql = format!(
            "SELECT name, key, value, run_id, sequence FROM index_entries
             WHERE name = ?1 AND (?2 IS NULL OR value = ?2) AND (?3 IS NULL OR key {cmp} ?3)
             ORDER BY key {order} LIMIT ?4"
        );
        self.with_conn(|conn| {
            conn.prepare_cached(&sql)
                .and_then(|mut s| {
                    s.query_map(
                        params![q.index, q.value, q.after, q.limit.min(i64::MAX as u64) as i64],
                        index_entry,
                    )?
                    .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(|e| WorldError::sqlite("listing index entries", e))
        })
    }

    /// SQLite's own check, then each run's rows counted through the `(run_id, sequence)` index
    /// against a scan of the table: `quick_check` does not compare indexes with their tables, and
    /// that index is the one every read of a run goes through.
    fn check_storage(&self, thorough: bool) -> Result<Vec<String>> {
        self.with_conn(|conn| {
            let pragma = if thorough { "PRAGMA integrity_check" } else { "PRAGMA quick_check" };
            // A database too damaged to be checked (or counted) is itself what the check found.
            let failed = |doing: &str, e: rusqlite::Error| -> Result<Vec<String>> {
                match WorldError::sqlite(doing, e) {
                    e @ WorldError::EventLogCorrupt { .. } => Ok(vec![e.to_string()]),
                    e => Err(e),
                }
            };
            let mut found: Vec<String> = match conn
                .prepare(pragma)
                .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(0))?.collect())
            {
                Ok(found) => found,
                Err(e) => return failed("checking the database", e),
            };
            if found.len() == 1 && found[0] == "ok" {
                found.clear();
            }
            let count = |sql: &str| -> rusqlite::Result<HashMap<String, (i64, i64)>> {
                conn.prepare(sql).and_then(|mut s| {
                    s.query_map([], |r| Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?))))?
                        .collect()
                })
            };
            let counted = count(
                "SELECT run_id, count(*), max(sequence) FROM events INDEXED BY sqlite_autoindex_events_1 GROUP BY run_id",
            )
            .and_then(|i| Ok((i, count("SELECT run_id, count(*), max(sequence) FROM events NOT INDEXED GROUP BY run_id")?)));
            let (by_index, by_table) = match counted {
                Ok(both) => both,
                Err(e) => {
                    found.extend(failed("counting each run's rows", e)?);
                    return Ok(found);
                }
            };
            let mut runs: Vec<&String> = by_index.keys().chain(by_table.keys()).collect();
            runs.sort();
            runs.dedup();
            for run in runs {
                let (i, t) = (by_index.get(run), by_table.get(run));
                if i != t {
                    let say = |c: Option<&(i64, i64)>| match c {
                        Some((n, max)) => format!("{n} rows up to sequence {max}"),
                        None => "no rows".to_string(),
                    };
                    found.push(format!(
                        "run {}: the table holds {}, its index {}",
                        crate::canonical::string_literal(run),
                        say(t),
                        say(i)
                    ));
                }
            }
            Ok(found)
        })
    }

    fn close(&self) {
        let idle = {
            let mut pool = self.pool.lock().expect("reader pool");
            pool.closed = true;
            std::mem::take(&mut pool.idle)
        };
        drop(idle);
        self.identity.close();
    }
}

/// The row of `run_id` appended with idempotency key `key`, as `conn` sees the store.
pub(super) fn find_by_key(conn: &Connection, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
    conn.prepare_cached(
        "SELECT sequence, request_digest, envelope FROM events WHERE run_id = ?1 AND idempotency_key = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![run_id, key], |r| {
            Ok(KeyedEvent {
                sequence: r.get::<_, i64>(0)? as u64,
                digest: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                envelope: r.get(2)?,
            })
        })
        .optional()
    })
    .map_err(|e| WorldError::sqlite("looking up an idempotency key", e))
}

fn index_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<IndexEntry> {
    Ok(IndexEntry {
        index: r.get(0)?,
        key: r.get(1)?,
        value: r.get(2)?,
        run_id: r.get(3)?,
        sequence: r.get::<_, i64>(4)? as u64,
    })
}

/// Whether the database has the runs catalog: a world an earlier version wrote, opened read-only,
/// has not been upgraded, and its catalog is worked out from its events instead.
fn has_catalog(conn: &Connection) -> Result<bool> {
    conn.prepare_cached("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'runs'")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .map(|n| n > 0)
        .map_err(|e| WorldError::sqlite("reading the schema", e))
}

fn catalog_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CatalogRow> {
    Ok(CatalogRow {
        run_id: r.get(0)?,
        last_sequence: r.get::<_, i64>(1)? as u64,
        first_recorded_at: r.get(2)?,
        last_recorded_at: r.get(3)?,
        status: r.get(4)?,
    })
}

/// The statement and its values for a page of the catalog. Each order reads an index in order
/// (`runs_by_time`, or `runs_by_status` for one status, or the primary key by id), starting after
/// the cursor's row, so a page reads about as many rows as it returns.
fn catalog_sql(q: &RunQuery<'_>) -> (String, Vec<rusqlite::types::Value>) {
    let mut sql =
        String::from("SELECT run_id, last_sequence, first_recorded_at, last_recorded_at, status FROM runs WHERE 1");
    let mut values: Vec<rusqlite::types::Value> = Vec::new();
    let mut bind = |sql: &mut String, clause: &str, v: &str| {
        values.push(v.to_string().into());
        sql.push_str(&clause.replace('?', &format!("?{}", values.len())));
    };
    if let Some(s) = q.status {
        bind(&mut sql, " AND status = ?", s);
    }
    if let Some(b) = q.before {
        bind(&mut sql, " AND last_recorded_at < ?", b);
    }
    if let Some(a) = q.after_time {
        bind(&mut sql, " AND last_recorded_at >= ?", a);
    }
    if let Some(c) = q.after {
        match q.order {
            RunOrder::Id => bind(&mut sql, " AND run_id > ?", &c.run_id),
            order => {
                let op = if order == RunOrder::Newest { "<" } else { ">" };
                bind(
                    &mut sql,
                    &format!(" AND (last_recorded_at, run_id) {op} (?"),
                    &c.last_recorded_at,
                );
                bind(&mut sql, ", ?)", &c.run_id);
            }
        }
    }
    sql.push_str(match q.order {
        RunOrder::Newest => " ORDER BY last_recorded_at DESC, run_id DESC",
        RunOrder::Oldest => " ORDER BY last_recorded_at, run_id",
        RunOrder::Id => " ORDER BY run_id",
    });
    values.push((q.limit.min(i64::MAX as u64) as i64).into());
    sql.push_str(&format!(" LIMIT ?{}", values.len()));
    (sql, values)
}

/// The rows of `run_id` after `after`, in sequence order, at most `limit`, read on `conn`.
fn rows_on(
    conn: &Connection,
    run_id: &str,
    after: u64,
    limit: Option<u64>,
    sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
) -> Result<()> {
    let limit = limit.map(|l| l.min(i64::MAX as u64) as i64).unwrap_or(-1);
    let mut stmt = conn
        .prepare_cached(
            "SELECT run_id, sequence, event_id, type, idempotency_key, request_digest, recorded_at, envelope
                 FROM events WHERE run_id = ?1 AND sequence > ?2 ORDER BY sequence LIMIT ?3",
        )
        .map_err(|e| WorldError::sqlite("reading events", e))?;
    let mut rows = stmt
        .query(params![run_id, after.min(i64::MAX as u64) as i64, limit])
        .map_err(|e| WorldError::sqlite("reading events", e))?;
    while let Some(r) = rows.next().map_err(|e| WorldError::sqlite("reading events", e))? {
        let text = |i: usize| -> rusqlite::Result<&str> { r.get_ref(i)?.as_str().map_err(Into::into) };
        let opt = |i: usize| -> rusqlite::Result<Option<&str>> { r.get_ref(i)?.as_str_or_null().map_err(Into::into) };
        let row = (|| {
            Ok::<_, rusqlite::Error>(RowRef {
                run_id: text(0)?,
                sequence: r.get::<_, i64>(1)? as u64,
                event_id: text(2)?,
                event_type: text(3)?,
                key: opt(4)?,
                digest: opt(5)?,
                recorded_at: text(6)?,
                envelope: text(7)?,
            })
        })()
        .map_err(|e| WorldError::sqlite("reading an event row", e))?;
        sink(row)?;
    }
    Ok(())
}
