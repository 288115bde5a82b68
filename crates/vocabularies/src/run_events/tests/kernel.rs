//! What the run events tell the kernel: which stored rows end a stream or a node, what the runs
//! catalog shows, and which appends are screened.

use crate::run_events::RunEvents;
use little_world_kernel::catalog::StatusChange;
use little_world_kernel::vocabulary::Vocabulary;
use serde_json::{json, Map, Value};

fn fields(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn stored_end(stream: &str, t: &str, body: Value) -> Option<String> {
    RunEvents.stored_effects(stream, t, &fields(body)).terminal
}

/// A row an earlier version stored as a plain fact that the reads refuse ends nothing; one the
/// reads take for an end ends its stream, though an append now refuses it.
#[test]
fn stored_rows_end_what_the_reads_see_them_end() {
    let done = |node: Value| json!({"durationMs": 5, "nodeId": node, "tokensUsed": {"input": 1, "output": 1}});
    let completed =
        json!({"durationMs": 1, "totalCostMicrocents": 0, "totalTokensUsed": {"input": 1, "output": 1}, "outputs": {}});
    let deep = (0..999).fold(json!([]), |inner, _| json!([inner]));
    let mut deep_done = done(json!("n1"));
    deep_done["output"] = deep;
    assert_eq!(stored_end("run_a", "node:completed", deep_done), Some("n1".into()));
    // Misfiled: a node end without a node, a node that is not a string, a session's end in a run,
    // a run's end without its fields.
    assert_eq!(stored_end("run_a", "node:completed", done(json!(""))), None);
    assert_eq!(stored_end("run_a", "node:failed", json!({"nodeId": 7})), None);
    assert_eq!(stored_end("run_a", "session:cancelled", json!({})), None);
    assert_eq!(
        stored_end("run_a", "run:completed", json!({"note": "a plain fact then"})),
        None
    );
    // Ends the reads take: a credential-like string, a field the envelope stamps.
    let mut secret = completed.clone();
    secret["outputs"] = json!({"log": format!("sk-ant-api03-{}", "A".repeat(90))});
    assert_eq!(stored_end("run_a", "run:completed", secret), Some(String::new()));
    let mut stamped = completed.clone();
    stamped["timestamp"] = json!("2026-01-01T00:00:00.000Z");
    assert_eq!(stored_end("run_a", "run:completed", stamped), Some(String::new()));
    assert_eq!(stored_end("run_a", "run:cancelled", json!({})), Some(String::new()));
    assert_eq!(stored_end("ses_s", "session:cancelled", json!({})), Some(String::new()));
    // A budget row's estimate is kept whatever else it holds.
    let e = RunEvents
        .stored_effects(
            "run_a",
            "budget:estimate_committed",
            &fields(json!({"estimateMicrocents": 500, "model": "m", "extra": [1]})),
        )
        .estimate
        .unwrap();
    assert_eq!((e.model.as_str(), e.amount, e.released), ("m", 500, false));
    assert!(RunEvents.effect_types().contains(&"budget:estimate_released"));
}

#[test]
fn a_session_is_open_until_cancelled_and_a_run_follows_its_events() {
    let none = Map::new();
    assert_eq!(RunEvents.initial_status("ses_s"), Some("open"));
    assert_eq!(RunEvents.initial_status("run_a"), None);
    assert_eq!(
        RunEvents.status_change("ses_s", "session:cancelled", &none),
        Some(StatusChange::Set("cancelled"))
    );
    assert_eq!(
        RunEvents.status_change("ses_s", "RunStarted", &none),
        Some(StatusChange::Keep)
    );
    assert_eq!(
        RunEvents.status_change("run_a", "run:completed", &none),
        Some(StatusChange::Set("completed"))
    );
    assert_eq!(
        RunEvents.status_change("run_a", "budget:paused", &none),
        Some(StatusChange::Set("paused"))
    );
    assert_eq!(
        RunEvents.status_change("run_a", "run:timeout", &none),
        Some(StatusChange::Keep)
    );
    assert_eq!(RunEvents.status_change("run_a", "RunStarted", &none), None);
    assert_eq!(RunEvents.status_change("run_a", "my:fact", &none), None);
}

#[test]
fn a_run_event_is_screened_and_held_to_its_draft_rules() {
    assert!(RunEvents.knows("node:started") && !RunEvents.knows("my:fact") && !RunEvents.knows("StepStarted"));
    assert!(RunEvents.screens_ids() && RunEvents.takes_drafts());
    assert_eq!(RunEvents.root(), "event");
}
