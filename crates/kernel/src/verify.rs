//! `little verify`: re-check everything a world stores, and name what is wrong.
//!
//! First the store's own check of how it keeps the rows (see [`LogReader::check_storage`]: fast
//! by default, thorough when asked). Then for each stream: sequences dense from 1, each stored
//! envelope canonical JSON, its columns agreeing with its text, its event id and request digest
//! matching its content, and every artifact it references present; and where the store keeps a
//! fold snapshot of the stream under the world's key, that it is the fold of the stream's events
//! up to its sequence. For artifacts: each manifest against its id, each blob's size and sha256.
//! Problems are collected, not thrown, so one run of verify reports all of them.

use crate::artifacts::ArtifactStore;
use crate::canonical;
use crate::catalog;
use crate::error::{Result, WorldError};
use crate::events::shape;
use crate::store::{LogReader, RowRef};
use crate::vocabulary::{self, Materializer};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeSet;

/// One thing verify found wrong.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// `store` (the store's own check), `hole`, `not-canonical`, `row-mismatch`, `event-id`,
    /// `unreadable`, `run-event-body`, `fold-snapshot`, `catalog` (a runs-catalog row that
    /// disagrees with the stream's events, or a row or stream missing its other half),
    /// `missing-artifact`, `artifact-hash`, `artifact-manifest`, `artifact-integrity`,
    /// `artifact-unreadable` (the system would not let it be read: permissions, I/O errors),
    /// `orphan-object` (an artifact's bytes in the bucket without its manifest).
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<String>,
    pub message: String,
}

/// What verify checked and found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub ok: bool,
    pub runs: u64,
    pub events: u64,
    pub artifacts: u64,
    pub problems: Vec<Problem>,
}

/// Verify one stream (`Some(run)`) and the artifacts it references, or every stream and every
/// artifact (`None`); the store's own check runs either way, `thorough` or fast.
pub fn verify(
    reader: &dyn LogReader,
    artifacts: &ArtifactStore,
    materializer: &dyn Materializer,
    run: Option<&str>,
    thorough: bool,
) -> Result<Report> {
    let mut problems: Vec<Problem> = reader
        .check_storage(thorough)?
        .into_iter()
        .map(|message| Problem {
            kind: "store",
            run_id: None,
            sequence: None,
            artifact_id: None,
            message,
        })
        .collect();
    // A store too damaged to be read is reported, not thrown: the problems found so far stand.
    let unreadable = |problems: &mut Vec<Problem>, run_id: Option<&str>, e: WorldError| -> Result<()> {
        if e.code() != "EVENT_LOG_CORRUPT" {
            return Err(e);
        }
        problems.push(Problem {
            kind: "unreadable",
            run_id: run_id.map(str::to_string),
            sequence: None,
            artifact_id: None,
            message: e.to_string(),
        });
        Ok(())
    };
    let streams: Vec<String> = match run {
        Some(r) => vec![r.to_string()],
        None => match reader.streams() {
            Ok(streams) => streams.into_iter().map(|s| s.run_id).collect(),
            Err(e) => {
                unreadable(&mut problems, None, e)?;
                Vec::new()
            }
        },
    };
    let mut events = 0;
    let mut referenced = BTreeSet::new();
    let key = materializer.snapshot_key();
    for stream in &streams {
        let mut expected = 1u64;
        // The stream's snapshot, checked against the fold of its rows as they are read.
        let kept = reader
            .fold_snapshots()
            .map(|s| s.snapshot(stream, &key))
            .transpose()?
            .flatten();
        let mut fold = kept.as_ref().map(|_| materializer.fold(stream));
        let mut catalog = Catalogued::new(stream);
        let read = reader.rows(stream, 0, None, &mut |row| {
            catalog.push(row);
            if let (Some(f), Some(k)) = (&mut fold, &kept) {
                // A row the fold cannot take is reported below as what it is.
                if f.push(row.envelope).is_err() {
                    fold = None;
                } else if row.sequence == k.sequence {
                    if f.snapshot_text() != k.state {
                        problems.push(Problem {
                            kind: "fold-snapshot",
                            run_id: Some(stream.clone()),
                            sequence: Some(k.sequence),
                            artifact_id: None,
                            message: format!(
                                "the run's fold snapshot at sequence {} is not the fold of its events up to there",
                                k.sequence
                            ),
                        });
                    }
                    fold = None;
                }
            }
            events += 1;
            if row.sequence != expected {
                problems.push(Problem {
                    kind: "hole",
                    run_id: Some(stream.clone()),
                    sequence: Some(expected),
                    artifact_id: None,
                    message: format!("sequences {expected}..{} are missing", row.sequence - 1),
                });
            }
            expected = row.sequence + 1;
            check_row(row, &mut problems, &mut referenced);
            Ok(())
        });
        match read {
            Ok(()) => catalog.check(reader.catalog_row(stream)?, &mut problems),
            Err(e) => unreadable(&mut problems, Some(stream), e)?,
        }
    }
    if run.is_none() {
        // A catalog row of a stream that holds no event.
        let listed: BTreeSet<&str> = streams.iter().map(String::as_str).collect();
        let all = crate::catalog::RunQuery {
            status: None,
            before: None,
            after_time: None,
            order: crate::catalog::RunOrder::Id,
            after: None,
            limit: u64::MAX >> 1,
        };
        for row in reader.catalog_page(&all)? {
            if !listed.contains(row.run_id.as_str()) {
                problems.push(Problem {
                    kind: "catalog",
                    run_id: Some(row.run_id.clone()),
                    sequence: None,
                    artifact_id: None,
                    message: format!("the runs catalog lists {} but the log holds no event of it", row.run_id),
                });
            }
        }
    }
    for id in &referenced {
        if !artifacts.exists(id)? {
            problems.push(Problem {
                kind: "missing-artifact",
                run_id: run.map(str::to_string),
                sequence: None,
                artifact_id: Some(id.clone()),
                message: format!("artifact {id} is referenced but not stored"),
            });
        }
    }
    let to_check: Vec<String> = match run {
        Some(_) => referenced.into_iter().collect(),
        None => artifacts.list()?,
    };
    for id in &to_check {
        if let Err(e) = artifacts.read(id) {
            let Some(kind) = artifact_problem(&e)? else {
                continue; // reported above
            };
            problems.push(Problem {
                kind,
                run_id: None,
                sequence: None,
                artifact_id: Some(id.clone()),
                message: e.to_string(),
            });
        }
    }
    if run.is_none() {
        for orphan in artifacts.orphans()? {
            problems.push(Problem {
                kind: "orphan-object",
                run_id: None,
                sequence: None,
                message: format!(
                    "the bucket holds {} without a manifest, left by a write cut short between the two: \
                     a write of that artifact adopts it, a prune removes it once it is an hour old",
                    orphan.artifact_id
                ),
                artifact_id: Some(orphan.artifact_id),
            });
        }
    }
    Ok(Report {
        ok: problems.is_empty(),
        runs: streams.len() as u64,
        events,
        artifacts: to_check.len() as u64,
        problems,
    })
}

/// What a stream's catalog row should say, worked out from its rows as verify reads them.
struct Catalogued<'s> {
    stream: &'s str,
    last: u64,
    first_at: String,
    last_at: String,
    status: &'static str,
}

impl<'s> Catalogued<'s> {
    fn new(stream: &'s str) -> Self {
        Catalogued {
            stream,
            last: 0,
            first_at: String::new(),
            last_at: String::new(),
            status: catalog::initial_status(stream),
        }
    }

    fn push(&mut self, row: RowRef<'_>) {
        if self.last == 0 {
            self.first_at = row.recorded_at.to_string();
        }
        self.last = row.sequence;
        self.last_at = row.recorded_at.to_string();
        self.status = catalog::stored_status_change(self.stream, row.event_type, row.envelope).apply(self.status);
    }

    /// Report a catalog row that disagrees with the rows read, or that is missing.
    fn check(&self, row: Option<catalog::CatalogRow>, problems: &mut Vec<Problem>) {
        if self.last == 0 {
            return;
        }
        let expected = catalog::CatalogRow {
            run_id: self.stream.to_string(),
            last_sequence: self.last,
            first_recorded_at: self.first_at.clone(),
            last_recorded_at: self.last_at.clone(),
            status: self.status.to_string(),
        };
        let message = match row {
            None => format!("the runs catalog has no row for {}", self.stream),
            Some(r) if r != expected => format!(
                "the runs catalog says {} ends at sequence {} ({} to {}, {}), but its events say {} ({} to {}, {})",
                self.stream,
                r.last_sequence,
                r.first_recorded_at,
                r.last_recorded_at,
                r.status,
                expected.last_sequence,
                expected.first_recorded_at,
                expected.last_recorded_at,
                expected.status
            ),
            Some(_) => return,
        };
        problems.push(Problem {
            kind: "catalog",
            run_id: Some(self.stream.to_string()),
            sequence: None,
            artifact_id: None,
            message,
        });
    }
}

fn check_row(row: RowRef<'_>, problems: &mut Vec<Problem>, referenced: &mut BTreeSet<String>) {
    let mut report = |kind: &'static str, message: String| {
        problems.push(Problem {
            kind,
            run_id: Some(row.run_id.to_string()),
            sequence: Some(row.sequence),
            artifact_id: None,
            message,
        })
    };
    let value: Value = match canonical::parse_around(row.envelope, 1) {
        Ok(v) => v,
        Err(e) => return report("unreadable", format!("the stored envelope {e}")),
    };
    if canonical::to_string(&value) != row.envelope {
        report("not-canonical", "the stored envelope is not canonical JSON".into());
    }
    let text = |k: &str| value.get(k).and_then(Value::as_str);
    let mismatched: Vec<&str> = [
        ("runId", text("runId") != Some(row.run_id)),
        (
            "sequence",
            value.get("sequence").and_then(Value::as_u64) != Some(row.sequence),
        ),
        ("type", text("type") != Some(row.event_type)),
        ("eventId", text("eventId") != Some(row.event_id)),
        ("recordedAt", text("recordedAt") != Some(row.recorded_at)),
        ("appendIdempotencyKey", text("appendIdempotencyKey") != row.key),
        ("canonicalRequestDigest", text("canonicalRequestDigest") != row.digest),
    ]
    .into_iter()
    .filter_map(|(k, bad)| bad.then_some(k))
    .collect();
    if !mismatched.is_empty() {
        report(
            "row-mismatch",
            format!(
                "the row's columns disagree with its envelope on {}",
                mismatched.join(", ")
            ),
        );
    }
    if let Err(e) = shape::check_envelope(&value) {
        let message = match e {
            WorldError::EventLogCorrupt { reason, .. } => reason,
            other => other.to_string(),
        };
        report("event-id", message);
    }
    if let Some(payload) = value.get("payload") {
        collect_refs(payload, referenced);
        if let Some(map) = payload.as_object() {
            let checked = vocabulary::registered()
                .iter()
                .try_for_each(|v| v.check_stored(row.run_id, row.event_type, map));
            if let Err(e) = checked {
                report("run-event-body", e.to_string());
            }
        }
    }
}

fn collect_refs(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::String(s) if crate::ids::is_artifact_ref(s) => {
            out.insert(s["artifact://".len()..].to_string());
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        Value::Object(m) => m.values().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

/// The kind of problem an artifact that could not be read has, if it is one to report here. An
/// error of this machine rather than of the artifact (out of file descriptors or memory, a
/// signal) is verify's own and ends it: reported as the artifact's, it read as damage that was not
/// there, which a second run did not find.
pub(crate) fn artifact_problem(e: &WorldError) -> Result<Option<&'static str>> {
    Ok(Some(match e.code() {
        "ARTIFACT_NOT_FOUND" => return Ok(None),
        "ARTIFACT_HASH_MISMATCH" => "artifact-hash",
        "ARTIFACT_MANIFEST_CORRUPT" => "artifact-manifest",
        "WORLD_IO" if e.is_transient() => return Err(e.clone()),
        // One unreadable artifact is one problem found; verify goes on to find the others.
        "WORLD_IO" => "artifact-unreadable",
        _ => "artifact-integrity",
    }))
}
