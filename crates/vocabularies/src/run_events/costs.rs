//! Restoring a run's money from its durable events: the realized total and the conservative one.
//!
//! Each rule exists because a simpler one lost or double-counted money:
//!
//! - **Realized = max over every durable ABSOLUTE total**: `node:completed` / `node:failed` /
//!   `run:failed` / `run:cancelled` `.cumulativeCostMicrocents`, `run:completed.totalCostMicrocents`,
//!   `budget:paused.spentMicrocents` and `cost:attempt_settled.cumulativeCostMicrocents`. Each is
//!   read just after its own increment, so the largest is the true total whatever order the rows
//!   landed in (a fan-out may give the lower sequence the higher total). Never a sum of
//!   `cost:attempt_settled.costMicrocents`: added to the same total it double-counts attempts a
//!   node snapshot already includes; summed apart and maxed against the snapshots it loses every
//!   attempt after the last node boundary whenever earlier media spend (which only snapshots
//!   carry) is the larger figure. Never from `cost:updated`: it is streamed, not durable.
//! - **Conservative = Σ `budget:estimate_committed.estimateMicrocents` − Σ
//!   `budget:estimate_released.releasedMicrocents`**, overall and per model. Never last-wins over
//!   `cumulativeConservativeMicrocents` (a fan-out reorders it), and not a max either (a release
//!   makes the running total decrease). A release larger than what its model committed is a
//!   damaged log, refused rather than clamped, since clamping would hand money back as headroom.
//! - **Unpriced attempts** count `cost:attempt_settled` rows with `priced: false`.
//!
//! Every figure is a max or a sum, so the result does not depend on the order of the rows.

use super::log::{corrupt, read_run_events, Row};
use crate::rules::count;
use little_world_kernel::error::Result;
use little_world_kernel::numbers::MAX_SAFE_INTEGER;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A run's restored costs, in integer micro-cents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostRestore {
    /// The realized total: the largest durable absolute total in the log.
    pub realized_microcents: u64,
    /// The conservative (estimated, possibly billed) total: commitments less releases.
    pub conservative_microcents: u64,
    /// The conservative total per model; a model whose commitments were all released stays at 0.
    pub conservative_by_model: BTreeMap<String, u64>,
    /// How many settled attempts could not be priced (`cost:attempt_settled.priced: false`).
    pub unpriced_attempts: u64,
}

impl CostRestore {
    /// The contract's camelCase shape (`restoreRunCosts`): `realizedCostMicrocents`,
    /// `conservativeMicrocents`, `conservativeByModel`, `unpricedAttempts`.
    pub fn to_json(&self) -> Value {
        json!({
            "realizedCostMicrocents": self.realized_microcents,
            "conservativeMicrocents": self.conservative_microcents,
            "conservativeByModel": self.conservative_by_model,
            "unpricedAttempts": self.unpriced_attempts,
        })
    }
}

/// Restore the costs of a run's events (full run events: draft fields plus envelope), in any
/// order. Rows of unknown types are ignored; a known row that does not validate is corruption.
pub fn restore_costs(events: &[Value]) -> Result<CostRestore> {
    restore_rows(&read_run_events(events)?)
}

/// The durable absolute total a row carries, if it is one of the realized sources.
fn absolute_total(row: &Row<'_>) -> Option<u64> {
    let field = match row.t {
        "node:completed" | "node:failed" | "run:failed" | "run:cancelled" | "cost:attempt_settled" => {
            "cumulativeCostMicrocents"
        }
        "run:completed" => "totalCostMicrocents",
        "budget:paused" => "spentMicrocents",
        _ => return None,
    };
    count(row.fields, field)
}

pub(super) fn restore_rows(rows: &[Row<'_>]) -> Result<CostRestore> {
    let mut out = CostRestore::default();
    let mut committed: BTreeMap<&str, u128> = BTreeMap::new();
    let mut released: BTreeMap<&str, u128> = BTreeMap::new();
    // In any order, but each row once: a release counted twice would hand money back to the cap.
    let mut seen = std::collections::HashSet::new();
    for row in rows {
        if let Some(seq) = row.sequence {
            if !seen.insert(seq) {
                return Err(corrupt(
                    None,
                    Some(seq),
                    format!("sequence {seq} appears twice in the list"),
                ));
            }
        }
        if let Some(total) = absolute_total(row) {
            out.realized_microcents = out.realized_microcents.max(total);
        }
        if let Some((model, _, amount, is_release)) = super::estimate_of(row.t, row.fields) {
            let bucket = if is_release { &mut released } else { &mut committed };
            *bucket.entry(model).or_default() += u128::from(amount);
        }
        match row.t {
            "cost:attempt_settled" if row.fields.get("priced") == Some(&Value::Bool(false)) => {
                out.unpriced_attempts += 1;
            }
            _ => {}
        }
    }
    for (model, amount) in &released {
        let have = committed.get(model).copied().unwrap_or(0);
        if *amount > have {
            return Err(corrupt(
                None,
                None,
                format!(
                    "budget:estimate_released releases {amount} micro-cents of {model}, which committed only {have}"
                ),
            ));
        }
    }
    let mut total: u128 = 0;
    for (model, amount) in committed {
        let net = amount - released.get(model).copied().unwrap_or(0);
        total += net;
        if total > MAX_SAFE_INTEGER as u128 {
            return Err(corrupt(
                None,
                None,
                "the conservative total exceeds the safe integer range",
            ));
        }
        out.conservative_by_model.insert(model.to_string(), net as u64);
    }
    out.conservative_microcents = total as u64;
    Ok(out)
}
