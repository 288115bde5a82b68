//! The run fold: run and node status, attempts, branches, gates, media jobs, budget, timeout and
//! the run:paused aggregate check.

use super::support::ev;
use crate::run_events::{fold, restore_costs};
use serde_json::{json, Value};

fn started() -> Value {
    ev(
        1,
        "run:started",
        json!({ "workflowId": "3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b", "inputs": {}, "executionMode": "local" }),
    )
}

fn node_started(seq: u64, node: &str, attempt: Option<u64>) -> Value {
    let mut v = ev(seq, "node:started", json!({ "nodeId": node, "nodeType": "agent" }));
    if let Some(a) = attempt {
        v["attemptNumber"] = json!(a);
    }
    v
}

fn completed(seq: u64, node: &str, extra: Value) -> Value {
    let mut v = ev(
        seq,
        "node:completed",
        json!({ "nodeId": node, "output": "ok", "tokensUsed": { "input": 1, "output": 1 }, "durationMs": 5 }),
    );
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn gate(seq: u64, node: &str, gate_id: &str) -> Value {
    ev(
        seq,
        "human_gate:paused",
        json!({ "nodeId": node, "gateId": gate_id, "gateType": "approval", "message": "ok?" }),
    )
}

fn resumed(seq: u64, node: &str) -> Value {
    ev(
        seq,
        "human_gate:resumed",
        json!({ "nodeId": node, "decision": "approved", "decidedBy": "u1" }),
    )
}

fn paused(seq: u64, gates: &[&str], media: &[&str]) -> Value {
    let mut v = ev(
        seq,
        "run:paused",
        json!({ "pendingGateCount": gates.len(), "gateIds": gates }),
    );
    if !media.is_empty() {
        v["pendingMediaJobNodeIds"] = json!(media);
    }
    v
}

fn media(seq: u64, node: &str, job: &str) -> Value {
    ev(
        seq,
        "media_job:submitted",
        json!({ "nodeId": node, "jobId": job, "provider": "gemini", "model": "veo-3",
        "modality": "video", "startedAt": "2026-05-21T10:00:00Z", "deadlineAt": "2026-05-21T10:30:00Z" }),
    )
}

fn error(code: &str) -> Value {
    json!({ "code": code, "message": "m", "retryable": code == "provider_rate_limit" })
}

#[test]
fn empty_and_started() {
    let s = fold(&[]).unwrap();
    assert_eq!(s["status"], "pending");
    assert_eq!(s["nodes"], json!({}));
    assert_eq!(s["pendingGates"], json!([]));
    assert_eq!(s["costs"]["realizedCostMicrocents"], 0);
    assert_eq!(fold(&[started()]).unwrap()["status"], "running");
}

#[test]
fn nodes_status_attempts_and_branches() {
    let events = vec![
        started(),
        node_started(2, "a", None),
        ev(
            3,
            "node:retrying",
            json!({ "nodeId": "a", "attemptNumber": 1, "error": error("provider_rate_limit"), "delayMs": 100 }),
        ),
        node_started(4, "a", Some(2)),
        // A within-chain attemptNumber (3) on a cost row is another counter family: no effect on attempts.
        ev(
            5,
            "cost:attempt_settled",
            json!({ "nodeId": "a", "model": "m", "attemptNumber": 3, "inputTokens": 1,
            "outputTokens": 1, "costMicrocents": 7, "cumulativeCostMicrocents": 7, "priced": true }),
        ),
        completed(6, "a", json!({ "attemptNumber": 2, "cumulativeCostMicrocents": 7 })),
        node_started(7, "cond", None),
        completed(8, "cond", json!({ "selected": ["b"] })),
        ev(
            9,
            "node:skipped",
            json!({ "nodeId": "c", "reason": "branch_not_taken" }),
        ),
        node_started(10, "b", None),
        ev(
            11,
            "node:failed",
            json!({ "nodeId": "b", "error": error("tool_failed"), "cumulativeCostMicrocents": 7 }),
        ),
        node_started(12, "d", None),
        ev(
            13,
            "node:retrying",
            json!({ "nodeId": "d", "attemptNumber": 1, "error": error("provider_rate_limit"), "delayMs": 100 }),
        ),
    ];
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "running");
    assert_eq!(
        s["nodes"]["a"],
        json!({ "status": "completed", "attempts": 2, "cumulativeCostMicrocents": 7 })
    );
    assert_eq!(
        s["nodes"]["cond"],
        json!({ "status": "completed", "attempts": 1, "selected": ["b"] })
    );
    assert_eq!(
        s["nodes"]["c"],
        json!({ "status": "skipped", "attempts": 0, "skipReason": "branch_not_taken" })
    );
    assert_eq!(s["nodes"]["b"]["status"], "failed");
    assert_eq!(s["nodes"]["b"]["error"]["code"], "tool_failed");
    assert_eq!(s["nodes"]["d"]["status"], "retrying");
    assert_eq!(s["nodes"]["d"]["attempts"], 1);
    assert_eq!(s["nodes"]["d"]["error"]["code"], "provider_rate_limit");
    assert_eq!(s["costs"], restore_costs(&events).unwrap().to_json());
    // The same events give the same bytes.
    assert_eq!(fold(&events).unwrap().to_string(), s.to_string());
}

#[test]
fn gates_pause_and_resume() {
    let mut events = vec![
        started(),
        node_started(2, "ga", None),
        node_started(3, "gb", None),
        gate(4, "ga", "g1"),
        gate(5, "gb", "g2"),
        paused(6, &["g2", "g1"], &[]),
    ];
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "paused");
    assert_eq!(s["nodes"]["ga"]["status"], "waiting");
    assert_eq!(
        s["pendingGates"],
        json!([{ "gateId": "g1", "nodeId": "ga", "gateType": "approval" }, { "gateId": "g2", "nodeId": "gb", "gateType": "approval" }])
    );
    assert!(s.get("pausedAggregateMismatch").is_none(), "{s}");
    events.push(resumed(7, "ga"));
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "running");
    assert_eq!(s["nodes"]["ga"]["status"], "running");
    assert_eq!(
        s["pendingGates"],
        json!([{ "gateId": "g2", "nodeId": "gb", "gateType": "approval" }])
    );
    events.push(completed(8, "ga", json!({})));
    events.push(paused(9, &["g2"], &[]));
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "paused");
    assert!(s.get("pausedAggregateMismatch").is_none(), "{s}");
    // A resume that names its gate closes that one.
    let mut by_id = resumed(10, "gb");
    by_id["gateId"] = json!("g2");
    events.push(by_id);
    assert_eq!(fold(&events).unwrap()["pendingGates"], json!([]));
}

#[test]
fn paused_aggregate_mismatch_is_reported_not_thrown() {
    // g1 is open, but the aggregate names g9 (count agrees with its own list, so it validates).
    let events = vec![started(), gate(2, "ga", "g1"), paused(3, &["g9"], &[])];
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "paused");
    let m = &s["pausedAggregateMismatch"][0];
    assert_eq!(m["sequenceNumber"], 3);
    assert_eq!(m["missingGateIds"], json!(["g1"]));
    assert_eq!(m["unexpectedGateIds"], json!(["g9"]));
    assert_eq!(m["openGateIds"], json!(["g1"]));
    // A gate already resumed is not open any more: naming it is a mismatch too.
    let stale = vec![
        started(),
        gate(2, "ga", "g1"),
        resumed(3, "ga"),
        gate(4, "gb", "g2"),
        paused(5, &["g1", "g2"], &[]),
    ];
    let s = fold(&stale).unwrap();
    assert_eq!(s["pausedAggregateMismatch"][0]["unexpectedGateIds"], json!(["g1"]));
    assert_eq!(s["pausedAggregateMismatch"][0]["missingGateIds"], json!([]));
    // A media job the aggregate forgets.
    let s = fold(&[
        started(),
        media(2, "m1", "j1"),
        gate(3, "ga", "g1"),
        paused(4, &["g1"], &[]),
    ])
    .unwrap();
    assert_eq!(s["pausedAggregateMismatch"][0]["missingMediaJobNodeIds"], json!(["m1"]));
}

#[test]
fn media_jobs_pending_until_the_node_ends() {
    let mut events = vec![
        started(),
        node_started(2, "m1", None),
        media(3, "m1", "j1"),
        paused(4, &[], &["m1"]),
    ];
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "paused");
    assert_eq!(s["nodes"]["m1"]["status"], "waiting");
    assert_eq!(s["pendingMediaJobs"][0]["jobId"], "j1");
    assert_eq!(s["pendingMediaJobs"][0]["deadlineAt"], "2026-05-21T10:30:00Z");
    assert!(s["pendingMediaJobs"][0].get("runId").is_none());
    assert!(s.get("pausedAggregateMismatch").is_none(), "{s}");
    events.push(completed(5, "m1", json!({ "cumulativeCostMicrocents": 50_000 })));
    let s = fold(&events).unwrap();
    assert_eq!(s["pendingMediaJobs"], json!([]));
    assert_eq!(s["nodes"]["m1"]["status"], "completed");
    assert_eq!(s["costs"]["realizedCostMicrocents"], 50_000);
}

#[test]
fn budget_and_timeout() {
    let mut events = vec![
        started(),
        ev(
            2,
            "budget:warning",
            json!({ "spentMicrocents": 900, "limitMicrocents": 1000, "thresholdPct": 90 }),
        ),
        node_started(3, "n1", None),
        ev(
            4,
            "budget:paused",
            json!({ "nodeId": "n1", "spentMicrocents": 950, "limitMicrocents": 1000, "gateId": "bg1" }),
        ),
    ];
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "paused");
    assert_eq!(
        s["pendingGates"],
        json!([{ "gateId": "bg1", "nodeId": "n1", "gateType": "budget" }])
    );
    assert_eq!(
        s["budget"],
        json!({ "warning": { "spentMicrocents": 900, "limitMicrocents": 1000, "thresholdPct": 90 },
                "paused": { "nodeId": "n1", "gateId": "bg1", "spentMicrocents": 950, "limitMicrocents": 1000 },
                "limitMicrocents": 1000, "spentMicrocents": 950 })
    );
    assert_eq!(s["nodes"]["n1"]["status"], "waiting");
    events.push(resumed(5, "n1"));
    events.push(ev(
        6,
        "run:timeout",
        json!({ "elapsedMs": 60_001, "timeoutMs": 60_000 }),
    ));
    let s = fold(&events).unwrap();
    assert!(s["budget"].get("paused").is_none());
    assert_eq!(s["pendingGates"], json!([]));
    assert_eq!(s["timeout"], json!({ "elapsedMs": 60_001, "timeoutMs": 60_000 }));
    assert_eq!(s["status"], "running");
    events.push(ev(
        7,
        "run:failed",
        json!({ "error": { "code": "run_timeout", "message": "t", "retryable": false }, "partialOutputs": {} }),
    ));
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "failed");
    assert_eq!(s["error"]["code"], "run_timeout");
}

#[test]
fn run_end_clears_what_was_pending() {
    let events = vec![
        started(),
        gate(2, "ga", "g1"),
        media(3, "m1", "j1"),
        ev(4, "run:cancelled", json!({ "cumulativeCostMicrocents": 3 })),
    ];
    let s = fold(&events).unwrap();
    assert_eq!(s["status"], "cancelled");
    assert_eq!(s["pendingGates"], json!([]));
    assert_eq!(s["pendingMediaJobs"], json!([]));
    assert!(s.get("error").is_none());
    let done = ev(
        2,
        "run:completed",
        json!({ "outputs": {}, "totalTokensUsed": { "input": 0, "output": 0 }, "totalCostMicrocents": 0, "durationMs": 1 }),
    );
    assert_eq!(fold(&[started(), done]).unwrap()["status"], "completed");
}

#[test]
fn broken_logs_are_corruption() {
    let done = ev(3, "run:cancelled", json!({}));
    for events in [
        // Anything after the run's terminal event.
        vec![started(), done.clone(), node_started(4, "n1", None)],
        // A second terminal for a node.
        vec![
            started(),
            completed(2, "n1", json!({})),
            ev(
                3,
                "node:skipped",
                json!({ "nodeId": "n1", "reason": "upstream_unreachable" }),
            ),
        ],
        // Out of sequenceNumber order.
        vec![started(), node_started(3, "a", None), node_started(2, "b", None)],
        vec![started(), node_started(1, "a", None)],
    ] {
        assert_eq!(fold(&events).unwrap_err().code(), "EVENT_LOG_CORRUPT", "{events:?}");
    }
}
