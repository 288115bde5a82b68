//! The cost restore against every trap of the cost rules, each answer worked out by hand.

use super::support::{ev, shuffled};
use crate::run_events::{restore_costs, CostRestore};
use serde_json::{json, Value};
use std::collections::BTreeMap;

fn settled(seq: u64, node: &str, cost: u64, cumulative: u64) -> Value {
    ev(
        seq,
        "cost:attempt_settled",
        json!({ "nodeId": node, "model": "claude-haiku-4-5", "attemptNumber": 1, "inputTokens": 100, "outputTokens": 20,
                "costMicrocents": cost, "cumulativeCostMicrocents": cumulative, "priced": true }),
    )
}

fn completed(seq: u64, node: &str, cumulative: u64) -> Value {
    ev(
        seq,
        "node:completed",
        json!({ "nodeId": node, "output": "ok", "tokensUsed": { "input": 0, "output": 0 }, "durationMs": 10,
                "cumulativeCostMicrocents": cumulative }),
    )
}

fn commit(seq: u64, model: &str, estimate: u64, cumulative: u64) -> Value {
    ev(
        seq,
        "budget:estimate_committed",
        json!({ "nodeId": "n1", "model": model, "estimateMicrocents": estimate, "cumulativeConservativeMicrocents": cumulative }),
    )
}

fn release(seq: u64, model: &str, released: u64, cumulative: u64) -> Value {
    ev(
        seq,
        "budget:estimate_released",
        json!({ "model": model, "releasedMicrocents": released, "cumulativeConservativeMicrocents": cumulative }),
    )
}

fn realized(events: &[Value]) -> u64 {
    restore_costs(events).unwrap().realized_microcents
}

/// A media node's snapshot beside attempt rows before and after it, and a streamed cost:updated.
///
/// n1 (agent) settles 1,000 then 2,000 (cumulative 1,000, 3,000) and completes at 3,000. m1 (a
/// media node: no attempt rows) completes at 53,000, so its media spend is 50,000 and lives only in
/// that snapshot. n2 (agent) then settles 4,000 and 500 (cumulative 57,000, 57,500) and the
/// process dies before n2's boundary. The engine's real total is 57,500.
/// - Σ attempt deltas = 1,000 + 2,000 + 4,000 + 500 = 7,500: loses the media spend.
/// - max(snapshots) + Σ deltas = 53,000 + 7,500 = 60,500: counts n1's 3,000 twice.
/// - max(max(snapshots), Σ deltas) = max(53,000, 7,500) = 53,000: loses n2's 4,500, which a resume
///   would spend again.
/// - cost:updated's live 70,000 is not durable: it must not count at all.
/// - max over every durable absolute total = max(1,000, 3,000, 3,000, 53,000, 57,000, 57,500) = 57,500.
fn media_then_attempts() -> Vec<Value> {
    vec![
        ev(
            1,
            "run:started",
            json!({ "workflowId": "3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b", "inputs": {}, "executionMode": "local" }),
        ),
        ev(2, "node:started", json!({ "nodeId": "n1", "nodeType": "agent" })),
        settled(3, "n1", 1_000, 1_000),
        settled(4, "n1", 2_000, 3_000),
        completed(5, "n1", 3_000),
        ev(
            6,
            "media_job:submitted",
            json!({ "nodeId": "m1", "jobId": "j1", "provider": "openai", "model": "gpt-image-1",
            "modality": "image", "startedAt": "2026-05-21T10:00:00Z", "deadlineAt": "2026-05-21T10:30:00Z", "units": 1,
            "acceptedCostMicrocents": 50_000 }),
        ),
        completed(7, "m1", 53_000),
        ev(8, "node:started", json!({ "nodeId": "n2", "nodeType": "agent" })),
        settled(9, "n2", 4_000, 57_000),
        ev(
            10,
            "cost:updated",
            json!({ "nodeId": "n2", "model": "m", "inputTokens": 1, "outputTokens": 1,
            "costMicrocents": 12_500, "cumulativeCostMicrocents": 70_000 }),
        ),
        settled(11, "n2", 500, 57_500),
    ]
}

#[test]
fn media_snapshot_beside_attempt_rows() {
    assert_eq!(realized(&media_then_attempts()), 57_500);
}

/// A fan-out where the lower sequence carries the higher cumulative: branch b's increment landed
/// second in the engine (cumulative 9,000) but got sequence 3 after an await; a's (5,000) got 4.
/// Last-wins would restore 5,000 and hand 4,000 of owed money back to the cap; max gives 9,000.
/// The same holds for the conservative twin: commitments of 3,000 (cumulative 7,000, seq 5) and
/// 4,000 (cumulative 4,000, seq 6); last-wins over the snapshot says 4,000, the sum says 7,000.
fn fan_out() -> Vec<Value> {
    vec![
        settled(3, "b", 4_000, 9_000),
        settled(4, "a", 5_000, 5_000),
        commit(5, "m", 3_000, 7_000),
        commit(6, "m", 4_000, 4_000),
    ]
}

#[test]
fn fan_out_lower_sequence_higher_total() {
    let r = restore_costs(&fan_out()).unwrap();
    assert_eq!(r.realized_microcents, 9_000);
    assert_eq!(r.conservative_microcents, 7_000);
}

/// An attempt after the last node boundary: n1 completes at 10,000, then n2 settles 2,500
/// (cumulative 12,500) and the run crashes. Node snapshots alone restore 10,000 and the resumed
/// run spends the 2,500 again; the attempt row's absolute total makes it 12,500.
#[test]
fn attempt_after_last_node_boundary() {
    let events = vec![completed(4, "n1", 10_000), settled(6, "n2", 2_500, 12_500)];
    assert_eq!(realized(&events), 12_500);
}

/// Run and budget absolutes. The root-cause node fails at 30,000; a sibling's abandoned paid media
/// job (12,000) is folded just before run:failed, which snapshots 42,000. Summing the two
/// snapshots gives 72,000; the answer is the larger, 42,000. budget:paused's spent (18,000) and
/// budget:warning (not a durable absolute total, 99,000) do not raise it.
#[test]
fn run_and_budget_absolutes() {
    let failed = json!({ "nodeId": "n1", "error": { "code": "provider_unavailable", "message": "503", "retryable": true },
        "cumulativeCostMicrocents": 30_000 });
    let events = vec![
        ev(
            3,
            "budget:paused",
            json!({ "nodeId": "n1", "spentMicrocents": 18_000, "limitMicrocents": 20_000, "gateId": "bg" }),
        ),
        ev(
            4,
            "budget:warning",
            json!({ "spentMicrocents": 99_000, "limitMicrocents": 100_000, "thresholdPct": 99 }),
        ),
        ev(5, "node:failed", failed),
        ev(
            6,
            "run:failed",
            json!({ "error": { "code": "provider_unavailable", "message": "503", "retryable": false },
            "partialOutputs": {}, "cumulativeCostMicrocents": 42_000 }),
        ),
    ];
    assert_eq!(realized(&events), 42_000);
    // budget:paused alone is a durable absolute: spent 18,000 above a 15,000 node snapshot.
    assert_eq!(realized(&[completed(1, "n1", 15_000), events[0].clone()]), 18_000);
    let done = ev(
        9,
        "run:completed",
        json!({ "outputs": {}, "totalTokensUsed": { "input": 1, "output": 1 },
        "totalCostMicrocents": 61_000, "durationMs": 1 }),
    );
    assert_eq!(realized(&[completed(1, "n1", 60_000), done]), 61_000);
    assert_eq!(
        realized(&[
            ev(2, "run:cancelled", json!({ "cumulativeCostMicrocents": 5 })),
            ev(3, "run:cancelled", json!({}))
        ]),
        5
    );
}

/// Conservative per model, with releases. m-a commits 3,000 + 4,000 and releases 4,000 → 3,000;
/// m-b commits 2,000 and releases it all → 0 (kept, at 0). Total 3,000. The release's
/// post-release snapshot (3,000 then 0) would make a max-over-snapshots read 9,000 (the largest
/// commit snapshot) and hand nothing back; the signed sum is the rule.
#[test]
fn conservative_sum_less_releases_per_model() {
    let events = vec![
        commit(1, "m-a", 3_000, 3_000),
        commit(2, "m-a", 4_000, 7_000),
        commit(3, "m-b", 2_000, 9_000),
        release(4, "m-a", 4_000, 5_000),
        release(5, "m-b", 2_000, 3_000),
    ];
    let r = restore_costs(&events).unwrap();
    assert_eq!(r.conservative_microcents, 3_000);
    assert_eq!(
        r.conservative_by_model,
        BTreeMap::from([("m-a".into(), 3_000), ("m-b".into(), 0)])
    );
    assert_eq!(r.realized_microcents, 0, "an estimate is never realized spend");
    // Releasing more than a model committed is a damaged log, not negative headroom.
    let over = vec![commit(1, "m-a", 1_000, 1_000), release(2, "m-a", 1_001, 0)];
    assert_eq!(restore_costs(&over).unwrap_err().code(), "EVENT_LOG_CORRUPT");
    let stray = vec![commit(1, "m-a", 1_000, 1_000), release(2, "m-b", 1, 0)];
    assert_eq!(restore_costs(&stray).unwrap_err().code(), "EVENT_LOG_CORRUPT");
}

/// Unpriced attempts count cost:attempt_settled rows with priced: false (2 here), never cost:updated.
#[test]
fn unpriced_attempts() {
    let mut unpriced = settled(1, "n1", 0, 0);
    unpriced["priced"] = json!(false);
    let mut again = unpriced.clone();
    again["sequenceNumber"] = json!(2);
    let live = ev(
        3,
        "cost:updated",
        json!({ "nodeId": "n1", "model": "m", "inputTokens": 1, "outputTokens": 1,
        "costMicrocents": 0, "cumulativeCostMicrocents": 0, "priced": false }),
    );
    let r = restore_costs(&[unpriced, again, settled(4, "n1", 10, 10), live]).unwrap();
    assert_eq!(r.unpriced_attempts, 2);
    assert_eq!(
        r.to_json(),
        json!({ "realizedCostMicrocents": 10, "conservativeMicrocents": 0, "conservativeByModel": {}, "unpricedAttempts": 2 })
    );
}

#[test]
fn empty_and_unknown_rows() {
    assert_eq!(restore_costs(&[]).unwrap(), CostRestore::default());
    let newer = ev(2, "iteration:started", json!({ "cumulativeCostMicrocents": 1_000_000 }));
    assert_eq!(realized(&[completed(1, "n1", 10), newer]), 10);
}

#[test]
fn damaged_rows_are_corruption() {
    let mut bad = completed(1, "n1", 10);
    bad["cumulativeCostMicrocents"] = json!("10");
    for events in [
        vec![bad],
        vec![json!(["not", "an", "event"])],
        vec![json!({ "runId": "run_1", "sequenceNumber": 1 })],
        vec![ev(
            1,
            "session:started",
            json!({ "agentRef": "a", "model": "m", "context": {} }),
        )],
        vec![completed(1, "n1", 1), {
            let mut other = completed(2, "n2", 2);
            other["runId"] = json!("run_2");
            other
        }],
        vec![{
            let mut s = completed(1, "n1", 1);
            s["sessionId"] = json!("ses_1");
            s
        }],
        vec![{
            let mut s = completed(1, "n1", 1);
            s["timestamp"] = json!("noon");
            s
        }],
    ] {
        assert_eq!(
            restore_costs(&events).unwrap_err().code(),
            "EVENT_LOG_CORRUPT",
            "{events:?}"
        );
    }
}

/// Shuffling the rows never changes the restore: every figure is a max or a sum.
#[test]
fn shuffled_rows_restore_the_same() {
    let mut everything = media_then_attempts();
    everything.extend(fan_out().into_iter().map(|mut e| {
        let seq = e["sequenceNumber"].as_u64().unwrap();
        e["sequenceNumber"] = json!(seq + 100);
        e
    }));
    everything.push(release(200, "m", 2_500, 4_500));
    everything.push(ev(201, "iteration:started", json!({})));
    let mut unpriced = settled(202, "n2", 0, 57_500);
    unpriced["priced"] = json!(false);
    everything.push(unpriced);
    let want = restore_costs(&everything).unwrap();
    assert_eq!(want.realized_microcents, 57_500);
    assert_eq!(want.conservative_microcents, 4_500);
    assert_eq!(want.unpriced_attempts, 1);
    for seed in 0..300 {
        let rows = shuffled(&everything, seed);
        assert_eq!(restore_costs(&rows).unwrap(), want, "seed {seed}");
    }
}

/// A total written as `61000.0` is the safe integer 61,000 (JSON does not distinguish them).
#[test]
fn integers_written_with_a_zero_fraction() {
    let mut snapshot = completed(1, "n1", 0);
    snapshot["cumulativeCostMicrocents"] = json!(61_000.0);
    let mut estimate = commit(2, "m", 1, 1);
    estimate["estimateMicrocents"] = json!(2_500.0);
    estimate["cumulativeConservativeMicrocents"] = json!(2_500.0);
    let r = restore_costs(&[snapshot, estimate]).unwrap();
    assert_eq!((r.realized_microcents, r.conservative_microcents), (61_000, 2_500));
}
