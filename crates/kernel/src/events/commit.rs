//! Committing prepared appends: each unit (one append, or a group that commits whole) in a
//! savepoint of its own inside one write transaction of a backend, checked against the stored rows
//! (idempotency keys, `expectedSequence`, index holders, run and node ends, budget estimates and
//! token totals), then given the next dense sequence, its event id and its row.

use super::{
    fill_placeholder, sequence_of, Artifacts, EnvelopeFields, Estimate, PreparedAppend, EVENT_ID_PLACEHOLDER,
    OWNER_INDEX,
};
use crate::canonical;
use crate::catalog::CatalogNote;
use crate::error::{Result, WorldError};
use crate::ids;
use crate::store::{LogTx, LogWriter, RowRef, Scope};
use crate::vocabulary::{Usage, USAGE_FIELDS};
use std::collections::HashMap;

/// Outcome of one append in a batch: the envelope's canonical JSON, or why it was refused.
pub type AppendOutcome = Result<String>;

/// Outcome of one unit of a batch (see [`commit_units`]): the envelopes of its appends in order,
/// or why the unit was refused.
pub type UnitOutcome = Result<Vec<String>>;

/// Commit a group of prepared appends in one write transaction, each in a savepoint of its own
/// (a group of one is its own transaction).
///
/// Returns one outcome per append, in order. If the transaction itself fails (the disk, the
/// commit), every append of the group gets that error and nothing of the group is stored.
///
/// `artifacts` stores the large values appends moved out of their payloads, each once its row is
/// inserted and before the commit: an event never refers to an artifact not yet durable.
pub fn commit_batch(
    writer: &mut dyn LogWriter,
    artifacts: &dyn Artifacts,
    batch: &mut [PreparedAppend],
    recorded_at: &str,
) -> Vec<AppendOutcome> {
    let units = vec![1; batch.len()];
    commit_units(writer, artifacts, batch, &units, recorded_at)
        .into_iter()
        .map(|outcome| outcome.map(|mut envelopes| envelopes.pop().expect("a unit of one has one envelope")))
        .collect()
}

/// Commit `batch`, cut into units of `units[i]` appends each, in one write transaction. A unit
/// commits whole or not at all, in a savepoint of its own, so that a unit refused fails alone and
/// the rest of the batch commits; its appends take consecutive places in call order. A batch of
/// one unit is its own transaction and needs no savepoint.
///
/// Returns one outcome per unit, in order. If the transaction itself fails (the disk, the
/// commit), every unit gets that error and nothing of the batch is stored.
pub fn commit_units(
    writer: &mut dyn LogWriter,
    artifacts: &dyn Artifacts,
    batch: &mut [PreparedAppend],
    units: &[usize],
    recorded_at: &str,
) -> Vec<UnitOutcome> {
    debug_assert_eq!(units.iter().sum::<usize>(), batch.len());
    // Each envelope is finished in its prepared head (taken here; nothing commits a batch twice).
    let mut heads: Vec<String> = batch.iter_mut().map(|item| std::mem::take(&mut item.head)).collect();
    let batch: &[PreparedAppend] = batch;
    if let [_] = units {
        let outcome = commit_alone(artifacts, batch, &mut heads, recorded_at, |scope, body| {
            Some(writer.transaction(scope, body))
        });
        return vec![outcome.expect("a transaction that may wait always runs")];
    }
    let mut outcomes: Vec<UnitOutcome> = Vec::with_capacity(units.len());
    let result = writer.transaction(&scope_of(batch), &mut |tx| {
        outcomes.clear();
        let again = tx.may_run_again();
        let mut next: HashMap<&str, Cursor> = HashMap::new();
        let (mut items, mut heads) = (batch, heads.as_mut_slice());
        for &n in units {
            let (unit, rest) = items.split_at(n);
            let (unit_heads, rest_heads) = std::mem::take(&mut heads).split_at_mut(n);
            (items, heads) = (rest, rest_heads);
            // What the batch knew of the unit's runs before it, for when it is undone.
            let before: Vec<(&str, Option<Cursor>)> = unit
                .iter()
                .map(|i| (i.run_id.as_str(), next.get(i.run_id.as_str()).copied()))
                .collect();
            tx.savepoint()?;
            match append_unit(tx, artifacts, &mut next, unit, unit_heads, again, recorded_at) {
                Ok(envelopes) => {
                    tx.release()?;
                    outcomes.push(Ok(envelopes));
                }
                Err(e) => {
                    tx.rollback_to()?;
                    for (run, cursor) in before.into_iter().rev() {
                        match cursor {
                            Some(c) => next.insert(run, c),
                            None => next.remove(run),
                        };
                    }
                    outcomes.push(Err(e));
                }
            }
        }
        Ok(())
    });
    match result {
        Ok(()) => outcomes,
        Err(e) => units.iter().map(|_| Err(e.clone())).collect(),
    }
}

/// Commit one append on the calling thread if the store can without waiting (see
/// [`LogWriter::transaction_if_immediate`]); `None`, with `item` as it was, for the writer's thread.
pub fn commit_now(
    writer: &mut dyn LogWriter,
    artifacts: &dyn Artifacts,
    item: &mut PreparedAppend,
    recorded_at: &str,
) -> Option<AppendOutcome> {
    let mut heads = [std::mem::take(&mut item.head)];
    let outcome = commit_alone(
        artifacts,
        std::slice::from_ref(item),
        &mut heads,
        recorded_at,
        |scope, body| writer.transaction_if_immediate(scope, body),
    );
    let [head] = heads;
    match outcome {
        Some(outcome) => Some(outcome.map(|mut envelopes| envelopes.pop().expect("one append, one envelope"))),
        None => {
            item.head = head; // The body did not run: the head is as it was.
            None
        }
    }
}

/// An event read from an archive: its append prepared again from its envelope, the time it was
/// recorded, and the envelope the archive holds for it.
pub struct ImportedEvent {
    pub prepared: PreparedAppend,
    pub recorded_at: String,
    pub envelope: String,
}

/// Commit imported events of one stream in one transaction, each through the append rules as its
/// own append went (density, terminals, budget estimates, token totals, index holders), at its
/// recorded time. Refused, with nothing committed, unless each envelope the rules make is byte for
/// byte the one the archive holds: so an event id, digest, sequence or payload changed in the
/// archive is found out. An import stores no artifact here: it never moves a value out.
pub fn commit_imported(writer: &mut dyn LogWriter, events: &[ImportedEvent]) -> Result<()> {
    let scope = scope_of(events.iter().map(|e| &e.prepared));
    writer.transaction(&scope, &mut |tx| {
        let mut next: HashMap<&str, Cursor> = HashMap::new();
        for event in events {
            let item = &event.prepared;
            let (made, _) = append_one(tx, &mut next, item, item.head.clone(), &event.recorded_at)?;
            if made != event.envelope {
                return Err(WorldError::EventLogCorrupt {
                    run_id: Some(item.run_id.clone()),
                    sequence: sequence_of(&event.envelope),
                    reason: "the archive's envelope is not the one its append makes: its eventId, digest, \
                             sequence or payload was changed"
                        .into(),
                });
            }
        }
        Ok(())
    })
}

/// A unit of appends as a transaction of its own (`None` when `transaction` did not run it).
/// Rolling that back undoes exactly this unit, so it needs no savepoint of its own.
fn commit_alone(
    artifacts: &dyn Artifacts,
    unit: &[PreparedAppend],
    heads: &mut [String],
    recorded_at: &str,
    transaction: impl FnOnce(&Scope<'_>, &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Option<Result<()>>,
) -> Option<UnitOutcome> {
    let mut envelopes = Vec::new();
    let result = transaction(&scope_of(unit), &mut |tx| {
        let again = tx.may_run_again();
        envelopes = append_unit(tx, artifacts, &mut HashMap::new(), unit, heads, again, recorded_at)?;
        Ok(())
    })?;
    Some(result.map(|()| envelopes))
}

/// Append each of `unit` in order, then store the values the new ones moved out of their
/// payloads: only once every append of the unit has passed its checks, so that a unit refused
/// leaves no artifact behind. On an error the caller undoes the unit.
fn append_unit<'b>(
    tx: &mut dyn LogTx,
    artifacts: &dyn Artifacts,
    next: &mut HashMap<&'b str, Cursor>,
    unit: &'b [PreparedAppend],
    heads: &mut [String],
    again: bool,
    recorded_at: &str,
) -> Result<Vec<String>> {
    let mut envelopes = Vec::with_capacity(unit.len());
    let mut spills = Vec::new();
    for (item, head) in unit.iter().zip(heads.iter_mut()) {
        let (envelope, appended) = append_one(tx, next, item, take_head(head, again), recorded_at)?;
        if let (true, Some(spill)) = (appended, &item.spill) {
            spills.push((item.run_id.as_str(), spill));
        }
        envelopes.push(envelope);
    }
    for (run, spill) in spills {
        let stored = artifacts.store_json(run, &spill.step_path, spill.name, spill.text.clone())?;
        if stored != spill.artifact_id {
            return Err(WorldError::RuntimeIntegrity {
                reason: format!(
                    "internal error: {} was stored as {stored}, not as the {} its event names",
                    spill.name, spill.artifact_id
                ),
            }
            .for_run(run));
        }
    }
    Ok(envelopes)
}

/// A prepared head for one run of a transaction's body: a copy when the run may be undone and
/// the body run again (see [`LogWriter::transaction`]), else the head itself.
fn take_head(head: &mut String, again: bool) -> String {
    if again {
        head.clone()
    } else {
        std::mem::take(head)
    }
}

/// What committing `batch` will ask of the store: its streams, keys, node ends and estimates.
fn scope_of<'a>(batch: impl IntoIterator<Item = &'a PreparedAppend>) -> Scope<'a> {
    let mut scope = Scope::default();
    let mut seen = std::collections::HashSet::new();
    for item in batch.into_iter().filter(|i| i.refused.is_none()) {
        let run = item.run_id.as_str();
        if seen.insert(run) {
            scope.runs.push(run);
        }
        for owner in item
            .index
            .iter()
            .filter(|w| w.index == OWNER_INDEX)
            .filter_map(|w| w.value.as_deref())
        {
            scope.owners.push(owner);
        }
        if let Some(key) = &item.key {
            scope.keys.push((run, key));
        }
        if let Some(node) = item.terminal.as_deref().filter(|n| !n.is_empty()) {
            scope.nodes.push((run, node));
        }
        if item.estimate.is_some() {
            scope.estimates.push(run);
        }
        scope.stores_artifacts |= item.spill.is_some();
    }
    scope
}

/// An idempotency key as an error may show it: one that looks like a credential is not shown.
fn shown_key(key: &str) -> String {
    if crate::vocabulary::hides(key) {
        "<a key that looks like a credential>".to_string()
    } else {
        key.to_string()
    }
}

/// What the group knows of a run so far: its last sequence and the sequence of its end, if any.
#[derive(Clone, Copy)]
struct Cursor {
    last: u64,
    ended: Option<u64>,
}

/// Append `item` after what `next` says of its run: `(envelope, true)` for a new event,
/// `(envelope, false)` for a keyed retry answered by the event it stored before. Any large value
/// the item moved out of its payload is the caller's to store (see [`append_unit`]).
fn append_one<'b>(
    tx: &mut dyn LogTx,
    next: &mut HashMap<&'b str, Cursor>,
    item: &'b PreparedAppend,
    head: String,
    recorded_at: &str,
) -> Result<(String, bool)> {
    let run = item.run_id.as_str();
    // A refused append is answered by `answer_refused`, and written by no one.
    if let Some(refusal) = &item.refused {
        return Err(refusal.clone());
    }
    if let (Some(key), Some(digest)) = (&item.key, &item.digest) {
        if let Some(found) = tx.find_by_key(run, key)? {
            if &found.digest == digest {
                return Ok((found.envelope, false));
            }
            return Err(WorldError::IdempotencyConflict {
                run_id: item.run_id.clone(),
                key: shown_key(key),
                sequence: found.sequence,
                stored_digest: found.digest,
                request_digest: digest.clone(),
            });
        }
    }
    let cursor = match next.get(run) {
        Some(&c) => c,
        None => Cursor {
            last: tx.last_sequence(run)?,
            ended: tx.terminal(run, "")?,
        },
    };
    if let Some(expected) = item.expected_sequence.filter(|&e| e != cursor.last) {
        return Err(WorldError::SequenceConflict {
            run_id: item.run_id.clone(),
            expected,
            last: cursor.last,
        });
    }
    for w in &item.index {
        if let Some(holder) = tx.index_holder(&w.index, &w.key)?.filter(|h| h != run) {
            return Err(WorldError::IndexConflict {
                run_id: item.run_id.clone(),
                index: w.index.clone(),
                key: w.key.clone(),
                holder,
            });
        }
    }
    for (i, w) in item.index.iter().enumerate() {
        if let (OWNER_INDEX, Some(owner)) = (w.index.as_str(), w.value.as_deref()) {
            if owner != run && tx.last_sequence(owner)? == 0 {
                return Err(WorldError::validation(
                    format!("index[{i}].value"),
                    format!(
                        "names {} as the owner of {}, and it holds no events: a stream is owned only by a run that \
                         exists (a deleted run owns nothing)",
                        canonical::string_literal(owner),
                        canonical::string_literal(run)
                    ),
                )
                .for_run(run));
            }
        }
    }
    if let Some(end) = cursor.ended {
        return Err(WorldError::validation(
            "type",
            format!("{run} ended at sequence {end}: nothing may follow its terminal event"),
        )
        .for_run(run));
    }
    if let Some(node) = item.terminal.as_deref().filter(|n| !n.is_empty()) {
        if let Some(at) = tx.terminal(run, node)? {
            return Err(WorldError::validation(
                "nodeId",
                format!(
                    "node {} already ended at sequence {at}: a node has exactly one terminal event",
                    canonical::string_literal(node)
                ),
            )
            .for_run(run));
        }
    }
    if let Some(estimate) = &item.estimate {
        check_estimate(tx, run, estimate)?;
    }
    if let Some(usage) = &item.usage {
        check_usage(tx, run, usage)?;
    }
    let sequence = cursor.last + 1;
    let event_id = ids::event_id_finish(&item.id_prefix, sequence, &item.event_type);
    let mut envelope = head;
    fill_placeholder(&mut envelope, item.id_at, EVENT_ID_PLACEHOLDER, &event_id);
    let fields = EnvelopeFields {
        event_id: &event_id,
        run_id: run,
        sequence,
        event_type: &item.event_type,
        key: item.key.as_deref(),
        digest: item.digest.as_deref(),
        recorded_at,
    };
    fields.finish(&mut envelope);
    tx.insert(&RowRef {
        run_id: run,
        sequence,
        event_id: &event_id,
        event_type: &item.event_type,
        key: item.key.as_deref(),
        digest: item.digest.as_deref(),
        recorded_at,
        envelope: &envelope,
    })?;
    tx.catalog(CatalogNote {
        run_id: item.run_id.clone(),
        sequence,
        recorded_at: recorded_at.to_string(),
        status: item.status,
    })?;
    if let Some(node) = &item.terminal {
        tx.insert_terminal(run, node, sequence, &item.event_type)?;
    }
    for w in &item.index {
        tx.put_index(&w.index, &w.key, w.value.as_deref(), run, sequence)?;
    }
    if let Some(e) = &item.estimate {
        tx.add_estimate(run, &e.model, e.amount, e.released)?;
    }
    if let Some(usage) = item.usage {
        tx.add_usage(run, usage.tokens)?;
    }
    next.insert(
        run,
        Cursor {
            last: sequence,
            ended: item.terminal.as_deref().filter(|n| n.is_empty()).map(|_| sequence),
        },
    );
    Ok((envelope, true))
}

/// Check that an event's token counts keep each of `run`'s token totals within 2^53 - 1.
fn check_usage(tx: &mut dyn LogTx, run: &str, usage: &Usage) -> Result<()> {
    let totals = tx.usage(run)?;
    for ((total, add), field) in totals.iter().zip(&usage.tokens).zip(USAGE_FIELDS) {
        if total
            .checked_add(*add)
            .is_none_or(|t| t > crate::numbers::MAX_SAFE_INTEGER as u64)
        {
            return Err(WorldError::validation(
                format!("{}.{field}", usage.at),
                format!(
                    "would take {run}'s {field} past 2^53 - 1 ({total} so far), which its usage could no longer be summed exactly to"
                ),
            )
            .for_run(run));
        }
    }
    Ok(())
}

/// Check `estimate` against what `run` has committed and released so far.
fn check_estimate(tx: &mut dyn LogTx, run: &str, estimate: &Estimate) -> Result<()> {
    let model = canonical::string_literal(&estimate.model);
    let amount = estimate.amount;
    if estimate.released {
        let open = tx.estimate(run, &estimate.model)?;
        if amount > open {
            return Err(WorldError::validation(
                estimate.at.clone(),
                format!(
                    "releases {amount} micro-cents of {model}, but {run} has only {open} committed and not released for it"
                ),
            )
            .for_run(run));
        }
    } else if tx.estimate_total(run)?.saturating_add(amount) > crate::numbers::MAX_SAFE_INTEGER as u64 {
        return Err(WorldError::validation(
            estimate.at.clone(),
            format!("commits {amount} micro-cents of {model}, taking {run}'s conservative total past 2^53 - 1"),
        )
        .for_run(run));
    }
    Ok(())
}
