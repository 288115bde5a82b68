//! Where events are kept: the backend trait and its implementations.
//!
//! A backend stores rows and answers a handful of questions inside a write transaction (the last
//! sequence of a run, the row holding an idempotency key). It makes no decisions: the append rules
//! (validation, canonical form, ids, idempotency, density) live in [`crate::events`] and are
//! written once over these traits. `sqlite` is the local world, `memory` the virtual one; a
//! PostgreSQL backend would be a third.

pub mod postgres;
pub mod sqlite;
pub mod r#virtual;

use crate::catalog::{CatalogNote, CatalogRow, RunQuery};
use crate::error::Result;

/// A stored row found by its idempotency key.
#[derive(Debug, Clone)]
pub struct KeyedEvent {
    pub sequence: u64,
    pub digest: String,
    pub envelope: String,
}

/// A stored row, as verification reads it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub run_id: String,
    pub sequence: u64,
    pub event_id: String,
    pub event_type: String,
    pub key: Option<String>,
    pub digest: Option<String>,
    pub recorded_at: String,
    pub envelope: String,
}

/// A row, borrowed: one about to be inserted, or one the store lends while a read visits it.
#[derive(Debug, Clone, Copy)]
pub struct RowRef<'a> {
    pub run_id: &'a str,
    pub sequence: u64,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub key: Option<&'a str>,
    pub digest: Option<&'a str>,
    pub recorded_at: &'a str,
    /// The envelope's canonical JSON, returned as is by listings.
    pub envelope: &'a str,
}

#[cfg(test)]
impl<'a> RowRef<'a> {
    /// A row of type `t` without a key, recorded at a fixed time: what the store tests insert.
    pub fn plain(run_id: &'a str, sequence: u64, event_id: &'a str, envelope: &'a str) -> RowRef<'a> {
        RowRef {
            run_id,
            sequence,
            event_id,
            event_type: "t",
            key: None,
            digest: None,
            recorded_at: "2026-01-01T00:00:00.000Z",
            envelope,
        }
    }
}

impl StoredEvent {
    /// This row, borrowed.
    pub fn as_ref(&self) -> RowRef<'_> {
        RowRef {
            run_id: &self.run_id,
            sequence: self.sequence,
            event_id: &self.event_id,
            event_type: &self.event_type,
            key: self.key.as_deref(),
            digest: self.digest.as_deref(),
            recorded_at: &self.recorded_at,
            envelope: &self.envelope,
        }
    }
}

/// One stream (run or session) in the store.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamSummary {
    pub run_id: String,
    pub event_count: u64,
    pub last_sequence: u64,
    pub first_recorded_at: String,
    pub last_recorded_at: String,
}

/// An entry of a named index: a key, its value, and the stream whose event wrote it last. Entries
/// are written in the same transaction as that event, so an index never runs ahead of or behind
/// the log; an entry belongs to its stream, and no other stream's event may change it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IndexEntry {
    pub index: String,
    pub key: String,
    pub value: String,
    pub run_id: String,
    pub sequence: u64,
}

/// An index write staged in a transaction, applied at its commit: `value` `None` removes the
/// entry. Later writes to a key win.
#[derive(Debug, Clone)]
pub struct StagedIndex {
    pub index: String,
    pub key: String,
    pub value: Option<String>,
    pub run_id: String,
    pub sequence: u64,
}

impl StagedIndex {
    pub fn new(index: &str, key: &str, value: Option<&str>, run_id: &str, sequence: u64) -> Self {
        Self {
            index: index.to_string(),
            key: key.to_string(),
            value: value.map(str::to_string),
            run_id: run_id.to_string(),
            sequence,
        }
    }

    /// The holder of `index`/`key` that `staged` leaves: `None` when none of it writes the key,
    /// `Some(None)` when its last write to it removes it.
    pub fn holder_after(staged: &[StagedIndex], index: &str, key: &str) -> Option<Option<String>> {
        staged
            .iter()
            .rev()
            .find(|w| w.index == index && w.key == key)
            .map(|w| w.value.as_ref().map(|_| w.run_id.clone()))
    }
}

/// Which entries of an index a listing wants: those of `index` (with `value`, if given) whose
/// key comes after `after` in the listing's order, at most `limit`, ordered by key.
#[derive(Debug, Clone, Copy)]
pub struct IndexQuery<'a> {
    pub index: &'a str,
    pub value: Option<&'a str>,
    pub after: Option<&'a str>,
    pub limit: u64,
    pub descending: bool,
}

impl IndexQuery<'_> {
    /// Whether an entry of this index with `key` and `value` is one the listing wants.
    pub fn wants(&self, key: &str, value: &str) -> bool {
        self.value.is_none_or(|v| v == value)
            && self
                .after
                .is_none_or(|a| if self.descending { key < a } else { key > a })
    }
}

/// The operations an append needs inside one write transaction.
pub trait LogTx {
    /// The highest committed-or-pending sequence of `run_id`, 0 when it has none.
    fn last_sequence(&mut self, run_id: &str) -> Result<u64>;
    /// The row of `run_id` holding `key`, if any (pending rows of this transaction included).
    fn find_by_key(&mut self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>>;
    /// Insert a row. Fails, changing nothing, if `(run_id, sequence)` or `(run_id, key)` exists.
    fn insert(&mut self, row: &RowRef<'_>) -> Result<()>;
    /// The sequence of the terminal event of `run_id` (`node` empty) or of one of its nodes.
    fn terminal(&mut self, run_id: &str, node: &str) -> Result<Option<u64>>;
    /// Record a terminal event. Fails, changing nothing, if that run or node already has one.
    fn insert_terminal(&mut self, run_id: &str, node: &str, sequence: u64, event_type: &str) -> Result<()>;
    /// What `run_id` has committed and not released of `model`'s budget estimates.
    fn estimate(&mut self, run_id: &str, model: &str) -> Result<u64>;
    /// The conservative total of `run_id`: what is open, over its models.
    fn estimate_total(&mut self, run_id: &str) -> Result<u64>;
    /// Commit (`released` false) or release `amount` of `model`. The caller has checked that the
    /// open amount stays within `0 ..= 2^53 - 1`.
    fn add_estimate(&mut self, run_id: &str, model: &str, amount: u64, released: bool) -> Result<()>;
    /// The token counts `run_id`'s events have added so far, in the order of
    /// [`crate::vocabulary::USAGE_FIELDS`] (pending rows of this transaction included).
    fn usage(&mut self, run_id: &str) -> Result<[u64; 4]>;
    /// Add one call's token counts to `run_id`'s. The caller has checked that the totals stay
    /// within `0 ..= 2^53 - 1`. Fails only as the store fails (never refused, as an insert is).
    fn add_usage(&mut self, run_id: &str, tokens: [u64; 4]) -> Result<()>;
    /// The stream holding entry `key` of `index`, if any (pending writes of this transaction
    /// included).
    fn index_holder(&mut self, index: &str, key: &str) -> Result<Option<String>>;
    /// Set entry `key` of `index` to `value`, held by `run_id` at `sequence`; `None` removes it.
    /// The caller has checked that no other stream holds it.
    fn put_index(&mut self, index: &str, key: &str, value: Option<&str>, run_id: &str, sequence: u64) -> Result<()>;
    /// Note in the runs catalog that `run_id` now ends at `sequence`, an event recorded at
    /// `recorded_at` that changes its status by `status`; written with the transaction's commit,
    /// one row per stream (see [`crate::catalog::CatalogStage`]), undone with its append.
    fn catalog(&mut self, note: CatalogNote) -> Result<()>;
    /// Open a savepoint for one append.
    fn savepoint(&mut self) -> Result<()>;
    /// Keep what the append since the savepoint wrote.
    fn release(&mut self) -> Result<()>;
    /// Undo what the append since the savepoint wrote.
    fn rollback_to(&mut self) -> Result<()>;
    /// Whether this run of the transaction's body may be undone and the body run again (see
    /// [`LogWriter::transaction`]): the body then keeps what it needs for another run.
    fn may_run_again(&self) -> bool {
        false
    }
}

/// How durable a commit is when its append resolves, on every kind of world: a local world's
/// SQLite `synchronous` setting, a PostgreSQL world's `synchronous_commit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Every commit is flushed to disk before it returns (one flush per group of appends), so no
    /// crash loses a commit that returned.
    Full,
    /// A commit returns before it is flushed: a crash of the process loses nothing, a power loss,
    /// a crash of the kernel or of the database server may lose the last commits.
    Normal,
}

/// What a transaction's body is about to ask, so that a backend paying a network round trip per
/// question can ask them all at once, before the body runs. The body may still ask about
/// anything else; that only costs more.
#[derive(Debug, Default)]
pub struct Scope<'a> {
    /// The streams appended to.
    pub runs: Vec<&'a str>,
    /// Runs named as an owner (see [`crate::events::OWNER_INDEX`]), whose events are
    /// counted: they must be counted under their locks, never from what a backend remembers, or
    /// a run another host deleted would be taken to exist.
    pub owners: Vec<&'a str>,
    /// `(stream, idempotency key)` of keyed appends.
    pub keys: Vec<(&'a str, &'a str)>,
    /// `(stream, node)` of node terminal events (a stream's own end is asked of every stream).
    pub nodes: Vec<(&'a str, &'a str)>,
    /// Streams whose budget estimates are asked.
    pub estimates: Vec<&'a str>,
    /// Whether an append of the group stores an artifact once its checks against the stored rows
    /// pass: those checks must then be made on what is stored, never on what a backend remembers,
    /// or an append refused after all would leave its artifact behind.
    pub stores_artifacts: bool,
}

impl Scope<'_> {
    /// Nothing known in advance.
    pub const NONE: Scope<'static> = Scope {
        runs: Vec::new(),
        owners: Vec::new(),
        keys: Vec::new(),
        nodes: Vec::new(),
        estimates: Vec::new(),
        stores_artifacts: false,
    };
}

/// The write side of a backend, owned by the world's single writer thread.
pub trait LogWriter: Send {
    /// Run `body` inside one write transaction and commit it; roll back if it fails. `scope`
    /// says what `body` will ask.
    ///
    /// A backend may run `body` more than once: one that answered from what it remembers of the
    /// streams, rather than from reads under their locks, finds at commit whether another writer
    /// got there first, and then undoes that run and runs `body` again on what is stored. Only
    /// the last run's writes are kept, and each run starts on a fresh transaction; the body
    /// starts over each time, and [`LogTx::may_run_again`] tells it whether a run may be undone.
    fn transaction(&mut self, scope: &Scope<'_>, body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Result<()>;

    /// As [`LogWriter::transaction`], but only if the transaction runs without waiting: for a
    /// lock another process holds, a sync to disk, a network round trip, or any other work of the
    /// backend's own. `None` when it cannot (`body` has not run and nothing was written), and then
    /// the caller commits through [`LogWriter::transaction`] on a thread that may wait. For the
    /// caller's own thread, which must not be held up (see `World::append_awaited`). A backend
    /// whose commits always wait answers `None` every time.
    fn transaction_if_immediate(
        &mut self,
        scope: &Scope<'_>,
        body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>,
    ) -> Option<Result<()>>;

    /// Whether a commit can be done within about a hundred microseconds, with no network round
    /// trip: then a caller that awaits one append may wait for it in place rather than be woken
    /// (see `World::append_awaited`). A backend across a network answers `false`: waiting in place
    /// for its round trip would only hold a core that the rest of the commit needs.
    fn commits_quickly(&self) -> bool {
        true
    }

    /// Remove every row of each of `runs` in one transaction: its events, its catalog row, its
    /// terminals, estimates and token totals, its fold snapshots and the index entries it holds.
    /// Returns how many events each had (0 for one that had none). A later append to one of them
    /// starts a new stream at sequence 1.
    fn delete_streams(&mut self, runs: &[&str]) -> Result<Vec<u64>>;

    /// Give the space that deleted rows freed back to the operating system (where the backend
    /// keeps it for reuse otherwise).
    fn compact(&mut self) -> Result<()> {
        Ok(())
    }
}

/// What was committed after a mark, for live views: the streams that have new rows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Changes {
    /// Where the next call starts (SQLite: the greatest rowid of `events`).
    pub mark: i64,
    /// The streams with rows committed after the mark given, in no order; `None` when anything
    /// may have changed (rows were removed, or too many were added to list).
    pub streams: Option<Vec<String>>,
}

/// A fold snapshot as stored: the sequence it was taken at and its text (see
/// [`crate::vocabulary::Materializer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSnapshot {
    pub sequence: u64,
    pub state: String,
}

/// Snapshots of runs' folds, kept beside the log so that a fold need not read a long log from
/// its start. A cache: never part of the log, checked against the log before it is used, and
/// safe to lose. Each is kept under a key that names the fold's rules and prices.
pub trait FoldSnapshots: Send + Sync {
    /// The snapshot of `run_id` under `key`, if there is one.
    fn snapshot(&self, run_id: &str, key: &str) -> Result<Option<StoredSnapshot>>;
    /// Keep `snapshot` of `run_id` under `key`, unless one of a later sequence is kept already.
    fn put_snapshot(&self, run_id: &str, key: &str, snapshot: &StoredSnapshot) -> Result<()>;
}

/// Word of what other processes commit, for a backend that hears of it as it happens (a database
/// server's notifications). A hint only: what changed is always read from the store.
pub trait Announcer: Send + Sync {
    /// Call `done` once: with the streams announced after this call (empty: any may have
    /// changed, as after a lost connection), or with `None` once `timeout` has passed without.
    fn next(&self, timeout: std::time::Duration, done: Box<dyn FnOnce(Option<Vec<String>>) + Send>);
}

/// The read side of a backend, shared by reader threads.
pub trait LogReader: Send + Sync {
    /// Call `sink` with each envelope of `run_id` after `after`, in sequence order, at most `limit`.
    /// A backend that can read the envelope alone more cheaply than the whole row overrides this.
    fn envelopes(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        self.rows(run_id, after, limit, &mut |row| sink(row.envelope))
    }
    /// Call `sink` with each full row of `run_id` after `after`, in sequence order, at most `limit`.
    fn rows(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
    ) -> Result<()>;
    /// As [`LogReader::rows`], for a read that passes over the whole store once (an export): a
    /// backend that maps its files reads without the map here, so that the pass does not leave
    /// the whole store resident in the process.
    fn rows_once(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
    ) -> Result<()> {
        self.rows(run_id, after, limit, sink)
    }
    /// Every stream in the store, ordered by id, as its rows say (not its catalog row).
    fn streams(&self) -> Result<Vec<StreamSummary>>;
    /// The catalog rows a query wants, in its order, at most its limit.
    fn catalog_page(&self, query: &RunQuery<'_>) -> Result<Vec<CatalogRow>>;
    /// The catalog row of `run_id`, if it has one.
    fn catalog_row(&self, run_id: &str) -> Result<Option<CatalogRow>>;
    /// The highest committed sequence of `run_id`, 0 when it has none.
    fn last_sequence(&self, run_id: &str) -> Result<u64>;
    /// The committed row of `run_id` appended with idempotency key `key`, if any.
    fn find_by_key(&self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>>;
    /// Entry `key` of `index`, if there is one.
    fn index_entry(&self, index: &str, key: &str) -> Result<Option<IndexEntry>>;
    /// The entries of an index a query wants.
    fn index_entries(&self, query: &IndexQuery<'_>) -> Result<Vec<IndexEntry>>;
    /// The entries `run_id` holds, of every index, ordered by index and key.
    fn held_index_entries(&self, run_id: &str) -> Result<Vec<IndexEntry>>;
    /// What was committed since `since` (a [`Changes::mark`] this returned before; none for the
    /// first call, which only takes the mark). A backend that cannot tell says anything may have.
    fn changes(&self, since: Option<i64>) -> Result<Changes> {
        let _ = since;
        Ok(Changes { mark: 0, streams: None })
    }
    /// Call `sink` with the stream and envelope of every stored row that may refer to an artifact
    /// (whose envelope holds `"artifact://`), in any order. A backend that can filter the rows
    /// itself overrides this.
    fn artifact_mentions(&self, sink: &mut dyn FnMut(&str, &str) -> Result<()>) -> Result<()> {
        for s in self.streams()? {
            self.rows(&s.run_id, 0, None, &mut |row| {
                if row.envelope.contains("\"artifact://") {
                    sink(row.run_id, row.envelope)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }
    /// Write a copy of the whole store, as of one commit, to the file `path` (a local world's
    /// backup). A backend that cannot says so.
    fn copy_into(&self, path: &std::path::Path) -> Result<()> {
        Err(crate::error::WorldError::Path {
            message: format!("this kind of world cannot be copied into {}", path.display()),
        })
    }
    /// The backend's own check of how it stores the rows (for SQLite, `PRAGMA quick_check`, or
    /// with `thorough` `PRAGMA integrity_check`, and that every run's rows found through the
    /// index are the rows the table holds): what it found wrong, one line each.
    fn check_storage(&self, thorough: bool) -> Result<Vec<String>> {
        let _ = thorough;
        Ok(Vec::new())
    }
    /// Where this backend keeps fold snapshots, if it keeps them.
    fn fold_snapshots(&self) -> Option<&dyn FoldSnapshots> {
        None
    }
    /// How this backend hears of other processes' commits as they happen, if it does (else they
    /// are found by asking [`LogReader::changes`], as a local world does when its files change).
    fn announcer(&self) -> Option<std::sync::Arc<dyn Announcer>> {
        None
    }
    /// Let go of what the reader keeps between reads (pooled connections and their file
    /// descriptors): its world has closed. A read still running finishes, and keeps nothing.
    fn close(&self) {}
}

/// Checks that a stream's rows come in dense sequence order: a read after `after` must find
/// `after + 1`, then `after + 2`, and so on. A damaged index can make a read skip rows or find
/// them twice; a listing that went on regardless would return a log with holes as if whole.
#[derive(Debug, Clone)]
pub struct Dense<'a> {
    run_id: &'a str,
    next: u64,
}

impl<'a> Dense<'a> {
    /// Rows of `run_id` read after sequence `after`.
    pub fn after(run_id: &'a str, after: u64) -> Dense<'a> {
        Dense {
            run_id,
            next: after + 1,
        }
    }

    /// The next row read has `sequence`: refused unless it is the next one.
    pub fn check(&mut self, sequence: u64) -> Result<()> {
        if sequence != self.next {
            return Err(crate::error::WorldError::EventLogCorrupt {
                run_id: Some(self.run_id.to_string()),
                sequence: Some(self.next),
                reason: format!(
                    "the store returned sequence {sequence} where {} comes next: its rows are damaged (run `little verify --thorough`)",
                    self.next
                ),
            });
        }
        self.next += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(sequence: u64, key: Option<&'a str>, envelope: &'a str) -> RowRef<'a> {
        RowRef {
            run_id: "run_a",
            sequence,
            event_id: envelope,
            event_type: "t",
            key,
            digest: key.map(|_| "d"),
            recorded_at: "2026-11-29T00:00:00.000Z",
            envelope,
        }
    }

    /// A group commits its one-row appends without savepoints, so a refused insert must change
    /// nothing and leave the transaction open for the appends after it.
    fn a_refused_insert_leaves_the_transaction_going(writer: &mut dyn LogWriter, reader: &dyn LogReader) {
        let mut refusals = Vec::new();
        writer
            .transaction(&Scope::NONE, &mut |tx| {
                tx.insert(&row(1, Some("k"), "first"))?;
                refusals.push(tx.insert(&row(1, None, "same sequence")).unwrap_err().code());
                refusals.push(tx.insert(&row(2, Some("k"), "same key")).unwrap_err().code());
                tx.insert(&row(2, None, "second"))?;
                assert_eq!(tx.last_sequence("run_a")?, 2);
                Ok(())
            })
            .unwrap();
        assert_eq!(refusals, ["RUNTIME_INTEGRITY", "RUNTIME_INTEGRITY"]);
        let mut stored = Vec::new();
        reader
            .envelopes("run_a", 0, None, &mut |e| {
                stored.push(e.to_string());
                Ok(())
            })
            .unwrap();
        assert_eq!(stored, ["first", "second"]);
    }

    #[test]
    fn sqlite_a_refused_insert_leaves_the_transaction_going() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = sqlite::open(dir.path(), sqlite::Durability::Normal).unwrap();
        a_refused_insert_leaves_the_transaction_going(&mut writer, &reader);
    }

    #[test]
    fn sqlite_changes_name_the_streams_with_new_rows_since_a_mark() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = sqlite::open(dir.path(), sqlite::Durability::Normal).unwrap();
        let mut append = |rows: &[(&'static str, u64)]| {
            writer
                .transaction(&Scope::NONE, &mut |tx| {
                    for (run, sequence) in rows {
                        tx.insert(&RowRef {
                            run_id: run,
                            ..row(*sequence, None, "e")
                        })?;
                    }
                    Ok(())
                })
                .unwrap()
        };
        append(&[("run_a", 1), ("run_b", 1)]);
        let first = reader.changes(None).unwrap();
        assert_eq!(
            first,
            Changes {
                mark: 2,
                streams: Some(vec![])
            }
        );
        assert_eq!(reader.changes(Some(2)).unwrap(), first);
        append(&[("run_c", 1), ("run_a", 2), ("run_c", 2)]);
        let next = reader.changes(Some(2)).unwrap();
        assert_eq!(next.mark, 5);
        let mut streams = next.streams.unwrap();
        streams.sort();
        assert_eq!(streams, ["run_a", "run_c"]);
        // A mark past the last row: rows were removed, so anything may have changed.
        assert_eq!(reader.changes(Some(9)).unwrap(), Changes { mark: 5, streams: None });
        // The memory store cannot tell.
        assert_eq!(r#virtual::VirtualLog::new().changes(Some(1)).unwrap().streams, None);
    }

    #[test]
    fn sqlite_the_writer_runs_no_triggers() {
        // A trigger would give each insert a statement journal (see `schema::fence_writer`); the
        // writer skips them, and a trigger that refuses every insert shows it.
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, _reader) = sqlite::open(dir.path(), sqlite::Durability::Normal).unwrap();
        let other = rusqlite::Connection::open(dir.path().join("events/events.db")).unwrap();
        // A writer of this schema that runs the triggers, as earlier builds did.
        other
            .create_scalar_function(
                "little_world_writer",
                1,
                rusqlite::functions::FunctionFlags::SQLITE_UTF8,
                |ctx| Ok(ctx.get::<i64>(0)? == 4),
            )
            .unwrap();
        other
            .execute_batch("CREATE TRIGGER refuse BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'refused'); END;")
            .unwrap();
        let refused = other.execute(
            "INSERT INTO events (run_id, sequence, event_id, type, recorded_at, envelope) VALUES ('run_x', 1, 'e', 'T', '', '{}')",
            [],
        );
        assert!(refused.unwrap_err().to_string().contains("refused"));
        for sequence in 1..=2 {
            writer
                .transaction(&Scope::NONE, &mut |tx| tx.insert(&row(sequence, None, "e")))
                .unwrap();
        }
    }

    #[test]
    fn sqlite_an_append_after_a_newer_version_upgraded_the_world_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, _reader) = sqlite::open(dir.path(), sqlite::Durability::Normal).unwrap();
        let mut append =
            |sequence: u64| writer.transaction(&Scope::NONE, &mut |tx| tx.insert(&row(sequence, None, "e")));
        append(1).unwrap();
        // What a later version's upgrade does, from another connection: its tables, the fence of
        // the writers that run the trigger, and its schema version.
        let other = rusqlite::Connection::open(dir.path().join("events/events.db")).unwrap();
        let later = sqlite::schema::SCHEMA_VERSION + 1;
        let upgrade = format!(
            "BEGIN;
             CREATE TABLE later (x INTEGER);
             DROP TRIGGER events_writer;
             CREATE TRIGGER events_writer BEFORE INSERT ON events WHEN NOT little_world_writer({later})
             BEGIN SELECT RAISE(ABORT, 'this world was upgraded by a newer version of @little-workflow/world: append with that version'); END;
             PRAGMA user_version = {later};
             COMMIT;"
        );
        other.execute_batch(&upgrade).unwrap();
        for _ in 0..2 {
            let err = append(2).unwrap_err();
            assert_eq!(err.code(), "WORLD_PATH", "{err}");
            assert!(err.to_string().contains("upgraded by a newer version"), "{err}");
            assert!(err.to_string().contains(&format!("to schema {later}")), "{err}");
        }
        let count: i64 = other
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count, 1);
    }

    #[test]
    fn virtual_a_refused_insert_leaves_the_transaction_going() {
        let log = r#virtual::VirtualLog::new();
        a_refused_insert_leaves_the_transaction_going(&mut log.clone(), &log);
    }
}
