//! The cross-field refinements of the run events, one function per rule.
//!
//! Each runs after its shape's fields have checked out (so a required field is present and of
//! its type) and names the field to fix in its refusal, never a value.

use crate::rules::int;
use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::json_path::dotted;
use serde_json::{Map, Value};

/// `{ path? }` for a write, `{ command? }` for a process, `{ host? }` for egress, `{}` for os:
/// a preview field that belongs to another action is a wiring bug, refused.
pub(super) fn approval_preview(m: &Map<String, Value>) -> Result<()> {
    let own = match m.get("action").and_then(Value::as_str) {
        Some("fs_write") => "path",
        Some("process") => "command",
        Some("egress") => "host",
        _ => "",
    };
    for key in ["path", "command", "host"] {
        if key != own && m.get("preview").and_then(|p| p.get(key)).is_some() {
            return Err(WorldError::validation(
                dotted("event.preview", key),
                format!("preview.{key} does not belong to an approval of this action"),
            ));
        }
    }
    Ok(())
}

/// `priced: false` means the egress could not be priced: its `costMicrocents` is 0.
pub(super) fn unpriced_is_zero(m: &Map<String, Value>) -> Result<()> {
    if m.get("priced") == Some(&Value::Bool(false)) && int(m, "costMicrocents") != 0 {
        return Err(WorldError::validation(
            "event.costMicrocents",
            "an unpriced attempt (priced: false) carries costMicrocents 0",
        ));
    }
    Ok(())
}

/// The retry's error is the NodeFailure shape: the correlationId anchors only the terminal failure.
pub(super) fn retry_has_no_correlation(m: &Map<String, Value>) -> Result<()> {
    if m.get("error").and_then(|e| e.get("correlationId")).is_some() {
        return Err(WorldError::validation(
            "event.error.correlationId",
            "node:retrying carries no correlationId (it anchors the terminal node:failed)",
        ));
    }
    Ok(())
}

/// acceptedCostMicrocents present ⇒ units present; and deadlineAt = startedAt + a deadline.
pub(super) fn media_basis(m: &Map<String, Value>) -> Result<()> {
    if m.contains_key("acceptedCostMicrocents") && !m.contains_key("units") {
        return Err(WorldError::validation(
            "event.units",
            "acceptedCostMicrocents requires units: a frozen cost needs its frozen billed volume",
        ));
    }
    let instant = |f: &str| m.get(f).and_then(Value::as_str).and_then(crate::iso::parse_instant);
    if instant("deadlineAt") < instant("startedAt") {
        return Err(WorldError::validation(
            "event.deadlineAt",
            "must not be before startedAt",
        ));
    }
    Ok(())
}

/// An on-timeout policy only exists with a timeout.
pub(super) fn timeout_action_needs_timeout(m: &Map<String, Value>) -> Result<()> {
    if m.contains_key("timeoutAction") && !m.contains_key("timeoutMs") {
        return Err(WorldError::validation(
            "event.timeoutAction",
            "timeoutAction is only valid together with timeoutMs",
        ));
    }
    Ok(())
}

/// pendingGateCount is the count of gateIds, and at least one suspension (a gate or a media job).
pub(super) fn paused_aggregate(m: &Map<String, Value>) -> Result<()> {
    let gates = m.get("gateIds").and_then(Value::as_array).map_or(0, Vec::len);
    if int(m, "pendingGateCount") != gates as u64 {
        return Err(WorldError::validation(
            "event.pendingGateCount",
            format!("must equal gateIds.length ({gates})"),
        ));
    }
    let media = m
        .get("pendingMediaJobNodeIds")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if gates == 0 && media == 0 {
        return Err(WorldError::validation(
            "event.gateIds",
            "run:paused needs at least one suspension: a gate id or a pending media job node id",
        ));
    }
    Ok(())
}

/// The snapshot after a commitment includes it.
pub(super) fn cumulative_covers_estimate(m: &Map<String, Value>) -> Result<()> {
    if int(m, "cumulativeConservativeMicrocents") < int(m, "estimateMicrocents") {
        return Err(WorldError::validation(
            "event.cumulativeConservativeMicrocents",
            "must be at least estimateMicrocents (the running total includes this commitment)",
        ));
    }
    Ok(())
}

/// The refinements checked on write only: they came after logs were first written, and a row an
/// earlier version stored must stay readable.
pub(super) fn on_write(t: &str, m: &Map<String, Value>) -> Result<()> {
    match t {
        "budget:warning" => warning_threshold(m),
        "cost:attempt_settled" => settled_includes_its_cost(m),
        _ => Ok(()),
    }
}

/// A settled attempt's run-wide total after it (`cumulativeCostMicrocents`) includes its own cost.
fn settled_includes_its_cost(m: &Map<String, Value>) -> Result<()> {
    if int(m, "cumulativeCostMicrocents") < int(m, "costMicrocents") {
        return Err(WorldError::validation(
            "event.cumulativeCostMicrocents",
            "must be at least costMicrocents (the run-wide total after this attempt includes it)",
        ));
    }
    Ok(())
}

/// `thresholdPct` is `clamp(round(spent / limit * 100), 0, 100)`. The producer computes it in
/// floating point: what that gives is taken, and so is the exact value rounded either way at an
/// exact half. A limit of 0 leaves it as given.
fn warning_threshold(m: &Map<String, Value>) -> Result<()> {
    let (spent, limit, pct) = (
        u128::from(int(m, "spentMicrocents")),
        u128::from(int(m, "limitMicrocents")),
        u128::from(int(m, "thresholdPct")),
    );
    if limit == 0 {
        return Ok(());
    }
    // |pct - 100 * spent / limit| <= 1/2, or 100 once spent reaches the limit.
    let exact = if spent >= limit {
        pct == 100
    } else {
        (2 * pct * limit).abs_diff(200 * spent) <= limit
    };
    // As JavaScript computes it (`Math.round` and `f64::round` agree on non-negative numbers).
    let float = (spent as f64 / limit as f64 * 100.0).round().clamp(0.0, 100.0) == pct as f64;
    let fits = exact || float;
    if !fits {
        return Err(WorldError::validation(
            "event.thresholdPct",
            "must be spentMicrocents / limitMicrocents * 100, rounded, and at most 100",
        ));
    }
    Ok(())
}

/// A mid-turn abort is user-initiated, not a failure: it carries no error.
pub(super) fn aborted_has_no_error(m: &Map<String, Value>) -> Result<()> {
    if m.get("stopReason").and_then(Value::as_str) == Some("aborted") && m.contains_key("error") {
        return Err(WorldError::validation(
            "event.error",
            "a turn that stopped with 'aborted' carries no error",
        ));
    }
    Ok(())
}
