//! Import: runs read from an archive's bytes as they come (see [`crate::archive`] for its
//! lines), each run held until its `end` line and then committed in one transaction, through the
//! append rules again. See `world/archive.rs` for what is checked, and for export.

use super::lifecycle::{check_stream_id, Parts};
use super::World;
use crate::archive::{self, damaged, Record};
use crate::catalog;
use crate::error::{Result, WorldError};
use crate::events::{self, AppendRequest, ImportedEvent, IndexWrite};
use crate::runtime::{Output, Ticket};
use crate::store::{Dense, IndexEntry};
use crate::vocabulary::Stream;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
