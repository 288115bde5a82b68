//! The virtual world's event store: the same rows as SQLite, kept in memory.
//!
//! A transaction holds the store's lock from begin to commit and stages its rows, so readers only
//! ever see committed rows, and a savepoint is a mark in the staged list.

use super::{
    FoldSnapshots, IndexEntry, IndexQuery, KeyedEvent, LogReader, LogTx, LogWriter, RowRef, Scope, StagedIndex,
    StoredEvent, StoredSnapshot, StreamSummary,
};
use crate::catalog::{CatalogNote, CatalogRow, CatalogStage, RunQuery};
use crate::error::{Result, WorldError};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Default)]
struct Stream {
    rows: Vec<StoredEvent>,
    keys: HashMap<String, usize>,
    /// Terminal events by node id ('' for the stream's own end).
    terminals: HashMap<String, u64>,
    /// Budget estimates by model: what is committed and not released.
    estimates: HashMap<String, u64>,
    /// Token counts of the stream's model calls so far (see [`LogTx::usage`]).
    usage: [u64; 4],
    /// The stream's status in the runs catalog.
    status: String,
}

type Streams = BTreeMap<String, Stream>;

/// Index entries by `(index, key)`: value, stream, sequence.
type Index = BTreeMap<(String, String), (String, String, u64)>;

#[derive(Default)]
struct Store {
    streams: Streams,
    index: Index,
    /// Fold snapshots by `(stream, key)`.
    snapshots: HashMap<(String, String), StoredSnapshot>,
}

/// A shared in-memory store; clone the handle to get another writer or reader onto it.
#[derive(Clone, Default)]
pub struct VirtualLog {
    store: Arc<Mutex<Store>>,
}

impl VirtualLog {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct VirtualTx<'a> {
    streams: &'a Streams,
    index: &'a Index,
    staged_index: Vec<StagedIndex>,
    staged: Vec<StoredEvent>,
    staged_terminals: Vec<(String, String, u64)>,
    /// Run, model, amount, released.
    staged_estimates: Vec<(String, String, u64, bool)>,
    staged_usage: Vec<(String, [u64; 4])>,
    catalog: CatalogStage,
    mark: (usize, usize, usize, usize, usize, usize),
}

impl LogTx for VirtualTx<'_> {
    fn last_sequence(&mut self, run_id: &str) -> Result<u64> {
        let staged = self
            .staged
            .iter()
            .rev()
            .find(|r| r.run_id == run_id)
            .map(|r| r.sequence);
        Ok(staged.unwrap_or_else(|| {
            self.streams
                .get(run_id)
                .and_then(|s| s.rows.last())
                .map_or(0, |r| r.sequence)
        }))
    }

    fn find_by_key(&mut self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
        if let Some(r) = self
            .staged
            .iter()
            .find(|r| r.run_id == run_id && r.key.as_deref() == Some(key))
        {
            return Ok(Some(keyed(r)));
        }
        Ok(committed_by_key(self.streams, run_id, key))
    }

    fn insert(&mut self, row: &RowRef<'_>) -> Result<()> {
        if row.sequence != self.last_sequence(row.run_id)? + 1 {
            return Err(WorldError::RuntimeIntegrity {
                reason: format!(
                    "{} sequence {} would leave a hole or a duplicate",
                    row.run_id, row.sequence
                ),
            });
        }
        if let Some(key) = row.key {
            let staged = self
                .staged
                .iter()
                .any(|r| r.run_id == row.run_id && r.key.as_deref() == Some(key));
            if staged || self.streams.get(row.run_id).is_some_and(|s| s.keys.contains_key(key)) {
                return Err(WorldError::RuntimeIntegrity {
                    reason: format!("{} idempotency key {key:?} is already taken", row.run_id),
                });
            }
        }
        self.staged.push(StoredEvent {
            run_id: row.run_id.to_string(),
            sequence: row.sequence,
            event_id: row.event_id.to_string(),
            event_type: row.event_type.to_string(),
            key: row.key.map(str::to_string),
            digest: row.digest.map(str::to_string),
            recorded_at: row.recorded_at.to_string(),
            envelope: row.envelope.to_string(),
        });
        Ok(())
    }

    fn terminal(&mut self, run_id: &str, node: &str) -> Result<Option<u64>> {
        if let Some((_, _, seq)) = self.staged_terminals.iter().find(|(r, n, _)| r == run_id && n == node) {
            return Ok(Some(*seq));
        }
        Ok(self.streams.get(run_id).and_then(|s| s.terminals.get(node).copied()))
    }

    fn insert_terminal(&mut self, run_id: &str, node: &str, sequence: u64, _event_type: &str) -> Result<()> {
        if self.terminal(run_id, node)?.is_some() {
            return Err(WorldError::RuntimeIntegrity {
                reason: format!("{run_id} already has a terminal event for node {node:?}"),
            });
        }
        self.staged_terminals
            .push((run_id.to_string(), node.to_string(), sequence));
        Ok(())
    }

    fn estimate(&mut self, run_id: &str, model: &str) -> Result<u64> {
        let stored = self
            .streams
            .get(run_id)
            .and_then(|s| s.estimates.get(model).copied())
            .unwrap_or(0);
        let staged = self
            .staged_estimates
            .iter()
            .filter(|(r, m, ..)| r == run_id && m == model);
        Ok(staged.fold(stored, |open, &(.., amount, released)| apply(open, amount, released)))
    }

    fn estimate_total(&mut self, run_id: &str) -> Result<u64> {
        let mut open: HashMap<&str, u64> = self
            .streams
            .get(run_id)
            .map(|s| s.estimates.iter().map(|(m, &o)| (m.as_str(), o)).collect())
            .unwrap_or_default();
        for (_, m, amount, released) in self.staged_estimates.iter().filter(|(r, ..)| r == run_id) {
            let o = open.entry(m.as_str()).or_default();
            *o = apply(*o, *amount, *released);
        }
        Ok(open.values().sum())
    }

    fn add_estimate(&mut self, run_id: &str, model: &str, amount: u64, released: bool) -> Result<()> {
        self.staged_estimates
            .push((run_id.to_string(), model.to_string(), amount, released));
        Ok(())
    }

    fn usage(&mut self, run_id: &str) -> Result<[u64; 4]> {
        let stored = self.streams.get(run_id).map_or([0; 4], |s| s.usage);
        Ok(self
            .staged_usage
            .iter()
            .filter(|(r, _)| r == run_id)
            .fold(stored, |sum, (_, add)| add_counts(sum, *add)))
    }

    fn add_usage(&mut self, run_id: &str, tokens: [u64; 4]) -> Result<()> {
        self.staged_usage.push((run_id.to_string(), tokens));
        Ok(())
    }

    fn index_holder(&mut self, index: &str, key: &str) -> Result<Option<String>> {
        if let Some(holder) = StagedIndex::holder_after(&self.staged_index, index, key) {
            return Ok(holder);
        }
        Ok(self
            .index
            .get(&(index.to_string(), key.to_string()))
            .map(|(_, run, _)| run.clone()))
    }

    fn put_index(&mut self, index: &str, key: &str, value: Option<&str>, run_id: &str, sequence: u64) -> Result<()> {
        self.staged_index
            .push(StagedIndex::new(index, key, value, run_id, sequence));
        Ok(())
    }

    fn catalog(&mut self, note: CatalogNote) -> Result<()> {
        self.catalog.note(note);
        Ok(())
    }

    fn savepoint(&mut self) -> Result<()> {
        self.mark = (
            self.staged.len(),
            self.staged_terminals.len(),
            self.staged_estimates.len(),
            self.staged_usage.len(),
            self.staged_index.len(),
            self.catalog.len(),
        );
        Ok(())
    }

    fn release(&mut self) -> Result<()> {
        Ok(())
    }

    fn rollback_to(&mut self) -> Result<()> {
        self.staged.truncate(self.mark.0);
        self.staged_terminals.truncate(self.mark.1);
        self.staged_estimates.truncate(self.mark.2);
        self.staged_usage.truncate(self.mark.3);
        self.staged_index.truncate(self.mark.4);
        self.catalog.truncate(self.mark.5);
        Ok(())
    }
}

/// Token counts added up (the writer has checked that they fit).
fn add_counts(a: [u64; 4], b: [u64; 4]) -> [u64; 4] {
    std::array::from_fn(|i| a[i].saturating_add(b[i]))
}

/// An open amount after committing (or releasing) `amount`, which the writer has checked.
fn apply(open: u64, amount: u64, released: bool) -> u64 {
    if released {
        open.saturating_sub(amount)
    } else {
        open.saturating_add(amount)
    }
}

impl LogWriter for VirtualLog {
    fn transaction(&mut self, _scope: &Scope<'_>, body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Result<()> {
        let mut store = self.lock();
        let Store { streams, index, .. } = &mut *store;
        let mut tx = VirtualTx {
            streams,
            index,
            staged_index: Vec::new(),
            staged: Vec::new(),
            staged_terminals: Vec::new(),
            staged_estimates: Vec::new(),
            staged_usage: Vec::new(),
            catalog: CatalogStage::default(),
            mark: (0, 0, 0, 0, 0, 0),
        };
        body(&mut tx)?;
        let VirtualTx {
            staged,
            staged_terminals,
            staged_estimates,
            staged_usage,
            staged_index,
            catalog,
            ..
        } = tx;
        for w in staged_index {
            match w.value {
                Some(value) => index.insert((w.index, w.key), (value, w.run_id, w.sequence)),
                None => index.remove(&(w.index, w.key)),
            };
        }
        for (run, tokens) in staged_usage {
            let stream = streams.entry(run).or_default();
            stream.usage = add_counts(stream.usage, tokens);
        }
        for (run, node, seq) in staged_terminals {
            streams.entry(run).or_default().terminals.insert(node, seq);
        }
        for (run, model, amount, released) in staged_estimates {
            let open = streams.entry(run).or_default().estimates.entry(model).or_default();
            *open = apply(*open, amount, released);
        }
        for row in staged {
            let stream = streams.entry(row.run_id.clone()).or_default();
            if let Some(k) = &row.key {
                stream.keys.insert(k.clone(), stream.rows.len());
            }
            stream.rows.push(row);
        }
        for w in catalog.writes() {
            let stream = streams.entry(w.run_id).or_default();
            stream.status = w.status.apply(&stream.status).to_string();
        }
        Ok(())
    }

    fn delete_streams(&mut self, runs: &[&str]) -> Result<Vec<u64>> {
        let mut store = self.lock();
        let removed = runs
            .iter()
            .map(|r| store.streams.remove(*r).map_or(0, |s| s.rows.len() as u64))
            .collect();
        let gone: std::collections::HashSet<&str> = runs.iter().copied().collect();
        store.index.retain(|_, (_, run, _)| !gone.contains(run.as_str()));
        store.snapshots.retain(|(run, _), _| !gone.contains(run.as_str()));
        Ok(removed)
    }

    /// A memory commit takes only the map's lock, which no one holds for long.
    fn transaction_if_immediate(
        &mut self,
        scope: &Scope<'_>,
        body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>,
    ) -> Option<Result<()>> {
        Some(self.transaction(scope, body))
    }
}

impl FoldSnapshots for VirtualLog {
    fn snapshot(&self, run_id: &str, key: &str) -> Result<Option<StoredSnapshot>> {
        Ok(self
            .lock()
            .snapshots
            .get(&(run_id.to_string(), key.to_string()))
            .cloned())
    }

    fn put_snapshot(&self, run_id: &str, key: &str, snapshot: &StoredSnapshot) -> Result<()> {
        let mut store = self.lock();
        let kept = store
            .snapshots
            .entry((run_id.to_string(), key.to_string()))
            .or_insert_with(|| snapshot.clone());
        if kept.sequence < snapshot.sequence {
            *kept = snapshot.clone();
        }
        Ok(())
    }
}

impl LogReader for VirtualLog {
    fn fold_snapshots(&self) -> Option<&dyn FoldSnapshots> {
        Some(self)
    }

    fn rows(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
    ) -> Result<()> {
        let store = self.lock();
        let Some(stream) = store.streams.get(run_id) else {
            return Ok(());
        };
        let start = (after.min(stream.rows.len() as u64)) as usize;
        let take = limit.map_or(usize::MAX, |l| l.min(usize::MAX as u64) as usize);
        for row in stream.rows[start..].iter().take(take) {
            sink(row.as_ref())?;
        }
        Ok(())
    }

    fn streams(&self) -> Result<Vec<StreamSummary>> {
        let store = self.lock();
        Ok(store
            .streams
            .iter()
            .filter(|(_, s)| !s.rows.is_empty())
            .map(|(id, s)| StreamSummary {
                run_id: id.clone(),
                event_count: s.rows.len() as u64,
                last_sequence: s.rows.last().map_or(0, |r| r.sequence),
                first_recorded_at: s
                    .rows
                    .iter()
                    .map(|r| r.recorded_at.as_str())
                    .min()
                    .unwrap_or("")
                    .to_string(),
                last_recorded_at: s
                    .rows
                    .iter()
                    .map(|r| r.recorded_at.as_str())
                    .max()
                    .unwrap_or("")
                    .to_string(),
            })
            .collect())
    }

    fn catalog_page(&self, query: &RunQuery<'_>) -> Result<Vec<CatalogRow>> {
        let store = self.lock();
        let mut rows: Vec<CatalogRow> = store
            .streams
            .iter()
            .filter_map(|(id, s)| catalog_row(id, s))
            .filter(|r| query.wants(r))
            .collect();
        crate::catalog::sort(&mut rows, query.order);
        rows.truncate(query.limit.min(usize::MAX as u64) as usize);
        Ok(rows)
    }

    fn catalog_row(&self, run_id: &str) -> Result<Option<CatalogRow>> {
        Ok(self.lock().streams.get(run_id).and_then(|s| catalog_row(run_id, s)))
    }

    fn last_sequence(&self, run_id: &str) -> Result<u64> {
        Ok(self
            .lock()
            .streams
            .get(run_id)
            .and_then(|s| s.rows.last())
            .map_or(0, |r| r.sequence))
    }

    fn find_by_key(&self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
        Ok(committed_by_key(&self.lock().streams, run_id, key))
    }

    fn index_entry(&self, index: &str, key: &str) -> Result<Option<IndexEntry>> {
        let store = self.lock();
        Ok(store
            .index
            .get_key_value(&(index.to_string(), key.to_string()))
            .map(entry))
    }

    fn held_index_entries(&self, run_id: &str) -> Result<Vec<IndexEntry>> {
        let store = self.lock();
        Ok(store
            .index
            .iter()
            .filter(|(_, (_, run, _))| run == run_id)
            .map(entry)
            .collect())
    }

    fn index_entries(&self, query: &IndexQuery<'_>) -> Result<Vec<IndexEntry>> {
        let store = self.lock();
        let of_index = store
            .index
            .range((query.index.to_string(), String::new())..)
            .take_while(|((name, _), _)| name == query.index)
            .filter(|((_, key), (value, ..))| query.wants(key, value));
        let take = query.limit.min(usize::MAX as u64) as usize;
        Ok(if query.descending {
            of_index
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .take(take)
                .map(entry)
                .collect()
        } else {
            of_index.take(take).map(entry).collect()
        })
    }
}

fn entry(((index, key), (value, run, sequence)): (&(String, String), &(String, String, u64))) -> IndexEntry {
    IndexEntry {
        index: index.clone(),
        key: key.clone(),
        value: value.clone(),
        run_id: run.clone(),
        sequence: *sequence,
    }
}

/// A stream's catalog row: from its rows and the status its commits left.
fn catalog_row(id: &str, s: &Stream) -> Option<CatalogRow> {
    let (first, last) = (s.rows.first()?, s.rows.last()?);
    Some(CatalogRow {
        run_id: id.to_string(),
        last_sequence: last.sequence,
        first_recorded_at: first.recorded_at.clone(),
        last_recorded_at: last.recorded_at.clone(),
        status: s.status.clone(),
    })
}

fn keyed(r: &StoredEvent) -> KeyedEvent {
    KeyedEvent {
        sequence: r.sequence,
        digest: r.digest.clone().unwrap_or_default(),
        envelope: r.envelope.clone(),
    }
}

/// The committed row of `run_id` appended with `key`, if any.
fn committed_by_key(streams: &Streams, run_id: &str, key: &str) -> Option<KeyedEvent> {
    streams
        .get(run_id)
        .and_then(|s| s.keys.get(key).map(|&i| keyed(&s.rows[i])))
}
