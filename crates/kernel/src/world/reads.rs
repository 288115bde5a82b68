//! A world's reads of its event store: listings, what changed, run events, folds, and verify.

use super::World;
use crate::bytes::Bytes;
use crate::error::Result;
use crate::events;
use crate::ids;
use crate::runtime::{Output, Ticket};
use crate::store::LogReader;

impl World {
    /// Committed envelopes of `run_id` after `after` (at most `limit`, and with `max_units` about
    /// that many UTF-16 code units of text: see [`events::packed::list_packed_within`]), packed
    /// for JavaScript: completes with `[text, table, text, table, ...]`, one pair per part (see
    /// [`events::packed`]).
    pub fn list_packed(
        &self,
        ticket: Ticket,
        run_id: String,
        after: u64,
        limit: Option<u64>,
        max_units: Option<usize>,
    ) -> Result<()> {
        self.ensure_open()?;
        ids::check_stream_id(&run_id)?;
        let reader = self.inner.reader.clone();
        self.run(ticket, move || {
            let parts = match max_units {
                Some(max) => events::packed::list_packed_within(&*reader, &run_id, after, limit, max)?,
                None => events::packed::list_packed_parallel(&*reader, &run_id, after, limit)?,
            };
            Ok(Output::List(
                parts
                    .into_iter()
                    .flat_map(|p| {
                        let table: Vec<u8> = p.table.iter().flat_map(|f| f.to_le_bytes()).collect();
                        [Output::Json(p.text), Output::Bytes(Bytes::Owned(table))]
                    })
                    .collect(),
            ))
        })
    }

    /// What was committed since `since` (see [`crate::store::LogReader::changes`]), as JSON:
    /// `{"mark":…,"streams":[…] or null}`.
    pub fn changes(&self, ticket: Ticket, since: Option<i64>) -> Result<()> {
        let reader = self.inner.reader.clone();
        self.run(ticket, move || {
            let changes = reader.changes(since)?;
            Ok(Output::Json(
                serde_json::to_string(&changes).expect("changes serialize"),
            ))
        })
    }

    /// Whether this world hears of other processes' commits as they happen (see
    /// [`crate::store::Announcer`]).
    pub fn announces(&self) -> bool {
        self.inner.reader.announcer().is_some()
    }

    /// Complete `ticket` with the streams the next announced commit names (JSON: an array, empty
    /// when any may have changed), or `null` once `timeout` passes without one. A world that
    /// hears of none completes with `null` after `timeout` too.
    pub fn next_announcement(&self, ticket: Ticket, timeout: std::time::Duration) -> Result<()> {
        self.ensure_open()?;
        let completer = self.inner.completer.clone();
        let done = Box::new(move |streams: Option<Vec<String>>| {
            let json = serde_json::to_string(&streams).expect("stream ids serialize");
            completer.complete(vec![(ticket, Ok(Output::Json(json)))]);
        });
        match self.inner.reader.announcer() {
            Some(announcer) => announcer.next(timeout, done),
            None => self.run(ticket, move || {
                std::thread::sleep(timeout.min(std::time::Duration::from_secs(1)));
                Ok(Output::Json("null".into()))
            })?,
        }
        Ok(())
    }

    /// Entry `key` of `index` as JSON (see [`crate::store::IndexEntry`]), or `null`.
    pub fn index_entry(&self, ticket: Ticket, index: String, key: String) -> Result<()> {
        self.ensure_open()?;
        let reader = self.inner.reader.clone();
        self.run(ticket, move || {
            let entry = reader.index_entry(&index, &key)?;
            Ok(Output::Json(
                serde_json::to_string(&entry).expect("an index entry serializes"),
            ))
        })
    }

    /// The entries of `index` (with `value`, if given) after key `after`, at most `limit`, by key
    /// (`descending`: from the greatest), as a JSON array.
    pub fn index_entries(
        &self,
        ticket: Ticket,
        index: String,
        value: Option<String>,
        after: Option<String>,
        limit: u64,
        descending: bool,
    ) -> Result<()> {
        self.ensure_open()?;
        let reader = self.inner.reader.clone();
        self.run(ticket, move || {
            let entries = reader.index_entries(&crate::store::IndexQuery {
                index: &index,
                value: value.as_deref(),
                after: after.as_deref(),
                limit,
                descending,
            })?;
            Ok(Output::Json(
                serde_json::to_string(&entries).expect("index entries serialize"),
            ))
        })
    }

    /// Read `stream_id` as `read` reads it (a vocabulary's read of a stream, such as its events
    /// as run events); completes with the JSON `read` gives.
    pub fn read_stream(
        &self,
        ticket: Ticket,
        stream_id: String,
        read: impl FnOnce(&dyn LogReader, &str) -> Result<String> + Send + 'static,
    ) -> Result<()> {
        ids::check_stream_id(&stream_id)?;
        let reader = self.inner.reader.clone();
        self.run(ticket, move || read(&*reader, &stream_id).map(Output::Json))
    }

    /// Fold a run's stored events into its state; completes with the state's canonical JSON.
    pub fn materialize(&self, ticket: Ticket, run_id: String) -> Result<()> {
        ids::check_stream_id(&run_id)?;
        let reader = self.inner.reader.clone();
        let materializer = self.inner.materializer.clone();
        self.run(ticket, move || materializer.state(&*reader, &run_id).map(Output::Json))
    }

    /// Re-check one run (or everything), the store's own check `thorough` or fast; completes
    /// with the report's JSON.
    pub fn verify(&self, ticket: Ticket, run_id: Option<String>, thorough: bool) -> Result<()> {
        if let Some(r) = &run_id {
            ids::check_stream_id(r)?;
        }
        let reader = self.inner.reader.clone();
        let artifacts = self.inner.artifacts.clone();
        let materializer = self.inner.materializer.clone();
        self.run(ticket, move || {
            let report = crate::verify::verify(&*reader, &artifacts, &*materializer, run_id.as_deref(), thorough)?;
            Ok(Output::Json(
                serde_json::to_string(&report).expect("a report serializes"),
            ))
        })
    }
}
