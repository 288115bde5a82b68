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
use crate::archive;
use crate::catalog::{self, Page, PageRequest, RunOrder};
use crate::error::{Result, WorldError};
use crate::runtime::{Output, Ticket};
use crate::store::{Dense, IndexEntry};
use serde::Deserialize;
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
