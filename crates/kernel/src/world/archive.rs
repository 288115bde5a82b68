//! Export and import: runs carried between worlds of any kind as an archive (see
//! [`crate::archive`] for its lines).
//!
//! Both go a piece at a time, each piece one operation of the world's pool, so that memory stays
//! bounded by what one piece holds, and a close waits for the piece under way. An export is
//! pulled: each call writes about [`CHUNK`] bytes of lines. An import is pushed the archive's
//! bytes as they come; it holds one run's events until that run's `end` line, then commits them
//! in one transaction. Its artifacts are published as they are read, before the events that
//! refer to them; if the run is refused, those it published are removed again.
//!
//! Nothing read is trusted. Each event goes through the append rules again, as its own append
//! did, at its recorded time, and must make the archive's envelope byte for byte (so its id,
//! digest, sequence and payload are checked); each artifact's bytes must hash to its manifest
//! and the manifest to its id. A run the world holds already must hold a prefix of the
//! archive's events (it then gets the rest), or it is refused and kept as it is.

use super::lifecycle::{artifact_ids, check_stream_id, Parts};
use super::World;
use crate::archive::{self, damaged, Record};
use crate::catalog::{self, Page, PageRequest, RunOrder};
use crate::error::{Result, WorldError};
use crate::events::{self, AppendRequest, ImportedEvent, IndexWrite};
use crate::runtime::{Output, Ticket};
use crate::store::{Dense, IndexEntry};
use crate::vocabulary::Stream;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

/// About how many bytes of archive one export call writes.
const CHUNK: usize = 1 << 20;
/// Events read from the store at a time while exporting.
const READ_PAGE: u64 = 1_000;
/// Runs taken from the catalog at a time while exporting.
const RUN_PAGE: u64 = 500;

/// Which runs an export takes (JSON from the binding).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExportRequest {
    run_ids: Option<Vec<String>>,
    status: Option<Vec<String>>,
    ended_before: Option<String>,
}

/// An export under way.
pub struct Export(Arc<Mutex<Exporter>>);

struct Exporter {
    /// The catalog's runs still to list, by id; `None` once listed (or for an export of named runs).
    page: Option<Page>,
    queued: VecDeque<String>,
    /// The artifacts each queued run made.
    owned: HashMap<String, Vec<String>>,
    current: Option<Running>,
    /// Artifacts written already, by id: an artifact several runs refer to is written once.
    written: HashSet<String>,
    started: bool,
    finished: bool,
    runs: u64,
}

/// The run being written.
struct Running {
    run_id: String,
    last: u64,
    /// The last sequence written.
    at: u64,
    /// The artifacts its events refer to.
    mentioned: BTreeSet<String>,
}

/// An import under way.
pub struct Import(Arc<Mutex<Importer>>);

#[derive(Default)]
struct Importer {
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    /// Lines read.
    line: u64,
    header: bool,
    ended: bool,
    run: Option<Incoming>,
    /// Runs read so far (for the `archive-end` line's count).
    read: u64,
    counts: Counts,
    /// Why the import stopped: every later push answers it.
    failed: Option<WorldError>,
}

/// What an import changed.
#[derive(Debug, Default, serde::Serialize)]
struct Counts {
    /// Runs that gained events.
    runs: u64,
    events: u64,
    /// Artifacts published.
    artifacts: u64,
    /// Runs the world held whole already.
    unchanged: u64,
}

/// The run being read.
struct Incoming {
    run_id: String,
    last_sequence: u64,
    /// Its envelopes, in order, with the line each was on.
    events: Vec<(u64, String)>,
    index: Vec<(u64, IndexEntry)>,
    artifacts: u64,
    /// Artifacts this import published for it, removed again if it is refused.
    published: Vec<String>,
}

/// An envelope's fields, as stored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Envelope<'a> {
    append_idempotency_key: Option<String>,
    #[allow(dead_code)]
    canonical_request_digest: Option<String>,
    #[allow(dead_code)]
    event_id: String,
    #[serde(borrow)]
    payload: &'a RawValue,
    recorded_at: String,
    run_id: String,
    sequence: u64,
    #[serde(rename = "type")]
    event_type: String,
}

impl World {
    /// Start an export of the runs `request` names (JSON: `{ runIds?, status?, endedBefore? }`;
    /// every run when it names none). Nothing is read until [`World::export_next`].
    pub fn export_start(&self, request: &str) -> Result<Export> {
        self.ensure_open()?;
        let req: ExportRequest = serde_json::from_str(request)
            .map_err(|e| WorldError::validation("exportRuns options", format!("are not valid: {e}")))?;
        let mut queued = VecDeque::new();
        let page = match req.run_ids {
            Some(ids) => {
                if req.status.is_some() || req.ended_before.is_some() {
                    return Err(WorldError::validation(
                        "runIds",
                        "names the runs itself: it cannot be given with status or endedBefore",
                    ));
                }
                for id in ids {
                    check_stream_id(&id)?;
                    if !queued.contains(&id) {
                        queued.push_back(id);
                    }
                }
                None
            }
            None => {
                let page = match req.ended_before {
                    Some(t) => catalog::ended_page(t, req.status, "status", "id", RUN_PAGE)?,
                    None => Page::from_request(PageRequest {
                        status: req.status,
                        order: Some("id".into()),
                        limit: Some(RUN_PAGE),
                        ..PageRequest::default()
                    })?,
                };
                debug_assert_eq!(page.order, RunOrder::Id);
                Some(page)
            }
        };
        Ok(Export(Arc::new(Mutex::new(Exporter {
            page,
            queued,
            owned: HashMap::new(),
            current: None,
            written: HashSet::new(),
            started: false,
            finished: false,
            runs: 0,
        }))))
    }

    /// Write the export's next piece of archive: completes with its bytes, or with nothing once
    /// the archive is whole.
    pub fn export_next(&self, ticket: Ticket, export: &Export) -> Result<()> {
        let parts = self.parts()?;
        let state = export.0.clone();
        self.run(ticket, move || {
            let mut ex = state.lock().unwrap_or_else(|p| p.into_inner());
            if ex.finished {
                return Ok(Output::Unit);
            }
            let mut out = Vec::with_capacity(CHUNK + CHUNK / 4);
            ex.fill(&parts, &mut out)?;
            Ok(Output::Bytes(crate::bytes::Bytes::Owned(out)))
        })
    }

    /// Start an import into this world.
    pub fn import_start(&self) -> Result<Import> {
        self.lifecycle_parts("importing runs")?;
        Ok(Import(Arc::new(Mutex::new(Importer::default()))))
    }

    /// Read the next bytes of the archive, committing each run whose `end` line they complete.
    pub fn import_push(&self, ticket: Ticket, import: &Import, bytes: Vec<u8>) -> Result<()> {
        let parts = self.lifecycle_parts("importing runs")?;
        let state = import.0.clone();
        self.run(ticket, move || {
            let mut im = state.lock().unwrap_or_else(|p| p.into_inner());
            im.push(&parts, &bytes)?;
            Ok(Output::Unit)
        })
    }

    /// The archive has no more bytes: completes with `{ runs, events, artifacts, unchanged }`, or
    /// refuses an archive that ends before its last line.
    pub fn import_finish(&self, ticket: Ticket, import: &Import) -> Result<()> {
        let parts = self.lifecycle_parts("importing runs")?;
        let state = import.0.clone();
        self.run(ticket, move || {
            let mut im = state.lock().unwrap_or_else(|p| p.into_inner());
            im.finish(&parts)?;
            Ok(Output::Json(
                serde_json::to_string(&im.counts).expect("counts serialize"),
            ))
        })
    }
}

impl Exporter {
    /// Write lines into `out` until it holds about [`CHUNK`] bytes or the archive is whole.
    fn fill(&mut self, parts: &Parts, out: &mut Vec<u8>) -> Result<()> {
        if !self.started {
            archive::Writer::new(out).header(&crate::clock::now_iso());
            if self.page.is_none() {
                self.note_owned(parts)?; // The runs named, all queued.
            }
            self.started = true;
        }
        while out.len() < CHUNK && !self.finished {
            if let Some(run) = self.current.as_mut() {
                if run.at < run.last {
                    write_events(parts, run, out)?;
                } else {
                    self.end_run(parts, out)?;
                }
            } else if let Some(run_id) = self.queued.pop_front() {
                let last = parts.reader.last_sequence(&run_id)?;
                if last == 0 {
                    if self.page.is_none() {
                        return Err(WorldError::validation(
                            "runIds",
                            format!("{run_id} is not in the world"),
                        ));
                    }
                    continue; // Deleted since the catalog listed it.
                }
                archive::Writer::new(out).run(&run_id, last);
                self.current = Some(Running {
                    run_id,
                    last,
                    at: 0,
                    mentioned: BTreeSet::new(),
                });
            } else if !self.list_runs(parts)? {
                archive::Writer::new(out).archive_end(self.runs);
                self.finished = true;
            }
        }
        Ok(())
    }

    /// Queue the next runs to write, with the artifacts they made; false when none are left.
    fn list_runs(&mut self, parts: &Parts) -> Result<bool> {
        let Some(page) = self.page.as_mut() else {
            return Ok(false);
        };
        let (rows, cursor) = super::runs::read_page(&*parts.reader, page)?;
        page.advance(&rows);
        if cursor.is_none() {
            self.page = None;
        }
        self.queued.extend(rows.into_iter().map(|r| r.run_id));
        self.note_owned(parts)?;
        Ok(!self.queued.is_empty() || self.page.is_some())
    }

    /// Note which artifacts the queued runs made (one listing of the artifacts for many runs).
    fn note_owned(&mut self, parts: &Parts) -> Result<()> {
        let runs: Vec<&str> = self.queued.iter().map(String::as_str).collect();
        self.owned.clear();
        for (run, id, _) in parts.artifacts.owned_by(&runs)? {
            self.owned.entry(run).or_default().push(id);
        }
        Ok(())
    }

    /// Write the current run's artifacts and index entries, and its `end` line.
    fn end_run(&mut self, parts: &Parts, out: &mut Vec<u8>) -> Result<()> {
        let run = self.current.take().expect("a run is being written");
        let mut ids: BTreeSet<String> = run.mentioned;
        ids.extend(self.owned.remove(&run.run_id).unwrap_or_default());
        let mut artifacts = 0;
        for id in ids {
            if !self.written.insert(id.clone()) {
                continue;
            }
            let (manifest, bytes) = parts.artifacts.read(&id)?;
            archive::Writer::new(out).artifact(&manifest, &bytes);
            artifacts += 1;
        }
        let entries = parts.reader.held_index_entries(&run.run_id)?;
        let entries: Vec<&IndexEntry> = entries.iter().filter(|e| e.sequence <= run.last).collect();
        let mut w = archive::Writer::new(out);
        for e in &entries {
            w.index(e);
        }
        w.end(&run.run_id, run.last, artifacts, entries.len() as u64);
        self.runs += 1;
        Ok(())
    }
}

/// Write the next page of the current run's events.
fn write_events(parts: &Parts, run: &mut Running, out: &mut Vec<u8>) -> Result<()> {
    let mut dense = Dense::after(&run.run_id, run.at);
    let limit = READ_PAGE.min(run.last - run.at);
    let mut read = 0;
    let mut w = archive::Writer::new(out);
    let mentioned = &mut run.mentioned;
    parts.reader.rows_once(&run.run_id, run.at, Some(limit), &mut |row| {
        dense.check(row.sequence)?;
        w.event(row.envelope);
        mentioned.extend(artifact_ids(row.envelope).map(str::to_string));
        read += 1;
        Ok(())
    })?;
    if read == 0 {
        return Err(WorldError::EventLogCorrupt {
            run_id: Some(run.run_id.clone()),
            sequence: Some(run.at + 1),
            reason: "the run was deleted while it was exported".into(),
        });
    }
    run.at += read;
    Ok(())
}

impl Importer {
    fn push(&mut self, parts: &Parts, bytes: &[u8]) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = self.read_lines(parts, bytes);
        if let Err(e) = &result {
            self.give_up(parts, e.clone());
        }
        result
    }

    fn read_lines(&mut self, parts: &Parts, bytes: &[u8]) -> Result<()> {
        let mut rest = bytes;
        while let Some(at) = memchr::memchr(b'\n', rest) {
            let (line, after) = rest.split_at(at);
            rest = &after[1..];
            if self.partial.is_empty() {
                self.line_read(parts, line)?;
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.line_read(parts, &whole)?;
            }
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    fn finish(&mut self, parts: &Parts) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = (|| {
            if !self.partial.is_empty() {
                // The last line may end without a newline; a line cut short does not read.
                let last = std::mem::take(&mut self.partial);
                let run = self.run.as_ref().map(|r| r.run_id.clone());
                if archive::parse(&last, None, 0).is_err() {
                    return Err(damaged(
                        run.as_deref(),
                        self.line + 1,
                        "the archive ends in the middle of this line: it was cut short",
                    ));
                }
                self.line_read(parts, &last)?;
            }
            if !self.ended {
                let run = self.run.as_ref().map(|r| r.run_id.as_str());
                return Err(damaged(
                    run,
                    self.line + 1,
                    "the archive ends before its archive-end line: it was cut short",
                ));
            }
            Ok(())
        })();
        if let Err(e) = &result {
            self.give_up(parts, e.clone());
        }
        result
    }

    /// Stop at `e`: what the run being read published goes again.
    fn give_up(&mut self, parts: &Parts, e: WorldError) {
        if let Some(run) = self.run.take() {
            unpublish(parts, &run.published);
        }
        self.failed = Some(e);
    }

    fn line_read(&mut self, parts: &Parts, text: &[u8]) -> Result<()> {
        self.line += 1;
        let line = self.line;
        let run_id = self.run.as_ref().map(|r| r.run_id.clone());
        let run_id = run_id.as_deref();
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        if self.ended {
            return Err(damaged(None, line, "a line follows the archive-end line"));
        }
        let record = archive::parse(text, run_id, line)?;
        let misplaced = |what: &str| damaged(run_id, line, format!("{what} is out of place"));
        if !self.header {
            let Record::Archive { format, version, .. } = record else {
                return Err(damaged(None, line, "the archive does not start with its archive line"));
            };
            if format != archive::FORMAT {
                return Err(damaged(
                    None,
                    line,
                    format!("the format is {format:?}, not {:?}", archive::FORMAT),
                ));
            }
            if version != archive::VERSION {
                return Err(damaged(
                    None,
                    line,
                    format!(
                        "the archive is of version {version}; this build reads version {}",
                        archive::VERSION
                    ),
                ));
            }
            self.header = true;
            return Ok(());
        }
        match record {
            Record::Archive { .. } => return Err(misplaced("a second archive line")),
            Record::Run {
                run_id: id,
                last_sequence,
            } => {
                if self.run.is_some() {
                    return Err(misplaced("a run line inside another run"));
                }
                check_stream_id(&id).map_err(|e| damaged(None, line, e))?;
                self.read += 1;
                self.run = Some(Incoming {
                    run_id: id,
                    last_sequence,
                    events: Vec::new(),
                    index: Vec::new(),
                    artifacts: 0,
                    published: Vec::new(),
                });
            }
            Record::Event { envelope } => {
                let Some(run) = self.run.as_mut() else {
                    return Err(misplaced("an event outside a run"));
                };
                run.events.push((line, envelope.to_string()));
            }
            Record::Artifact { manifest, bytes } => {
                let Some(run) = self.run.as_mut() else {
                    return Err(misplaced("an artifact outside a run"));
                };
                let bytes = archive::artifact_bytes(&bytes, &run.run_id, line)?;
                let id = manifest.artifact_id.clone();
                if parts.artifacts.import(manifest, &bytes)? {
                    run.published.push(id);
                }
                run.artifacts += 1;
            }
            Record::Index {
                index,
                key,
                value,
                sequence,
            } => {
                let Some(run) = self.run.as_mut() else {
                    return Err(misplaced("an index entry outside a run"));
                };
                let run_id = run.run_id.clone();
                run.index.push((
                    line,
                    IndexEntry {
                        index,
                        key,
                        value,
                        run_id,
                        sequence,
                    },
                ));
            }
            Record::End {
                run_id: id,
                events,
                artifacts,
                index_entries,
            } => {
                let Some(run) = self.run.take() else {
                    return Err(misplaced("an end line outside a run"));
                };
                let counted = [
                    (id == run.run_id, "names another run"),
                    (
                        events == run.events.len() as u64,
                        "counts other events than the run holds",
                    ),
                    (
                        run.last_sequence == run.events.len() as u64,
                        "follows a run whose lastSequence is not its number of events",
                    ),
                    (artifacts == run.artifacts, "counts other artifacts than the run holds"),
                    (
                        index_entries == run.index.len() as u64,
                        "counts other index entries than the run holds",
                    ),
                ];
                if let Some((_, why)) = counted.iter().find(|(ok, _)| !ok) {
                    let e = damaged(Some(&run.run_id), line, format!("the end line {why}"));
                    unpublish(parts, &run.published);
                    return Err(e);
                }
                match commit_run(parts, &run) {
                    Ok(Some(added)) => {
                        self.counts.runs += 1;
                        self.counts.events += added;
                    }
                    Ok(None) => self.counts.unchanged += 1,
                    Err(e) => {
                        unpublish(parts, &run.published);
                        return Err(e);
                    }
                }
                self.counts.artifacts += run.published.len() as u64;
            }
            Record::ArchiveEnd { runs } => {
                if self.run.is_some() {
                    return Err(misplaced("the archive-end line inside a run"));
                }
                if runs != self.read {
                    return Err(damaged(
                        None,
                        line,
                        format!(
                            "the archive-end line counts {runs} runs, but the archive holds {}",
                            self.read
                        ),
                    ));
                }
                self.ended = true;
            }
        }
        Ok(())
    }
}

/// Remove the artifacts an import published for a run it did not commit.
fn unpublish(parts: &Parts, published: &[String]) {
    for id in published {
        // An artifact left behind is one no event refers to; `little verify` stays ok.
        let _ = parts.artifacts.remove(id);
    }
}

/// Commit the events of `run` that the world does not hold yet: `Some(how many)`, or `None` when
/// it held them all.
fn commit_run(parts: &Parts, run: &Incoming) -> Result<Option<u64>> {
    let id = run.run_id.as_str();
    let held = parts.reader.last_sequence(id)?;
    let compare = held.min(run.events.len() as u64);
    if compare > 0 {
        let mut dense = Dense::after(id, 0);
        parts.reader.rows(id, 0, Some(compare), &mut |row| {
            dense.check(row.sequence)?;
            if row.envelope != run.events[(row.sequence - 1) as usize].1 {
                return Err(WorldError::ImportConflict {
                    run_id: id.to_string(),
                    sequence: row.sequence,
                });
            }
            Ok(())
        })?;
    }
    if held >= run.events.len() as u64 {
        return Ok(None);
    }
    // The index entries, on the events that set them.
    let mut writes: HashMap<u64, Vec<IndexWrite>> = HashMap::new();
    for (line, e) in &run.index {
        if e.sequence == 0 || e.sequence > run.events.len() as u64 {
            return Err(damaged(
                Some(id),
                *line,
                "the index entry names a sequence the run does not hold",
            ));
        }
        if e.sequence > held {
            writes.entry(e.sequence).or_default().push(IndexWrite {
                index: e.index.clone(),
                key: e.key.clone(),
                value: Some(e.value.clone()),
            });
        }
    }
    let mut imported = Vec::with_capacity(run.events.len() - held as usize);
    for (i, (line, text)) in run.events.iter().enumerate().skip(held as usize) {
        let sequence = i as u64 + 1;
        let event = prepare_stored(parts, id, sequence, text, writes.remove(&sequence).unwrap_or_default())
            .map_err(|e| at_line(e, id, *line))?;
        imported.push(event);
    }
    let added = imported.len() as u64;
    {
        let mut lent = parts.writer.lock().unwrap_or_else(|p| p.into_inner());
        let writer = lent.as_mut().ok_or(WorldError::Closed)?;
        events::commit_imported(&mut **writer, &imported).map_err(|e| match e {
            WorldError::SequenceConflict { run_id, expected, .. } => WorldError::ImportConflict {
                run_id,
                sequence: expected + 1,
            },
            WorldError::EventLogCorrupt { sequence: Some(s), .. } if s > held && s <= run.events.len() as u64 => {
                at_line(e, id, run.events[(s - 1) as usize].0)
            }
            other => other,
        })?;
    }
    parts.statuses.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    Ok(Some(added))
}

/// An archived envelope's append, prepared again as the caller's was.
fn prepare_stored(
    parts: &Parts,
    run: &str,
    sequence: u64,
    text: &str,
    index: Vec<IndexWrite>,
) -> Result<ImportedEvent> {
    let corrupt = |reason: String| WorldError::EventLogCorrupt {
        run_id: Some(run.to_string()),
        sequence: Some(sequence),
        reason,
    };
    let e: Envelope = serde_json::from_str(text).map_err(|e| corrupt(format!("the envelope does not read ({e})")))?;
    if e.run_id != run {
        return Err(corrupt(format!("the envelope names {}", e.run_id)));
    }
    if e.sequence != sequence {
        return Err(corrupt(format!(
            "the envelope has sequence {} where {sequence} comes next",
            e.sequence
        )));
    }
    catalog::check_time("recordedAt", &e.recorded_at).map_err(|_| corrupt("recordedAt is not an ISO time".into()))?;
    // A session's events were appended as drafts (their type inside); a run's as facts.
    let (draft, payload_json) = if run.starts_with("ses_") {
        let mut fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(e.payload.get()).map_err(|_| corrupt("the payload is not an object".into()))?;
        fields.insert("type".into(), serde_json::Value::String(e.event_type.clone()));
        (Some(Stream::Session), serde_json::Value::Object(fields).to_string())
    } else {
        (None, e.payload.get().to_string())
    };
    let prepared = events::prepare(
        AppendRequest {
            run_id: run.to_string(),
            event_type: e.event_type,
            payload_json,
            strings: Vec::new(),
            key: e.append_idempotency_key,
            draft,
            expected_sequence: Some(sequence - 1),
            index,
        },
        &*parts.artifacts,
    )?;
    if let Some(refusal) = prepared.refused {
        return Err(refusal);
    }
    if prepared.spill.is_some() {
        return Err(corrupt(
            "the payload carries a value this build stores as an artifact: it was not written by an append".into(),
        ));
    }
    Ok(ImportedEvent {
        prepared,
        recorded_at: e.recorded_at,
        envelope: text.to_string(),
    })
}

/// `e`, saying which line of the archive it was found on.
fn at_line(e: WorldError, run: &str, line: u64) -> WorldError {
    match e {
        WorldError::Validation { path, message, .. } => WorldError::Validation {
            run_id: Some(run.to_string()),
            path,
            message: format!("{message} (line {line} of the archive)"),
        },
        WorldError::EventLogCorrupt {
            run_id,
            sequence,
            reason,
        } => WorldError::EventLogCorrupt {
            run_id,
            sequence,
            reason: format!("line {line} of the archive: {reason}"),
        },
        other => other,
    }
}
