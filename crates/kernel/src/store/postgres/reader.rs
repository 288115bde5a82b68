//! The reads of a `postgres` world's event store, each on a pooled connection.
//!
//! A stream is read by sequence: its commits become visible in sequence order (see the module
//! above), so a read after sequence `n` never misses a row that commits later. What changed
//! across streams is read by transaction id, as emmett's PostgreSQL store reads its messages:
//! rows whose writing transaction is older than every transaction still running
//! (`pg_snapshot_xmin`), after the last such bound. A transaction that commits late, after
//! others that began after it, is found then, never skipped; while one runs long, the feed waits
//! for it (notifications still wake a stream's readers meanwhile: see `listen`).

use super::listen::Listener;
use crate::catalog::{CatalogRow, RunOrder, RunQuery};
use crate::error::{Result, WorldError};
use crate::pg::{col, Db};
use crate::store::{
    Announcer, Changes, Dense, FoldSnapshots, IndexEntry, IndexQuery, KeyedEvent, LogReader, RowRef, StoredSnapshot,
    StreamSummary,
};
use std::sync::{Arc, OnceLock};

/// Streams listed by one look at what changed; past this, anything may have.
const CHANGES_LISTED: i64 = 100_000;

pub struct PgReader {
    db: Arc<Db>,
    listener: OnceLock<Arc<Listener>>,
    /// When the server last started, as the feed of changes last saw it: a restart may have lost
    /// commits and handed their transaction ids out again (see [`LogReader::changes`]).
    started: std::sync::Mutex<Option<String>>,
}

impl PgReader {
    pub fn new(db: Arc<Db>) -> PgReader {
        PgReader {
            db,
            listener: OnceLock::new(),
            started: std::sync::Mutex::new(None),
        }
    }

    fn query(
        &self,
        doing: &'static str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let db = &self.db;
        db.block_on(async {
            let client = db.pooled().await?;
            let statement = client.prepare_cached(sql).await.map_err(|e| db.error(doing, &e))?;
            client.query(&statement, params).await.map_err(|e| db.error(doing, &e))
        })
    }
}

/// Rows handed from the task that reads them to the thread that takes them, at a time.
const ROWS_PER_BATCH: usize = 1024;

/// A query's parameters, owned, so the task that runs it can outlive the caller's borrows.
type Params = Vec<Box<dyn tokio_postgres::types::ToSql + Send + Sync>>;

impl PgReader {
    /// Run a query and hand each row to `each` as it arrives, so the rows are taken while the
    /// server is still sending the rest. A task on the runtime reads the rows, next to the task
    /// of the connection they arrive on, and hands them over in batches: a thread of the core
    /// taking them straight off the connection would be woken every few rows, and on a long
    /// listing those wake-ups cost about a third of the client's time.
    fn each_row(
        &self,
        doing: &'static str,
        sql: String,
        params: Params,
        each: &mut dyn FnMut(&tokio_postgres::Row) -> Result<()>,
    ) -> Result<()> {
        let db = self.db.clone();
        let (batches, mut taken) = tokio::sync::mpsc::channel::<Vec<tokio_postgres::Row>>(4);
        let reading = self.db.spawn(async move {
            use futures_util::TryStreamExt;
            let client = db.pooled().await?;
            let statement = client.prepare_cached(&sql).await.map_err(|e| db.error(doing, &e))?;
            let rows = client
                .query_raw(
                    &statement,
                    params
                        .iter()
                        .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync)),
                )
                .await
                .map_err(|e| db.error(doing, &e))?;
            futures_util::pin_mut!(rows);
            let mut batch = Vec::with_capacity(ROWS_PER_BATCH);
            while let Some(row) = rows.try_next().await.map_err(|e| db.error(doing, &e))? {
                batch.push(row);
                if batch.len() == ROWS_PER_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(ROWS_PER_BATCH));
                    if batches.send(full).await.is_err() {
                        return Ok(()); // the taker stopped (its error is the call's)
                    }
                }
            }
            if !batch.is_empty() {
                let _ = batches.send(batch).await;
            }
            Ok::<(), WorldError>(())
        });
        let mut taking = Ok(());
        while let Some(batch) = taken.blocking_recv() {
            if let Err(e) = batch.iter().try_for_each(&mut *each) {
                taking = Err(e);
                break;
            }
        }
        drop(taken);
        let read = self.db.block_on(reading).unwrap_or_else(|e| {
            Err(match e.try_into_panic() {
                Ok(p) => crate::runtime::panic_error(p),
                Err(e) => WorldError::RuntimeIntegrity {
                    reason: format!("the read was stopped: {e}"),
                },
            })
        });
        taking.and(read)
    }
}

/// The parameters of a listing: the stream, the sequence it starts after, and how many at most.
fn listing_params(run_id: &str, after: u64, limit: Option<u64>) -> Params {
    vec![
        Box::new(run_id.to_string()),
        Box::new(after as i64),
        Box::new(limit.map(|l| l.min(i64::MAX as u64) as i64)),
    ]
}

impl LogReader for PgReader {
    fn envelopes(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        let mut dense = Dense::after(run_id, after);
        self.each_row(
            "listing events",
            format!(
                "SELECT sequence, envelope FROM {} WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
                self.db.table("events")
            ),
            listing_params(run_id, after, limit),
            &mut |row| {
                dense.check(col::<i64>(row, 0)? as u64)?;
                sink(col(row, 1)?)
            },
        )
    }

    fn rows(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut dense = Dense::after(run_id, after);
        self.each_row(
            "listing events",
            format!(
                "SELECT sequence, event_id, type, idempotency_key, request_digest, recorded_at, envelope FROM {} \
                 WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
                self.db.table("events")
            ),
            listing_params(run_id, after, limit),
            &mut |row| {
                let sequence = col::<i64>(row, 0)? as u64;
                dense.check(sequence)?;
                sink(RowRef {
                    run_id,
                    sequence,
                    event_id: col(row, 1)?,
                    event_type: col(row, 2)?,
                    key: col(row, 3)?,
                    digest: col(row, 4)?,
                    recorded_at: col(row, 5)?,
                    envelope: col(row, 6)?,
                })
            },
        )
    }

    fn streams(&self) -> Result<Vec<StreamSummary>> {
        let rows = self.query(
            "listing streams",
            &format!(
                "SELECT run_id, last_sequence, first_recorded_at, last_recorded_at FROM {} \
                 WHERE last_sequence > 0 ORDER BY run_id COLLATE \"C\"",
                self.db.table("runs")
            ),
            &[],
        )?;
        rows.iter()
            .map(|row| {
                let last = col::<i64>(row, 1)? as u64;
                Ok(StreamSummary {
                    run_id: col(row, 0)?,
                    event_count: last,
                    last_sequence: last,
                    first_recorded_at: col::<Option<String>>(row, 2)?.unwrap_or_default(),
                    last_recorded_at: col::<Option<String>>(row, 3)?.unwrap_or_default(),
                })
            })
            .collect()
    }

    fn artifact_mentions(&self, sink: &mut dyn FnMut(&str, &str) -> Result<()>) -> Result<()> {
        self.each_row(
            "looking for references to artifacts",
            format!(
                "SELECT run_id, envelope FROM {} WHERE strpos(envelope, '\"artifact://') > 0",
                self.db.table("events")
            ),
            Vec::new(),
            &mut |row| sink(&col::<String>(row, 0)?, &col::<String>(row, 1)?),
        )
    }

    fn catalog_page(&self, query: &RunQuery<'_>) -> Result<Vec<CatalogRow>> {
        let mut sql = format!(
            "SELECT run_id, last_sequence, first_recorded_at, last_recorded_at, status FROM {} WHERE last_sequence > 0",
            self.db.table("runs")
        );
        let mut values: Vec<&str> = Vec::new();
        let mut arg = |v| {
            values.push(v);
            format!("${}", values.len())
        };
        if let Some(s) = query.status {
            sql.push_str(&format!(" AND status = {}", arg(s)));
        }
        if let Some(b) = query.before {
            sql.push_str(&format!(" AND last_recorded_at < {}", arg(b)));
        }
        if let Some(a) = query.after_time {
            sql.push_str(&format!(" AND last_recorded_at >= {}", arg(a)));
        }
        if let Some(c) = query.after {
            let clause = match query.order {
                RunOrder::Id => format!(" AND run_id > {}", arg(&c.run_id)),
                order => {
                    let op = if order == RunOrder::Newest { "<" } else { ">" };
                    let (at, id) = (arg(&c.last_recorded_at), arg(&c.run_id));
                    format!(" AND (last_recorded_at, run_id) {op} ({at}, {id})")
                }
            };
            sql.push_str(&clause);
        }
        sql.push_str(match query.order {
            RunOrder::Newest => " ORDER BY last_recorded_at DESC, run_id DESC",
            RunOrder::Oldest => " ORDER BY last_recorded_at, run_id",
            RunOrder::Id => " ORDER BY run_id",
        });
        sql.push_str(&format!(" LIMIT {}", query.limit.min(i64::MAX as u64)));
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let rows = self.query("reading the runs catalog", &sql, &refs)?;
        rows.iter().map(catalog_row).collect()
    }

    fn catalog_row(&self, run_id: &str) -> Result<Option<CatalogRow>> {
        let rows = self.query(
            "reading the runs catalog",
            &format!(
                "SELECT run_id, last_sequence, first_recorded_at, last_recorded_at, status FROM {} \
                 WHERE run_id = $1 AND last_sequence > 0",
                self.db.table("runs")
            ),
            &[&run_id],
        )?;
        rows.first().map(catalog_row).transpose()
    }

    fn last_sequence(&self, run_id: &str) -> Result<u64> {
        let rows = self.query(
            "reading a stream's last sequence",
            &format!("SELECT last_sequence FROM {} WHERE run_id = $1", self.db.table("runs")),
            &[&run_id],
        )?;
        Ok(match rows.first() {
            Some(row) => col::<i64>(row, 0)? as u64,
            None => 0,
        })
    }

    fn find_by_key(&self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
        let rows = self.query(
            "reading an idempotency key",
            &format!(
                "SELECT sequence, request_digest, envelope FROM {} WHERE run_id = $1 AND idempotency_key = $2",
                self.db.table("events")
            ),
            &[&run_id, &key],
        )?;
        rows.first()
            .map(|row| {
                Ok(KeyedEvent {
                    sequence: col::<i64>(row, 0)? as u64,
                    digest: col::<Option<String>>(row, 1)?.unwrap_or_default(),
                    envelope: col(row, 2)?,
                })
            })
            .transpose()
    }

    fn index_entry(&self, index: &str, key: &str) -> Result<Option<IndexEntry>> {
        let rows = self.query(
            "reading an index entry",
            &format!(
                "SELECT name, key, value, run_id, sequence FROM {} WHERE name = $1 AND key = $2",
                self.db.table("index_entries")
            ),
            &[&index, &key],
        )?;
        rows.first().map(index_entry).transpose()
    }

    fn held_index_entries(&self, run_id: &str) -> Result<Vec<IndexEntry>> {
        let rows = self.query(
            "reading a run's index entries",
            &format!(
                "SELECT name, key, value, run_id, sequence FROM {} WHERE run_id = $1 ORDER BY name, key",
                self.db.table("index_entries")
            ),
            &[&run_id],
        )?;
        rows.iter().map(index_entry).collect()
    }

    fn index_entries(&self, q: &IndexQuery<'_>) -> Result<Vec<IndexEntry>> {
        let (cmp, order) = if q.descending { ("<", "DESC") } else { (">", "ASC") };
        let rows = self.query(
            "listing index entries",
            &format!(
                "SELECT name, key, value, run_id, sequence FROM {} \
                 WHERE name = $1 AND ($2::text IS NULL OR value = $2) AND ($3::text IS NULL OR key {cmp} $3) \
                 ORDER BY key {order} LIMIT $4",
                self.db.table("index_entries")
            ),
            &[&q.index, &q.value, &q.after, &(q.limit.min(i64::MAX as u64) as i64)],
        )?;
        rows.iter().map(index_entry).collect()
    }

    /// The mark is a transaction id: every transaction at or below it has ended. The streams
    /// written by transactions past the last mark and below the oldest one still running.
    fn changes(&self, since: Option<i64>) -> Result<Changes> {
        let rows = self.query(
            "looking for new events",
            &format!(
                "SELECT s.bound::text, e.run_id, s.started FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS bound, \
                 pg_postmaster_start_time()::text AS started) s \
                 LEFT JOIN LATERAL (SELECT DISTINCT run_id FROM {} WHERE $1::int8 >= 0 AND xid > ($1::int8)::text::xid8 \
                 AND xid < s.bound LIMIT {}) e ON true",
                self.db.table("events"),
                CHANGES_LISTED + 1
            ),
            &[&since.unwrap_or(-1)],
        )?;
        let bound: String = match rows.first() {
            Some(row) => col(row, 0)?,
            None => {
                return Err(WorldError::RuntimeIntegrity {
                    reason: "the server gave no snapshot".into(),
                })
            }
        };
        let mark = bound.parse::<i64>().map_err(|_| WorldError::RuntimeIntegrity {
            reason: format!("the server gave a transaction id that is not a number: {bound}"),
        })? - 1;
        let streams: Vec<String> = rows
            .iter()
            .filter_map(|row| row.try_get::<_, Option<String>>(1).ok().flatten())
            .collect();
        // A server that started again since the last look may have lost commits a reader saw,
        // and its transaction ids start again below the mark: anything may have changed.
        let started: Option<String> = rows.first().and_then(|row| row.try_get(2).ok());
        let restarted = {
            let mut seen = self.started.lock().unwrap_or_else(|p| p.into_inner());
            let restarted = seen.is_some() && *seen != started;
            *seen = started;
            restarted
        };
        let streams = match since {
            None => Some(Vec::new()),
            Some(_) if restarted => None,
            Some(_) if streams.len() as i64 > CHANGES_LISTED => None,
            Some(_) => Some(streams),
        };
        Ok(Changes { mark, streams })
    }

    /// Each stream's last sequence against its rows: their count and their greatest sequence.
    fn check_storage(&self, _thorough: bool) -> Result<Vec<String>> {
        let rows = self.query(
            "checking the stored rows",
            &format!(
                "SELECT r.run_id, r.last_sequence, coalesce(e.n, 0), coalesce(e.top, 0) FROM {} r \
                 LEFT JOIN (SELECT run_id, count(*) AS n, max(sequence) AS top FROM {} GROUP BY run_id) e USING (run_id) \
                 WHERE r.last_sequence <> coalesce(e.n, 0) OR r.last_sequence <> coalesce(e.top, 0) ORDER BY r.run_id",
                self.db.table("runs"),
                self.db.table("events")
            ),
            &[],
        )?;
        rows.iter()
            .map(|row| {
                Ok(format!(
                    "{}: its last sequence is {} but it holds {} rows up to sequence {}",
                    col::<String>(row, 0)?,
                    col::<i64>(row, 1)?,
                    col::<i64>(row, 2)?,
                    col::<i64>(row, 3)?
                ))
            })
            .collect()
    }

    fn fold_snapshots(&self) -> Option<&dyn FoldSnapshots> {
        Some(self)
    }

    fn announcer(&self) -> Option<Arc<dyn Announcer>> {
        let listener = self.listener.get_or_init(|| Listener::start(self.db.clone()));
        Some(listener.clone())
    }

    fn close(&self) {
        if let Some(l) = self.listener.get() {
            l.stop();
        }
        self.db.close();
    }
}

impl FoldSnapshots for PgReader {
    fn snapshot(&self, run_id: &str, key: &str) -> Result<Option<StoredSnapshot>> {
        let rows = self.query(
            "reading a fold snapshot",
            &format!(
                "SELECT sequence, state FROM {} WHERE run_id = $1 AND fold_key = $2",
                self.db.table("fold_snapshots")
            ),
            &[&run_id, &key],
        )?;
        rows.first()
            .map(|row| {
                Ok(StoredSnapshot {
                    sequence: col::<i64>(row, 0)? as u64,
                    state: col(row, 1)?,
                })
            })
            .transpose()
    }

    /// A world opened to read only writes nothing, snapshots included.
    fn put_snapshot(&self, run_id: &str, key: &str, snapshot: &StoredSnapshot) -> Result<()> {
        if self.db.options.read_only {
            return Ok(());
        }
        self.query(
            "keeping a fold snapshot",
            &format!(
                "INSERT INTO {0} AS f (run_id, fold_key, sequence, state) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (run_id, fold_key) DO UPDATE SET sequence = excluded.sequence, state = excluded.state \
                 WHERE f.sequence < excluded.sequence",
                self.db.table("fold_snapshots")
            ),
            &[&run_id, &key, &(snapshot.sequence as i64), &snapshot.state],
        )?;
        Ok(())
    }
}

fn index_entry(row: &tokio_postgres::Row) -> Result<IndexEntry> {
    Ok(IndexEntry {
        index: col(row, 0)?,
        key: col(row, 1)?,
        value: col(row, 2)?,
        run_id: col(row, 3)?,
        sequence: col::<i64>(row, 4)? as u64,
    })
}

fn catalog_row(row: &tokio_postgres::Row) -> Result<CatalogRow> {
    Ok(CatalogRow {
        run_id: col(row, 0)?,
        last_sequence: col::<i64>(row, 1)? as u64,
        first_recorded_at: col::<Option<String>>(row, 2)?.unwrap_or_default(),
        last_recorded_at: col::<Option<String>>(row, 3)?.unwrap_or_default(),
        status: col::<Option<String>>(row, 4)?.unwrap_or_default(),
    })
}
