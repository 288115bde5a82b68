//! Operating a world over time: deleting a run, pruning ended runs, giving freed space back, and
//! backing up a local world while it is written.
//!
//! A run is deleted in this order, each step safe to crash after:
//! 1. its lock is taken (a run another owner holds is not deleted under its executor), or the
//!    caller shows the token of the lock it holds;
//! 2. its rows go in one transaction of the store ([`LogWriter::delete_streams`]): events, catalog
//!    row, terminals, estimates, token totals, fold snapshots and the index entries it holds, so a
//!    reader sees the whole run or none of it;
//! 3. the artifacts it made go, except those an event of a remaining run refers to: each
//!    manifest before its bytes, so no manifest is ever left without them. A crash before this
//!    step leaves artifacts no event refers to; deleting the run again removes them.

use super::World;
use crate::catalog;
use crate::error::{Result, WorldError};
use crate::ids;
use crate::locks::{run_lock_name, Locks};
use crate::runtime::{Output, Ticket};
use crate::store::{IndexQuery, LogReader};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use crate::events::OWNER_INDEX;

/// Runs deleted in one transaction by a prune: small enough that appends to other runs wait at
/// most one such transaction.
const PRUNE_BATCH: u64 = 200;

/// How old an artifact's bytes stored without a manifest (see
/// [`crate::artifacts::objects`]) must be for a prune to remove them: a writer on another
/// host may be between writing the bytes and the manifest, which takes well under this.
const ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// What a deletion or a prune removed, and the runs a prune left because another owner held
/// their locks.
#[derive(Debug, Default, serde::Serialize)]
struct Removed {
    runs: u64,
    events: u64,
    artifacts: u64,
    bytes: u64,
    skipped: u64,
    /// Artifacts' bytes without a manifest a prune removed (a world with a bucket only).
    #[serde(skip_serializing_if = "is_zero")]
    orphans: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A prune's options, as the caller gives them (JSON from the binding).
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PruneRequest {
    ended_before: Option<String>,
    statuses: Option<Vec<String>>,
    dry_run: Option<bool>,
    limit: Option<u64>,
}

/// What a deletion needs of the world, for the thread it runs on.
#[derive(Clone)]
pub(super) struct Parts {
    pub(super) writer: super::SharedWriter,
    pub(super) reader: Arc<dyn LogReader>,
    pub(super) artifacts: Arc<crate::artifacts::ArtifactStore>,
    pub(super) locks: Arc<Locks>,
    pub(super) statuses: Arc<super::runs::Statuses>,
}

impl World {
    pub(super) fn lifecycle_parts(&self, what: &str) -> Result<Parts> {
        self.ensure_writable(what)?;
        self.parts()
    }

    pub(super) fn parts(&self) -> Result<Parts> {
        self.ensure_open()?;
        Ok(Parts {
            writer: self.inner.writer.clone(),
            reader: self.inner.reader.clone(),
            artifacts: self.inner.artifacts.clone(),
            locks: self.inner.locks.clone(),
            statuses: self.inner.statuses.clone(),
        })
    }

    /// Delete a run (or session) and everything it owns; completes with `{ runId, deleted,
    /// events, artifacts, bytes }`. `token` is that of the run's lock when the caller holds it.
    pub fn delete_run(&self, ticket: Ticket, run_id: String, token: Option<String>) -> Result<()> {
        check_stream_id(&run_id)?;
        let parts = self.lifecycle_parts("deleting a run")?;
        self.run(ticket, move || {
            let name = run_lock_name(&run_id);
            let taken = match &token {
                Some(t) if parts.locks.holds(&name, t) => None,
                Some(_) => {
                    return Err(
                        WorldError::validation("lock", "is not a lock of this run that this world holds")
                            .for_run(&run_id),
                    )
                }
                None => Some(parts.locks.acquire(&name, Duration::ZERO)?),
            };
            let removed = delete(&parts, &[run_id.as_str()]);
            if let Some(held) = taken {
                parts.locks.release(&held.name, &held.token)?;
            }
            let removed = removed?;
            Ok(Output::Json(
                serde_json::json!({
                    "runId": run_id,
                    "deleted": removed.runs > 0 || removed.artifacts > 0,
                    "events": removed.events,
                    "artifacts": removed.artifacts,
                    "bytes": removed.bytes,
                })
                .to_string(),
            ))
        })
    }

    /// Delete the runs that ended before a time, in batches (see [`PRUNE_BATCH`]); completes with
    /// `{ runs, events, artifacts, bytes, skipped, runIds? }` (`runIds` for a dry run, which
    /// deletes nothing). A run whose lock another owner holds is left for a later prune, and
    /// counted in `skipped`.
    pub fn prune_runs(&self, ticket: Ticket, request: &str) -> Result<()> {
        let req: PruneRequest = serde_json::from_str(request)
            .map_err(|e| WorldError::validation("pruneRuns options", format!("are not valid: {e}")))?;
        let Some(ended_before) = req.ended_before else {
            return Err(WorldError::validation(
                "endedBefore",
                "is required: pruneRuns deletes only the runs that ended before it",
            ));
        };
        if req.limit == Some(0) {
            return Err(WorldError::validation("limit", "must be a positive integer"));
        }
        let dry_run = req.dry_run.unwrap_or(false);
        let limit = req.limit.unwrap_or(u64::MAX);
        let mut page = catalog::ended_page(ended_before, req.statuses, "statuses", "oldest", PRUNE_BATCH)?;
        // A dry run changes nothing, so a world opened read-only answers it too.
        let parts = if dry_run {
            self.parts()?
        } else {
            self.lifecycle_parts("pruning runs")?
        };
        self.run(ticket, move || {
            let mut total = Removed::default();
            let mut ids: Vec<String> = Vec::new();
            let mut left = limit;
            while left > 0 {
                page.limit = PRUNE_BATCH.min(left);
                let (rows, cursor) = super::runs::read_page(&*parts.reader, &page)?;
                if rows.is_empty() {
                    break;
                }
                page.advance(&rows);
                let batch: Vec<&str> = rows.iter().map(|r| r.run_id.as_str()).collect();
                if dry_run {
                    total.runs += rows.len() as u64;
                    total.events += rows.iter().map(|r| r.last_sequence).sum::<u64>();
                    let owned = parts.artifacts.owned_by(&batch)?;
                    total.artifacts += owned.len() as u64;
                    total.bytes += owned.iter().map(|(.., size)| size).sum::<u64>();
                    ids.extend(rows.iter().map(|r| r.run_id.clone()));
                } else {
                    // Each run's lock is taken, so that none is deleted under its executor; a run
                    // whose lock another owner holds is left for a later prune.
                    let mut held = Vec::new();
                    for run in &batch {
                        match parts.locks.acquire(&run_lock_name(run), Duration::ZERO) {
                            Ok(h) => held.push((run.to_string(), h)),
                            Err(e) if e.code() == "RUN_LOCKED" => total.skipped += 1,
                            Err(e) => return Err(e),
                        }
                    }
                    let runs: Vec<&str> = held.iter().map(|(r, _)| r.as_str()).collect();
                    let removed = delete(&parts, &runs);
                    for (_, h) in &held {
                        parts.locks.release(&h.name, &h.token)?;
                    }
                    let removed = removed?;
                    total.runs += removed.runs;
                    total.events += removed.events;
                    total.artifacts += removed.artifacts;
                    total.bytes += removed.bytes;
                }
                left = left.saturating_sub(rows.len() as u64);
                if cursor.is_none() {
                    break;
                }
            }
            if !dry_run {
                let before = std::time::SystemTime::now() - ORPHAN_AGE;
                total.orphans = parts.artifacts.remove_orphans(before)?;
            }
            let mut out = serde_json::to_value(&total).expect("counts serialize");
            if dry_run {
                out["runIds"] = serde_json::json!(ids);
            }
            Ok(Output::Json(out.to_string()))
        })
    }

    /// Give the space deleted runs freed back to the operating system (see
    /// [`crate::store::LogWriter::compact`]).
    pub fn compact(&self, ticket: Ticket) -> Result<()> {
        let parts = self.lifecycle_parts("compacting a world")?;
        self.run(ticket, move || {
            let mut lent = parts.writer.lock().unwrap_or_else(|p| p.into_inner());
            lent.as_mut().ok_or(WorldError::Closed)?.compact()?;
            Ok(Output::Unit)
        })
    }

    /// Copy a local world, while it is written, into `dir` (which must not exist, or be empty):
    /// the event store through SQLite's online backup (one read transaction, so the copy is the
    /// store as of one commit), then the artifacts and outer-loop manifests, which never change
    /// once published. Every artifact an event of the copy refers to was published before that
    /// event committed, so it is there to be copied.
    pub fn backup(&self, ticket: Ticket, dir: String) -> Result<()> {
        self.ensure_open()?;
        let Some(data_dir) = self.inner.data_dir.clone().filter(|_| self.inner.kind == "local") else {
            return Err(WorldError::Path {
                message: format!(
                    "backupWorld copies a local world; this one is {} (back up a PostgreSQL schema with pg_dump, or copy its runs with little export)",
                    self.inner.kind
                ),
            });
        };
        let to = PathBuf::from(&dir);
        let reader = self.inner.reader.clone();
        self.run(ticket, move || {
            let empty = match std::fs::read_dir(&to) {
                Ok(mut entries) => entries.next().is_none(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(e) => return Err(WorldError::io("reading the backup directory", Some(to.clone()), e)),
            };
            if !empty {
                return Err(WorldError::Path {
                    message: format!(
                        "{} is not empty: a backup goes into a new or empty directory",
                        to.display()
                    ),
                });
            }
            let events = to.join("events");
            std::fs::create_dir_all(&events)
                .map_err(|e| WorldError::io("creating the backup directory", Some(events.clone()), e))?;
            reader.copy_into(&events.join("events.db"))?;
            let copied = copy_files(
                &data_dir.join("artifacts").join("blobs"),
                &to.join("artifacts").join("blobs"),
            )? + copy_files(&data_dir.join("artifacts"), &to.join("artifacts"))?
                + copy_files(
                    &data_dir.join("artifacts").join("objects"),
                    &to.join("artifacts").join("objects"),
                )?
                + copy_files(&data_dir.join("outer-loops"), &to.join("outer-loops"))?;
            let _ = copied;
            Ok(Output::Unit)
        })
    }
}

/// Delete `runs` (each of whose locks the caller holds) and the artifacts they made that no
/// remaining run refers to.
fn delete(parts: &Parts, runs: &[&str]) -> Result<Removed> {
    let mut removed = Removed::default();
    if runs.is_empty() {
        return Ok(removed);
    }
    // The streams the runs own go with them, in the same transaction.
    let streams = with_owned(parts, runs)?;
    let streams: Vec<&str> = streams.iter().map(String::as_str).collect();
    let counts = {
        let mut lent = parts.writer.lock().unwrap_or_else(|p| p.into_inner());
        lent.as_mut().ok_or(WorldError::Closed)?.delete_streams(&streams)?
    };
    {
        let mut statuses = parts.statuses.lock().unwrap_or_else(|p| p.into_inner());
        for stream in &streams {
            statuses.remove(*stream);
        }
    }
    removed.runs = counts[..runs.len()].iter().filter(|&&n| n > 0).count() as u64;
    removed.events = counts.iter().sum();
    let owned = parts.artifacts.owned_by(&streams)?;
    if owned.is_empty() {
        return Ok(removed);
    }
    let wanted: HashSet<&str> = owned.iter().map(|(_, id, _)| id.as_str()).collect();
    let mut kept: HashSet<String> = HashSet::new();
    // The deleted runs' events are gone: every mention found is a remaining run's.
    parts.reader.artifact_mentions(&mut |_, envelope| {
        for id in artifact_ids(envelope) {
            if wanted.contains(id) {
                kept.insert(id.to_string());
            }
        }
        Ok(())
    })?;
    for (_, id, size) in &owned {
        if !kept.contains(id) {
            parts.artifacts.remove(id)?;
            removed.artifacts += 1;
            removed.bytes += size;
        }
    }
    Ok(removed)
}

/// `runs`, then the streams they own: those whose entry in [`OWNER_INDEX`] names one of them.
fn with_owned(parts: &Parts, runs: &[&str]) -> Result<Vec<String>> {
    const PAGE: u64 = 1_000;
    let mut all: Vec<String> = runs.iter().map(|r| r.to_string()).collect();
    let mut seen: HashSet<String> = all.iter().cloned().collect();
    for run in runs {
        let mut after: Option<String> = None;
        loop {
            let page = parts.reader.index_entries(&IndexQuery {
                index: OWNER_INDEX,
                value: Some(run),
                after: after.as_deref(),
                limit: PAGE,
                descending: false,
            })?;
            for e in &page {
                if seen.insert(e.key.clone()) {
                    all.push(e.key.clone());
                }
            }
            if (page.len() as u64) < PAGE {
                break;
            }
            after = page.last().map(|e| e.key.clone());
        }
    }
    Ok(all)
}

/// The artifact ids an envelope's text names as `"artifact://art_…"` strings (as keys too: a
/// reference kept by mistake only keeps an artifact).
pub(super) fn artifact_ids(text: &str) -> impl Iterator<Item = &str> {
    const NEEDLE: &str = "\"artifact://";
    text.match_indices(NEEDLE).filter_map(move |(i, _)| {
        let start = i + NEEDLE.len();
        let id = text.get(start..start + 20)?;
        (ids::is_artifact_id(id) && text.as_bytes().get(start + 20) == Some(&b'"')).then_some(id)
    })
}

pub(super) fn check_stream_id(id: &str) -> Result<()> {
    if id.starts_with("ses_") {
        ids::check_session_id(id)
    } else {
        ids::check_run_id(id)
    }
}

/// Copy the files of `from` (not its folders) into `to`, created; a missing `from` copies
/// nothing. Temporary files (a dot in front, or `.tmp` in the name) are left out. Returns how
/// many were copied.
fn copy_files(from: &Path, to: &Path) -> Result<u64> {
    let entries = match std::fs::read_dir(from) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            return Err(WorldError::io(
                "reading a directory to back it up",
                Some(from.to_path_buf()),
                e,
            ))
        }
    };
    std::fs::create_dir_all(to)
        .map_err(|e| WorldError::io("creating the backup directory", Some(to.to_path_buf()), e))?;
    let mut n = 0;
    for entry in entries {
        let entry =
            entry.map_err(|e| WorldError::io("reading a directory to back it up", Some(from.to_path_buf()), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || name.contains(".tmp") || !entry.path().is_file() {
            continue;
        }
        std::fs::copy(entry.path(), to.join(name))
            .map_err(|e| WorldError::io("copying a file into the backup", Some(entry.path()), e))?;
        n += 1;
    }
    crate::durable::sync_dir(to)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::artifact_ids;

    #[test]
    fn finds_the_artifact_ids_an_envelope_names() {
        let text = r#"{"a":"artifact://art_0123456789abcdef","b":["artifact://art_0123456789abcdeg","artifact://art_fedcba9876543210"],"c":"artifact://art_0123456789abcdef0"}"#;
        assert_eq!(
            artifact_ids(text).collect::<Vec<_>>(),
            ["art_0123456789abcdef", "art_fedcba9876543210"]
        );
    }
}
