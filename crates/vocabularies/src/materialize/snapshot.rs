//! Snapshots of a run's fold, so that materializing a long run reads only the events after its
//! latest snapshot.
//!
//! A snapshot is the fold's whole accumulator at a sequence, kept by the store beside the log
//! ([`little_world_kernel::store::FoldSnapshots`]) under a key naming this build's fold rules
//! ([`FOLD_VERSION`]) and the prices it was folded with, since a call's cost is fixed when it is
//! folded. It is a cache: a fold that finds none, or one it cannot use, reads the log from its
//! start, and gives the same state either way. One is used only when its text matches the digest it
//! carries, the run still has its sequence, and the run's event there is the one it was taken after
//! (by event id, which hashes the event's content). A world takes one in the background each time a
//! run reaches a multiple of [`SNAPSHOT_EVERY`] events, so a fold reads at most about that many
//! events.

use super::pricing::Pricing;
use super::{Fold, Session, Step, Usage};
use little_world_kernel::error::Result;
use little_world_kernel::ids;
use little_world_kernel::store::{LogReader, StoredSnapshot};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;

/// The version of the fold's rules and of the snapshot's fields. Change it with any change to
/// what the fold computes or keeps: snapshots under another version are not used.
pub const FOLD_VERSION: u32 = 1;

/// A run's events between snapshots.
pub const SNAPSHOT_EVERY: u64 = 10_000;

/// The key of snapshots folded by this build with `pricing`.
pub fn key(pricing: &Pricing) -> String {
    ids::sha256_tagged(format!("little-workflow fold {FOLD_VERSION}\n{}", pricing.fingerprint()).as_bytes())
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Saved {
    run_id: String,
    workflow_version_id: Option<String>,
    status: String,
    started_at: Option<String>,
    finished_at: Option<String>,
    output: Option<Box<RawValue>>,
    output_ref: Option<String>,
    error: Option<Box<RawValue>>,
    usage: SavedUsage,
    by_model: BTreeMap<String, SavedUsage>,
    steps: BTreeMap<String, SavedStep>,
    artifacts: Vec<String>,
    sessions: Vec<SavedSession>,
    drift: Vec<Value>,
    outer_loop: Option<Value>,
    event_count: u64,
    last_recorded_at: Option<String>,
    last_event_id: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SavedUsage {
    input_tokens: u64,
    output_tokens: u64,
    cached_input_tokens: u64,
    reasoning_tokens: u64,
    /// Femto-dollars, as decimal digits (more than a JSON number holds exactly).
    cost: String,
    priced_calls: u64,
    unpriced_calls: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SavedStep {
    kind: Option<String>,
    status: String,
    attempts: u64,
    started_at: Option<String>,
    finished_at: Option<String>,
    output: Option<Box<RawValue>>,
    output_ref: Option<String>,
    error: Option<Box<RawValue>>,
    group_id: Option<String>,
    usage: SavedUsage,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SavedSession {
    sequence: u64,
    role: String,
    run_id: String,
    manifest_hash: String,
    status: String,
}

/// A status as the fold holds it: one of the few it sets.
fn status(s: &str) -> Option<&'static str> {
    ["pending", "running", "completed", "failed"]
        .into_iter()
        .find(|k| *k == s)
}

impl SavedUsage {
    fn of(u: &Usage) -> SavedUsage {
        SavedUsage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_input_tokens: u.cached_input_tokens,
            reasoning_tokens: u.reasoning_tokens,
            cost: u.cost.to_string(),
            priced_calls: u.priced_calls,
            unpriced_calls: u.unpriced_calls,
        }
    }

    fn usage(self) -> Option<Usage> {
        Some(Usage {
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cached_input_tokens: self.cached_input_tokens,
            reasoning_tokens: self.reasoning_tokens,
            cost: self.cost.parse().ok()?,
            priced_calls: self.priced_calls,
            unpriced_calls: self.unpriced_calls,
        })
    }
}

impl Fold<'_> {
    /// This fold as a snapshot's text: a digest of the fields, a line break, the fields as JSON.
    pub fn snapshot_text(&self) -> String {
        let saved = Saved {
            run_id: self.run_id.clone(),
            workflow_version_id: self.workflow_version_id.clone(),
            status: self.status.to_string(),
            started_at: self.started_at.clone(),
            finished_at: self.finished_at.clone(),
            output: self.output.clone(),
            output_ref: self.output_ref.clone(),
            error: self.error.clone(),
            usage: SavedUsage::of(&self.usage),
            by_model: self
                .by_model
                .iter()
                .map(|(k, u)| (k.clone(), SavedUsage::of(u)))
                .collect(),
            steps: self
                .steps
                .iter()
                .map(|(k, s)| {
                    let saved = SavedStep {
                        kind: s.kind.clone(),
                        status: s.status.to_string(),
                        attempts: s.attempts,
                        started_at: s.started_at.clone(),
                        finished_at: s.finished_at.clone(),
                        output: s.output.clone(),
                        output_ref: s.output_ref.clone(),
                        error: s.error.clone(),
                        group_id: s.group_id.clone(),
                        usage: SavedUsage::of(&s.usage),
                    };
                    (k.clone(), saved)
                })
                .collect(),
            artifacts: self.artifacts.clone(),
            sessions: self
                .sessions
                .iter()
                .map(|s| SavedSession {
                    sequence: s.sequence,
                    role: s.role.clone(),
                    run_id: s.run_id.clone(),
                    manifest_hash: s.manifest_hash.clone(),
                    status: s.status.to_string(),
                })
                .collect(),
            drift: self.drift.clone(),
            outer_loop: self.outer_loop.clone(),
            event_count: self.event_count,
            last_recorded_at: self.last_recorded_at.clone(),
            last_event_id: self.last_event_id.clone(),
        };
        let body = serde_json::to_string(&saved).expect("a fold serializes");
        format!("{}\n{body}", ids::sha256_tagged(body.as_bytes()))
    }
}

impl<'p> Fold<'p> {
    /// The fold a snapshot's text holds, for `run_id` and `pricing`; `None` when the text is not
    /// whole (its digest does not match) or not a fold of this build's.
    pub fn from_snapshot(run_id: &str, pricing: &'p Pricing, text: &str) -> Option<Fold<'p>> {
        let (digest, body) = text.split_once('\n')?;
        if ids::sha256_tagged(body.as_bytes()) != digest {
            return None;
        }
        let s: Saved = serde_json::from_str(body).ok()?;
        if s.run_id != run_id {
            return None;
        }
        let mut steps = BTreeMap::new();
        for (path, st) in s.steps {
            let step = Step {
                kind: st.kind,
                status: status(&st.status)?,
                attempts: st.attempts,
                started_at: st.started_at,
                finished_at: st.finished_at,
                output: st.output,
                output_ref: st.output_ref,
                error: st.error,
                group_id: st.group_id,
                usage: st.usage.usage()?,
            };
            steps.insert(path, step);
        }
        let mut sessions = Vec::with_capacity(s.sessions.len());
        for x in s.sessions {
            sessions.push(Session {
                sequence: x.sequence,
                role: x.role,
                run_id: x.run_id,
                manifest_hash: x.manifest_hash,
                status: status(&x.status)?,
            });
        }
        let mut by_model = BTreeMap::new();
        for (k, u) in s.by_model {
            by_model.insert(k, u.usage()?);
        }
        Some(Fold {
            run_id: s.run_id,
            pricing,
            workflow_version_id: s.workflow_version_id,
            status: status(&s.status)?,
            started_at: s.started_at,
            finished_at: s.finished_at,
            output: s.output,
            output_ref: s.output_ref,
            error: s.error,
            usage: s.usage.usage()?,
            by_model,
            steps,
            seen_artifacts: s.artifacts.iter().cloned().collect(),
            artifacts: s.artifacts,
            sessions,
            drift: s.drift,
            outer_loop: s.outer_loop,
            event_count: s.event_count,
            last_recorded_at: s.last_recorded_at,
            last_event_id: s.last_event_id,
        })
    }
}

/// The fold of `run_id` at its latest snapshot that the log still agrees with, if the store
/// keeps snapshots and has one; `last` is the run's last sequence. A snapshot that cannot be
/// read is passed over: the fold then reads the whole log.
pub(super) fn resume<'p>(
    reader: &dyn LogReader,
    run_id: &str,
    pricing: &'p Pricing,
    last: u64,
) -> Result<Option<Fold<'p>>> {
    let Some(store) = reader.fold_snapshots() else {
        return Ok(None);
    };
    if last < SNAPSHOT_EVERY {
        return Ok(None); // no snapshot is taken before then
    }
    let Ok(Some(found)) = store.snapshot(run_id, &key(pricing)) else {
        return Ok(None);
    };
    let Some(fold) = Fold::from_snapshot(run_id, pricing, &found.state) else {
        return Ok(None);
    };
    if found.sequence == 0 || found.sequence > last || fold.event_count != found.sequence {
        return Ok(None);
    }
    let mut agrees = false;
    reader.rows(run_id, found.sequence - 1, Some(1), &mut |row| {
        agrees = row.sequence == found.sequence && row.event_id == fold.last_event_id;
        Ok(())
    })?;
    Ok(agrees.then_some(fold))
}

/// Fold `run_id` from its latest snapshot to its end and keep a snapshot there, if the store
/// keeps them: the background work a world does as a run grows.
pub fn take(reader: &dyn LogReader, run_id: &str, pricing: &Pricing) -> Result<()> {
    let Some(store) = reader.fold_snapshots() else {
        return Ok(());
    };
    let fold = super::stored::fold_from_store(reader, run_id, pricing)?;
    if fold.event_count < SNAPSHOT_EVERY {
        return Ok(());
    }
    let snapshot = StoredSnapshot {
        sequence: fold.event_count,
        state: fold.snapshot_text(),
    };
    store.put_snapshot(run_id, &key(pricing), &snapshot)
}
