//! The run-event fold: a run's state from its events in `sequenceNumber` order.
//!
//! The state, as JSON (object keys sorted, so the same events always give the same bytes):
//!
//! ```text
//! { status: 'pending'|'running'|'paused'|'completed'|'failed'|'cancelled',
//!   error?: <run:failed.error>,
//!   nodes: { <nodeId>: { status: 'running'|'retrying'|'completed'|'failed'|'skipped'|'waiting',
//!                        attempts, selected?, skipReason?, error?, cumulativeCostMicrocents? } },
//!   pendingGates: [{ gateId, nodeId, gateType }],        // gateType 'budget' for a budget gate
//!   pendingMediaJobs: [{ nodeId, jobId, provider, model, modality, startedAt, deadlineAt,
//!                        units?, acceptedCostMicrocents? }],
//!   budget: { warning?: { spentMicrocents, limitMicrocents, thresholdPct },
//!             paused?: { nodeId, gateId, spentMicrocents, limitMicrocents },
//!             limitMicrocents?, spentMicrocents? },
//!   timeout?: { elapsedMs, timeoutMs },
//!   costs: { realizedCostMicrocents, conservativeMicrocents, conservativeByModel, unpricedAttempts },
//!   pausedAggregateMismatch?: [{ sequenceNumber?, gateIds, openGateIds, missingGateIds,
//!                                unexpectedGateIds, pendingMediaJobNodeIds, openMediaJobNodeIds,
//!                                missingMediaJobNodeIds, unexpectedMediaJobNodeIds }] }
//! ```
//!
//! Rules:
//! - Run status: `pending` until any event; `run:started` and every activity event make it
//!   `running`; `human_gate:paused`, `budget:paused` and `run:paused` make it `paused` (a later
//!   event of a still-running sibling branch makes it `running` again); a run terminal sets the
//!   final status, and any event after it is corruption (exactly one terminal, and it is last).
//! - Node: `node:started` → running (attempts = its attemptNumber, absent ⇒ 1); `node:retrying` →
//!   retrying (attempts = the failed attempt, error = its error); a gate, a budget pause or a
//!   media submission → waiting; the resume → running; `node:completed` / `node:failed` /
//!   `node:skipped` end it with `selected` / `error` / `skipReason` and the node-boundary
//!   `cumulativeCostMicrocents`. A second terminal for a node is corruption; a non-terminal event
//!   after one does not move it (completed nodes are immutable). `attempts` counts the node-retry
//!   family only, never the within-chain `attemptNumber` of cost and agent events.
//! - Gates open on `human_gate:paused` / `budget:paused` and close on `human_gate:resumed` (by
//!   its `gateId` when it carries one, else the oldest open gate of its node), on the node's
//!   terminal, or at the run's end. Media jobs are pending from `media_job:submitted` until the
//!   node retries or ends (a re-submission replaces the node's job), or the run ends.
//! - `run:paused` is checked against the gates open at that point (and the media jobs pending):
//!   a disagreement is reported in `pausedAggregateMismatch`, one entry per mismatching
//!   `run:paused`, and does not fail the fold.
//! - `costs` is [`restore_costs`](super::restore_costs) of the same events, order-independent.

use super::costs::restore_rows;
use super::log::{corrupt, read_run_events, Row};
use crate::rules::count;
use little_world_kernel::error::Result;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

#[derive(Default)]
struct Node {
    status: &'static str,
    attempts: u64,
    selected: Option<Value>,
    skip_reason: Option<Value>,
    error: Option<Value>,
    cumulative: Option<Value>,
    ended: bool,
}

struct Gate {
    gate_id: String,
    node_id: String,
    gate_type: String,
}

#[derive(Default)]
struct State<'v> {
    status: &'static str,
    ended: bool,
    error: Option<Value>,
    nodes: BTreeMap<String, Node>,
    gates: Vec<Gate>,
    media: Vec<(String, Value)>,
    budget: Map<String, Value>,
    spent: Option<u64>,
    timeout: Option<Value>,
    mismatches: Vec<Value>,
    run_id: Option<&'v str>,
}

/// Fold a run's events (full run events, in `sequenceNumber` order) into its state; see the
/// module note for the shape and the rules. Rows out of order, a second terminal or an event
/// after the run's terminal are [`EventLogCorrupt`](little_world_kernel::error::WorldError::EventLogCorrupt).
pub fn fold(events: &[Value]) -> Result<Value> {
    let rows = read_run_events(events)?;
    let mut st = State {
        status: "pending",
        ..State::default()
    };
    let mut last: Option<u64> = None;
    for row in &rows {
        st.run_id = st.run_id.or(row.fields.get("runId").and_then(Value::as_str));
        if let (Some(prev), Some(seq)) = (last, row.sequence) {
            if seq <= prev {
                return Err(corrupt(st.run_id, Some(seq), format!("sequence {seq} follows {prev}")));
            }
        }
        last = row.sequence.or(last);
        st.apply(row)?;
    }
    let costs = restore_rows(&rows)?;
    Ok(st.into_json(costs.to_json()))
}

fn s(v: &Map<String, Value>, f: &str) -> String {
    v.get(f).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// A copy of the listed fields of an event that are present.
fn pick(v: &Map<String, Value>, fields: &[&str]) -> Value {
    let picked: Map<String, Value> = fields
        .iter()
        .filter_map(|f| v.get(*f).map(|x| (f.to_string(), x.clone())))
        .collect();
    Value::Object(picked)
}

/// `a` less `b`, as multisets, sorted.
fn minus(a: &[String], b: &[String]) -> Vec<String> {
    let mut rest = b.to_vec();
    let mut out: Vec<String> = a
        .iter()
        .filter(|x| match rest.iter().position(|y| y == *x) {
            Some(i) => {
                rest.swap_remove(i);
                false
            }
            None => true,
        })
        .cloned()
        .collect();
    out.sort();
    out
}

impl<'v> State<'v> {
    fn apply(&mut self, row: &Row<'_>) -> Result<()> {
        let f = row.fields;
        if self.ended {
            let msg = format!("{} after the run's terminal event", row.t);
            return Err(corrupt(self.run_id, row.sequence, msg));
        }
        let node_id = s(f, "nodeId");
        let attempt = count(f, "attemptNumber");
        // Any event but a timeout notice is activity: a pending or parked run is running.
        if row.t != "run:timeout" && matches!(self.status, "pending" | "paused") {
            self.status = "running";
        }
        match row.t {
            "node:started" => self.move_node(&node_id, "running", attempt.unwrap_or(1), |n| n.error = None),
            "node:retrying" => {
                self.media.retain(|(n, _)| *n != node_id);
                self.move_node(&node_id, "retrying", attempt.unwrap_or(1), |n| {
                    n.error = f.get("error").cloned()
                });
            }
            "node:completed" | "node:failed" | "node:skipped" => self.end_node(row, &node_id, attempt)?,
            "human_gate:paused" | "budget:paused" => {
                let gate_id = s(f, "gateId");
                if !self.gates.iter().any(|g| g.gate_id == gate_id) {
                    let gate_type = if row.t == "budget:paused" {
                        "budget".into()
                    } else {
                        s(f, "gateType")
                    };
                    self.gates.push(Gate {
                        gate_id,
                        node_id: node_id.clone(),
                        gate_type,
                    });
                }
                if row.t == "budget:paused" {
                    let paused = pick(f, &["nodeId", "gateId", "spentMicrocents", "limitMicrocents"]);
                    self.budget_figures(f);
                    self.budget.insert("paused".into(), paused);
                }
                self.move_node(&node_id, "waiting", 0, |_| {});
                self.status = "paused";
            }
            "human_gate:resumed" => {
                let by_id = f.get("gateId").and_then(Value::as_str);
                let found = match by_id {
                    Some(id) => self.gates.iter().position(|g| g.gate_id == id),
                    None => self.gates.iter().position(|g| g.node_id == node_id),
                };
                if let Some(i) = found {
                    let gate = self.gates.remove(i);
                    if self.budget.get("paused").and_then(|p| p.get("gateId")) == Some(&json!(gate.gate_id)) {
                        self.budget.remove("paused");
                    }
                }
                self.move_node(&node_id, "running", 0, |_| {});
            }
            "media_job:submitted" => {
                self.media.retain(|(n, _)| *n != node_id);
                let job = pick(
                    f,
                    &[
                        "nodeId",
                        "jobId",
                        "provider",
                        "model",
                        "modality",
                        "startedAt",
                        "deadlineAt",
                        "units",
                        "acceptedCostMicrocents",
                    ],
                );
                self.media.push((node_id.clone(), job));
                self.move_node(&node_id, "waiting", 0, |_| {});
            }
            "run:paused" => {
                self.check_aggregate(row);
                self.status = "paused";
            }
            "run:timeout" => self.timeout = Some(pick(f, &["elapsedMs", "timeoutMs"])),
            "budget:warning" => {
                self.budget_figures(f);
                let warning = pick(f, &["spentMicrocents", "limitMicrocents", "thresholdPct"]);
                self.budget.insert("warning".into(), warning);
            }
            "run:completed" | "run:failed" | "run:cancelled" => {
                self.status = match row.t {
                    "run:completed" => "completed",
                    "run:failed" => "failed",
                    _ => "cancelled",
                };
                self.error = (row.t == "run:failed").then(|| f.get("error").cloned()).flatten();
                self.ended = true;
                self.gates.clear();
                self.media.clear();
                self.budget.remove("paused");
            }
            _ => {}
        }
        Ok(())
    }

    /// Move a node that has not ended to `status`, raising its attempts to `attempt`.
    fn move_node(&mut self, id: &str, status: &'static str, attempt: u64, then: impl FnOnce(&mut Node)) {
        let node = self.nodes.entry(id.to_string()).or_default();
        if !node.ended {
            node.status = status;
            node.attempts = node.attempts.max(attempt);
            then(node);
        }
    }

    fn end_node(&mut self, row: &Row<'_>, id: &str, attempt: Option<u64>) -> Result<()> {
        let f = row.fields;
        let node = self.nodes.entry(id.to_string()).or_default();
        if node.ended {
            let msg = format!("{} for node {id}, which already ended", row.t);
            return Err(corrupt(self.run_id, row.sequence, msg));
        }
        node.ended = true;
        node.error = None;
        match row.t {
            "node:skipped" => {
                node.status = "skipped";
                node.skip_reason = f.get("reason").cloned();
            }
            t => {
                node.attempts = node.attempts.max(attempt.unwrap_or(1));
                node.cumulative = f.get("cumulativeCostMicrocents").cloned();
                if t == "node:completed" {
                    node.status = "completed";
                    node.selected = f.get("selected").cloned();
                } else {
                    node.status = "failed";
                    node.error = f.get("error").cloned();
                }
            }
        }
        self.gates.retain(|g| g.node_id != id);
        self.media.retain(|(n, _)| n != id);
        if self.budget.get("paused").and_then(|p| p.get("nodeId")) == Some(&json!(id)) {
            self.budget.remove("paused");
        }
        Ok(())
    }

    fn budget_figures(&mut self, f: &Map<String, Value>) {
        if let Some(limit) = f.get("limitMicrocents") {
            self.budget.insert("limitMicrocents".into(), limit.clone());
        }
        let spent = count(f, "spentMicrocents");
        self.spent = self.spent.max(spent);
    }

    fn check_aggregate(&mut self, row: &Row<'_>) {
        let ids = |f: &str| -> Vec<String> {
            let list = row.fields.get(f).and_then(Value::as_array);
            list.into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        };
        let declared = ids("gateIds");
        let open: Vec<String> = self.gates.iter().map(|g| g.gate_id.clone()).collect();
        let declared_media = ids("pendingMediaJobNodeIds");
        let open_media: Vec<String> = self.media.iter().map(|(n, _)| n.clone()).collect();
        let (missing, unexpected) = (minus(&open, &declared), minus(&declared, &open));
        let (missing_media, unexpected_media) =
            (minus(&open_media, &declared_media), minus(&declared_media, &open_media));
        if missing.is_empty() && unexpected.is_empty() && missing_media.is_empty() && unexpected_media.is_empty() {
            return;
        }
        let mut report = json!({
            "gateIds": declared,
            "openGateIds": open,
            "missingGateIds": missing,
            "unexpectedGateIds": unexpected,
            "pendingMediaJobNodeIds": declared_media,
            "openMediaJobNodeIds": open_media,
            "missingMediaJobNodeIds": missing_media,
            "unexpectedMediaJobNodeIds": unexpected_media,
        });
        if let Some(seq) = row.sequence {
            report["sequenceNumber"] = json!(seq);
        }
        self.mismatches.push(report);
    }

    fn into_json(mut self, costs: Value) -> Value {
        let nodes: Map<String, Value> = self
            .nodes
            .into_iter()
            .map(|(id, n)| {
                let mut v = json!({ "status": n.status, "attempts": n.attempts });
                for (k, x) in [
                    ("selected", n.selected),
                    ("skipReason", n.skip_reason),
                    ("error", n.error),
                    ("cumulativeCostMicrocents", n.cumulative),
                ] {
                    if let Some(x) = x {
                        v[k] = x;
                    }
                }
                (id, v)
            })
            .collect();
        let gates: Vec<Value> = self
            .gates
            .iter()
            .map(|g| json!({ "gateId": g.gate_id, "nodeId": g.node_id, "gateType": g.gate_type }))
            .collect();
        if let Some(spent) = self.spent {
            self.budget.insert("spentMicrocents".into(), json!(spent));
        }
        let mut out = json!({
            "status": self.status,
            "nodes": nodes,
            "pendingGates": gates,
            "pendingMediaJobs": self.media.into_iter().map(|(_, j)| j).collect::<Vec<_>>(),
            "budget": self.budget,
            "costs": costs,
        });
        for (k, x) in [("error", self.error), ("timeout", self.timeout)] {
            if let Some(x) = x {
                out[k] = x;
            }
        }
        if !self.mismatches.is_empty() {
            out["pausedAggregateMismatch"] = Value::Array(self.mismatches);
        }
        out
    }
}
