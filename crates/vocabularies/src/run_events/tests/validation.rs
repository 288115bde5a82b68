//! Every type of both unions: valid drafts and invalid ones (with the path the refusal names),
//! taken from the unions' definitions; the stream split; envelope fields; the stored read.

use super::support::{draft, map, path_of, with, without};
use crate::run_events::shapes::{Carried, SHAPES};
use crate::run_events::*;
use serde_json::{json, Value};

/// One type's examples: drafts that must validate, and (draft, path) pairs that must not.
struct Case {
    t: &'static str,
    valid: Vec<Value>,
    invalid: Vec<(Value, &'static str)>,
}

fn case(t: &'static str, base: Value, more: Vec<Value>, invalid: Vec<(Value, &'static str)>) -> Case {
    let mut valid = vec![draft(t, base)];
    valid.extend(more.into_iter().map(|v| draft(t, v)));
    let invalid = invalid.into_iter().map(|(v, p)| (draft(t, v), p)).collect();
    Case { t, valid, invalid }
}

const UUID: &str = "3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b";

#[rustfmt::skip]
fn run_cases() -> Vec<Case> {
    let started = json!({ "workflowId": UUID, "executionMode": "local",
        "inputs": { "topic": "cats", "apiKey": { "secret": true, "ref": "inputs.apiKey" } } });
    let cost = json!({ "nodeId": "n1", "model": "claude-haiku-4-5", "inputTokens": 120, "outputTokens": 30,
        "costMicrocents": 4500, "cumulativeCostMicrocents": 9000, "attemptNumber": 1, "priced": true });
    let completed = json!({ "nodeId": "n1", "output": { "text": "ok" }, "durationMs": 1200, "selected": ["b"],
        "tokensUsed": { "input": 10, "output": 5, "model": "m" }, "attemptNumber": 2, "cumulativeCostMicrocents": 9000 });
    let failed = json!({ "nodeId": "n1", "attemptNumber": 3, "cumulativeCostMicrocents": 100,
        "error": { "code": "provider_auth", "message": "key rejected", "retryable": false, "correlationId": "corr_1" } });
    let retrying = json!({ "nodeId": "n1", "attemptNumber": 1, "delayMs": 500,
        "error": { "code": "provider_rate_limit", "message": "429", "retryable": true } });
    let media = json!({ "nodeId": "m1", "jobId": "job_1", "provider": "gemini", "model": "veo-3", "modality": "video",
        "startedAt": "2026-05-21T10:00:00Z", "deadlineAt": "2026-05-21T10:30:00Z", "units": 8, "acceptedCostMicrocents": 0 });
    let gate = json!({ "nodeId": "g", "gateId": "g1", "gateType": "approval", "message": "Ship it?", "assignee": "ana",
        "timeoutMs": 60000, "timeoutAction": "reject", "expiresAt": "2026-05-21T11:00:00+02:00" });
    let settled = json!({ "nodeId": "n1", "model": "gpt-5", "attemptNumber": 1, "inputTokens": 50, "outputTokens": 9,
        "costMicrocents": 0, "cumulativeCostMicrocents": 100, "priced": false });
    let approval = json!({ "nodeId": "n1", "toolId": "write_file", "action": "fs_write", "preview": { "path": "src/a.ts" } });
    let committed = json!({ "nodeId": "n1", "attemptNumber": 1, "model": "m", "estimateMicrocents": 5000,
        "cumulativeConservativeMicrocents": 5000 });
    vec![
        case("run:started", started.clone(), vec![], vec![
            (with(&started, "workflowId", json!("wf-research")), "event.workflowId"),
            (with(&started, "executionMode", json!("hybrid")), "event.executionMode"),
            (without(&started, "inputs"), "event.inputs"),
            (with(&started, "inputs.apiKey", json!({ "secret": true, "ref": "env.KEY" })), "event.inputs.apiKey"),
        ]),
        case("node:started", json!({ "nodeId": "n1", "nodeType": "agent", "attemptNumber": 2 }),
            vec![json!({ "nodeId": "n1", "nodeType": "condition" })], vec![
            (json!({ "nodeId": "n1", "nodeType": "agent", "attemptNumber": 0 }), "event.attemptNumber"),
            (json!({ "nodeId": "", "nodeType": "agent" }), "event.nodeId"),
            (json!({ "nodeId": "n1" }), "event.nodeType"),
        ]),
        case("agent:token", json!({ "nodeId": "n1", "token": "Hel", "model": "m" }),
            vec![json!({ "nodeId": "n1", "token": "", "model": "m" })], vec![
            (json!({ "nodeId": "n1", "token": 5, "model": "m" }), "event.token"),
            (json!({ "nodeId": "n1", "token": "x" }), "event.model"),
        ]),
        case("agent:reasoning", json!({ "nodeId": "n1", "text": "Let me think", "model": "m" }), vec![], vec![
            (json!({ "nodeId": "n1", "model": "m" }), "event.text"),
        ]),
        case("agent:tool_call",
            json!({ "nodeId": "n1", "model": "m", "toolId": "read_file", "toolInput": { "path": "a" }, "attemptNumber": 1 }),
            vec![json!({ "nodeId": "n1", "model": "m", "toolId": "now", "toolInput": null }),
                 json!({ "nodeId": "n1", "model": "m", "toolId": "now" })], vec![
            (json!({ "nodeId": "n1", "model": "m", "toolId": "", "toolInput": {} }), "event.toolId"),
            (json!({ "nodeId": "n1", "model": "m", "toolId": "t", "toolInput": {}, "attemptNumber": 1.5 }), "event.attemptNumber"),
            (json!({ "nodeId": "n1", "toolId": "t", "toolInput": {} }), "event.model"),
        ]),
        case("agent:tool_result", json!({ "nodeId": "n1", "toolId": "t", "success": true, "outputSummary": "12 lines" }),
            vec![], vec![
            (json!({ "nodeId": "n1", "toolId": "t", "success": "yes", "outputSummary": "" }), "event.success"),
            (json!({ "nodeId": "n1", "toolId": "t", "success": false }), "event.outputSummary"),
        ]),
        case("agent:approval_requested", approval.clone(), vec![
            json!({ "nodeId": "n1", "toolId": "notify", "action": "os", "preview": {} }),
            json!({ "nodeId": "n1", "toolId": "web_search", "action": "egress", "preview": {} }),
            json!({ "nodeId": "n1", "toolId": "run", "action": "process", "preview": { "command": "[redacted]" }, "attemptNumber": 2 }),
        ], vec![
            (with(&approval, "action", json!("network")), "event.action"),
            (with(&approval, "action", json!("egress")), "event.preview.path"),
            (without(&approval, "preview"), "event.preview"),
            (with(&approval, "preview.path", json!("")), "event.preview.path"),
        ]),
        case("agent:file_patch_proposed",
            json!({ "nodeId": "n1", "patches": [{ "uri": "file:///a.ts", "unifiedDiff": "@@ -1 +1 @@\n-a\n+b\n" }] }),
            vec![], vec![
            (json!({ "nodeId": "n1", "patches": [] }), "event.patches"),
            (json!({ "nodeId": "n1", "patches": [{ "unifiedDiff": "" }] }), "event.patches[0].uri"),
            (json!({ "nodeId": "n1" }), "event.patches"),
        ]),
        case("cost:updated", cost.clone(), vec![without(&without(&cost, "priced"), "attemptNumber")], vec![
            (with(&cost, "inputTokens", json!(-1)), "event.inputTokens"),
            (with(&cost, "costMicrocents", json!(1.5)), "event.costMicrocents"),
            (with(&cost, "cumulativeCostMicrocents", json!(9_007_199_254_740_992u64)), "event.cumulativeCostMicrocents"),
            (with(&cost, "priced", json!(false)), "event.costMicrocents"),
            (with(&cost, "priced", json!("no")), "event.priced"),
        ]),
        case("node:completed", completed.clone(), vec![
            json!({ "nodeId": "c", "output": null, "durationMs": 0, "selected": [], "tokensUsed": { "input": 0, "output": 0 } }),
            // `output: undefined` is an absent key once serialized.
            without(&completed, "output"),
        ], vec![
            (without(&completed, "tokensUsed.input"), "event.tokensUsed.input"),
            (without(&completed, "durationMs"), "event.durationMs"),
            (with(&completed, "selected", json!([""])), "event.selected[0]"),
            (with(&completed, "cumulativeCostMicrocents", json!(-5)), "event.cumulativeCostMicrocents"),
        ]),
        case("node:failed", failed.clone(), vec![without(&failed, "error.correlationId")], vec![
            (with(&failed, "error.code", json!("oops")), "event.error.code"),
            (without(&failed, "error.retryable"), "event.error.retryable"),
            (without(&failed, "error"), "event.error"),
        ]),
        case("node:skipped", json!({ "nodeId": "n1", "reason": "branch_not_taken" }),
            vec![json!({ "nodeId": "n1", "reason": "upstream_unreachable" })], vec![
            (json!({ "nodeId": "n1", "reason": "skipped" }), "event.reason"),
        ]),
        case("node:retrying", retrying.clone(), vec![], vec![
            (without(&retrying, "attemptNumber"), "event.attemptNumber"),
            (with(&retrying, "error.correlationId", json!("c1")), "event.error.correlationId"),
            (with(&retrying, "delayMs", json!(-1)), "event.delayMs"),
        ]),
        case("media_job:submitted", media.clone(), vec![
            without(&without(&media, "units"), "acceptedCostMicrocents"),
            without(&media, "acceptedCostMicrocents"),
        ], vec![
            (with(&media, "provider", json!("mistral")), "event.provider"),
            (with(&media, "modality", json!("text")), "event.modality"),
            (with(&media, "startedAt", json!("yesterday")), "event.startedAt"),
            (without(&media, "units"), "event.units"),
            (with(&media, "deadlineAt", json!("2026-05-21T11:59:00+02:00")), "event.deadlineAt"),
        ]),
        case("human_gate:paused", gate.clone(), vec![
            json!({ "nodeId": "g", "gateId": "g1", "gateType": "input", "message": "" }),
        ], vec![
            (with(&gate, "gateType", json!("budget")), "event.gateType"),
            (without(&gate, "timeoutMs"), "event.timeoutAction"),
            (with(&gate, "timeoutAction", json!("escalate")), "event.timeoutAction"),
            (without(&gate, "gateId"), "event.gateId"),
        ]),
        case("human_gate:resumed", json!({ "nodeId": "g", "decision": "approved", "decidedBy": "timeout", "payload": { "x": 1 } }),
            vec![json!({ "nodeId": "g", "decision": "input_provided", "decidedBy": "u1" })], vec![
            (json!({ "nodeId": "g", "decision": "approve", "decidedBy": "u1" }), "event.decision"),
            (json!({ "nodeId": "g", "decision": "rejected", "decidedBy": "" }), "event.decidedBy"),
        ]),
        case("run:completed",
            json!({ "outputs": { "out": "done" }, "totalTokensUsed": { "input": 100, "output": 50 }, "totalCostMicrocents": 12000, "durationMs": 5000 }),
            vec![], vec![
            (json!({ "outputs": {}, "totalTokensUsed": { "input": 1, "output": 1 }, "totalCostMicrocents": 12.5, "durationMs": 5 }), "event.totalCostMicrocents"),
            (json!({ "totalTokensUsed": { "input": 1, "output": 1 }, "totalCostMicrocents": 1, "durationMs": 5 }), "event.outputs"),
            (json!({ "outputs": {}, "totalTokensUsed": { "input": 1 }, "totalCostMicrocents": 1, "durationMs": 5 }), "event.totalTokensUsed.output"),
        ]),
        case("run:failed",
            json!({ "error": { "code": "budget_exceeded", "message": "cap", "retryable": false, "nodeId": "n1" }, "partialOutputs": {}, "cumulativeCostMicrocents": 500 }),
            vec![json!({ "error": { "code": "effect_needs_attention", "message": "?", "retryable": false }, "partialOutputs": { "a": 1 } })], vec![
            (json!({ "error": { "code": "timeout", "message": "", "retryable": false }, "partialOutputs": {} }), "event.error.code"),
            (json!({ "error": { "code": "internal", "message": "", "retryable": false } }), "event.partialOutputs"),
            (json!({ "error": { "code": "internal", "message": "", "retryable": false, "nodeId": "" }, "partialOutputs": {} }), "event.error.nodeId"),
        ]),
        case("run:cancelled", json!({ "cumulativeCostMicrocents": 700 }), vec![json!({})], vec![
            (json!({ "cumulativeCostMicrocents": "700" }), "event.cumulativeCostMicrocents"),
        ]),
        case("run:paused", json!({ "pendingGateCount": 2, "gateIds": ["g1", "g2"], "pendingMediaJobNodeIds": ["m1"] }),
            vec![json!({ "pendingGateCount": 0, "gateIds": [], "pendingMediaJobNodeIds": ["m1"] })], vec![
            (json!({ "pendingGateCount": 1, "gateIds": ["g1", "g2"] }), "event.pendingGateCount"),
            (json!({ "pendingGateCount": 0, "gateIds": [] }), "event.gateIds"),
            (json!({ "pendingGateCount": 0, "gateIds": [], "pendingMediaJobNodeIds": [] }), "event.gateIds"),
            (json!({ "pendingGateCount": 1 }), "event.gateIds"),
        ]),
        case("run:timeout", json!({ "elapsedMs": 60001, "timeoutMs": 60000 }), vec![], vec![
            (json!({ "elapsedMs": 60001 }), "event.timeoutMs"),
        ]),
        case("budget:warning", json!({ "spentMicrocents": 900, "limitMicrocents": 1000, "thresholdPct": 90 }),
            vec![
                json!({ "spentMicrocents": 0, "limitMicrocents": 0, "thresholdPct": 100 }),
                // An exact half: the producer's floating point may round either way.
                json!({ "spentMicrocents": 1, "limitMicrocents": 200, "thresholdPct": 0 }),
                json!({ "spentMicrocents": 1, "limitMicrocents": 200, "thresholdPct": 1 }),
                json!({ "spentMicrocents": 2, "limitMicrocents": 3, "thresholdPct": 67 }),
                json!({ "spentMicrocents": 2500, "limitMicrocents": 1000, "thresholdPct": 100 }),
                // 50.4999… exactly, but 51 as JavaScript computes it: what the producer sends.
                json!({ "spentMicrocents": 107_411_207_281_366_u64, "limitMicrocents": 212_695_459_963_101_u64, "thresholdPct": 51 }),
            ], vec![
            (json!({ "spentMicrocents": 1, "limitMicrocents": 1, "thresholdPct": 101 }), "event.thresholdPct"),
            (json!({ "spentMicrocents": 10, "limitMicrocents": 100, "thresholdPct": 90 }), "event.thresholdPct"),
            (json!({ "spentMicrocents": 2, "limitMicrocents": 3, "thresholdPct": 66 }), "event.thresholdPct"),
            (json!({ "spentMicrocents": 2500, "limitMicrocents": 1000, "thresholdPct": 99 }), "event.thresholdPct"),
            (json!({ "spentMicrocents": 1, "limitMicrocents": 1, "thresholdPct": 90.5 }), "event.thresholdPct"),
            (json!({ "spentMicrocents": 1, "limitMicrocents": 1, "thresholdPct": -1 }), "event.thresholdPct"),
        ]),
        case("budget:paused", json!({ "nodeId": "n1", "spentMicrocents": 900, "limitMicrocents": 1000, "gateId": "bg1" }),
            vec![], vec![
            (json!({ "nodeId": "n1", "spentMicrocents": 900, "limitMicrocents": 1000 }), "event.gateId"),
        ]),
        case("budget:estimate_committed", committed.clone(), vec![without(&committed, "nodeId")], vec![
            (with(&committed, "estimateMicrocents", json!(0)), "event.estimateMicrocents"),
            (with(&committed, "cumulativeConservativeMicrocents", json!(4999)), "event.cumulativeConservativeMicrocents"),
            (without(&committed, "model"), "event.model"),
        ]),
        case("cost:attempt_settled", settled.clone(), vec![with(&with(&settled, "priced", json!(true)), "costMicrocents", json!(70))], vec![
            (without(&settled, "attemptNumber"), "event.attemptNumber"),
            (without(&settled, "priced"), "event.priced"),
            (with(&settled, "costMicrocents", json!(5)), "event.costMicrocents"),
            (with(&with(&settled, "priced", json!(true)), "costMicrocents", json!(101)), "event.cumulativeCostMicrocents"),
            (without(&settled, "nodeId"), "event.nodeId"),
        ]),
        case("budget:estimate_released", json!({ "model": "m", "releasedMicrocents": 5000, "cumulativeConservativeMicrocents": 0 }),
            vec![], vec![
            (json!({ "model": "m", "releasedMicrocents": 0, "cumulativeConservativeMicrocents": 0 }), "event.releasedMicrocents"),
        ]),
    ]
}

#[rustfmt::skip]
fn session_cases() -> Vec<Case> {
    let compacted = json!({ "reason": "auto-threshold", "summary": "We fixed the parser.", "keptMessageCount": 4,
        "tokensBefore": 9000, "tokensAfter": 1200, "tokensUsed": { "input": 9000, "output": 300, "model": "m" } });
    let error = json!({ "code": "provider_rate_limit", "message": "429", "retryable": true });
    vec![
        case("session:started", json!({ "agentRef": "coder", "model": "m", "context": { "workingDir": "/w" } }), vec![], vec![
            (json!({ "agentRef": "coder", "model": "m", "context": "x" }), "event.context"),
        ]),
        case("session:turn_started", json!({}), vec![], vec![(json!({ "sessionId": "ses_1" }), "event.sessionId")]),
        case("session:turn_completed", json!({ "stopReason": "stop", "tokensUsed": { "input": 1, "output": 2 } }), vec![
            json!({ "stopReason": "error", "tokensUsed": { "input": 0, "output": 0 }, "error": error }),
            json!({ "stopReason": "aborted", "tokensUsed": { "input": 5, "output": 0 } }),
        ], vec![
            (json!({ "stopReason": "end_turn", "tokensUsed": { "input": 1, "output": 2 } }), "event.stopReason"),
            (json!({ "stopReason": "aborted", "tokensUsed": { "input": 1, "output": 2 }, "error": error }), "event.error"),
            (json!({ "stopReason": "error", "tokensUsed": { "input": 1, "output": 2 }, "error": { "code": "x", "message": "", "retryable": true } }), "event.error.code"),
        ]),
        case("session:cancelled", json!({}), vec![], vec![(json!({ "timestamp": "2026-05-21T10:00:00Z" }), "event.timestamp")]),
        case("session:exported", json!({ "workflowPath": "flows/x.yaml" }), vec![], vec![(json!({}), "event.workflowPath")]),
        case("session:compacting", json!({ "reason": "manual" }), vec![json!({ "reason": "auto-threshold" })], vec![
            (json!({ "reason": "auto-fallback" }), "event.reason"),
        ]),
        case("session:compacted", compacted.clone(), vec![], vec![
            (without(&compacted, "tokensUsed"), "event.tokensUsed"),
            (with(&compacted, "reason", json!("auto-fallback")), "event.reason"),
        ]),
        case("session:trimmed", json!({ "reason": "auto-fallback", "keptMessageCount": 10, "droppedMessageCount": 30 }), vec![], vec![
            (json!({ "reason": "auto-threshold", "keptMessageCount": 10, "droppedMessageCount": 30 }), "event.reason"),
        ]),
    ]
}

fn stream_for(t: &str) -> Stream {
    if t.starts_with("session:") {
        Stream::Session
    } else {
        Stream::Run
    }
}

#[test]
fn every_type_of_both_unions_has_valid_and_invalid_examples() {
    let cases: Vec<Case> = run_cases().into_iter().chain(session_cases()).collect();
    for (t, _) in SHAPES {
        assert!(cases.iter().any(|c| c.t == *t), "no examples for {t}");
    }
    assert_eq!(cases.len(), SHAPES.len());
    for c in &cases {
        assert!(!c.invalid.is_empty(), "no invalid example for {}", c.t);
        for v in &c.valid {
            let r = validate_draft(stream_for(c.t), map(v));
            assert!(r.is_ok(), "{}: {v} should validate: {r:?}", c.t);
        }
        for (v, want) in &c.invalid {
            let err = validate_draft(stream_for(c.t), map(v)).expect_err(&format!("{}: {v} should be refused", c.t));
            assert_eq!(err.code(), "EVENT_VALIDATION");
            assert_eq!(path_of(err), *want, "{}: {v}", c.t);
        }
    }
}

#[test]
fn streams_are_separate() {
    let cases: Vec<Case> = run_cases().into_iter().chain(session_cases()).collect();
    for c in &cases {
        let v = map(&c.valid[0]);
        let carried = SHAPES.iter().find(|(t, _)| *t == c.t).unwrap().1.carried;
        let (run, session) = (validate_draft(Stream::Run, v), validate_draft(Stream::Session, v));
        match carried {
            Carried::Both => assert!(run.is_ok() && session.is_ok(), "{} is dual-envelope", c.t),
            Carried::Run => assert_eq!(path_of(session.unwrap_err()), "event.type", "{} is run-only", c.t),
            Carried::Session => assert_eq!(path_of(run.unwrap_err()), "event.type", "{} is session-only", c.t),
        }
        assert_eq!(is_run_type(c.t), carried != Carried::Session, "{}", c.t);
        assert_eq!(is_session_type(c.t), carried != Carried::Run, "{}", c.t);
        assert!(is_known_type(c.t));
    }
    for run_only in [
        "cost:attempt_settled",
        "agent:file_patch_proposed",
        "node:completed",
        "run:paused",
    ] {
        assert!(is_run_type(run_only) && !is_session_type(run_only), "{run_only}");
    }
    for dual in [
        "agent:token",
        "agent:reasoning",
        "agent:tool_call",
        "agent:tool_result",
        "agent:approval_requested",
    ] {
        assert!(is_run_type(dual) && is_session_type(dual), "{dual}");
    }
    for dual in ["cost:updated", "budget:estimate_committed", "budget:estimate_released"] {
        assert!(is_run_type(dual) && is_session_type(dual), "{dual}");
    }
    for unknown in [
        "node:exploded",
        "iteration:started",
        "agent:directive_injected",
        "StepStarted",
        "node.started",
    ] {
        assert!(!is_known_type(unknown), "{unknown}");
        for stream in [Stream::Run, Stream::Session] {
            let err = validate_draft(stream, map(&draft(unknown, json!({ "nodeId": "n1" })))).unwrap_err();
            assert_eq!(path_of(err), "event.type");
        }
    }
}

#[test]
fn drafts_carry_no_envelope_and_may_carry_extra_fields() {
    let base = draft("agent:token", json!({ "nodeId": "n1", "token": "a", "model": "m" }));
    for field in ENVELOPE_FIELDS {
        let err = validate_draft(Stream::Run, map(&with(&base, field, json!("x")))).unwrap_err();
        assert_eq!(path_of(err), format!("event.{field}"));
    }
    let extra = with(&base, "iterationIndex", json!(3));
    assert!(validate_draft(Stream::Session, map(&extra)).is_ok());
    assert_eq!(
        path_of(validate_draft(Stream::Run, map(&without(&base, "type"))).unwrap_err()),
        "event.type"
    );
    assert_eq!(
        path_of(validate_draft(Stream::Run, map(&with(&base, "type", json!(7)))).unwrap_err()),
        "event.type"
    );
}

#[test]
fn events_with_the_type_apart() {
    let payload = json!({ "nodeId": "n1", "reason": "upstream_unreachable" });
    assert!(validate_event(Stream::Run, "node:skipped", map(&payload)).is_ok());
    let err = validate_event(Stream::Run, "node:failed", map(&payload)).unwrap_err();
    assert_eq!(path_of(err), "event.error");
    let named = with(&payload, "type", json!("node:failed"));
    assert_eq!(
        path_of(validate_event(Stream::Run, "node:skipped", map(&named)).unwrap_err()),
        "event.type"
    );
    let key = "AKIAIOSFODNN7EXAMPLE";
    let err = validate_event(Stream::Run, key, map(&payload)).unwrap_err();
    assert_eq!(path_of(err.clone()), "event.type");
    assert!(!err.to_string().contains("AKIAIO"), "{err}");
}

#[test]
fn drafts_are_screened_for_credentials_before_anything_echoes() {
    let key = "sk-proj-Q3vN8wLz2pKx7RtY5mBc9HdF1aJgE4sU6oWi0XnV";
    let call = draft(
        "agent:tool_call",
        json!({ "nodeId": "n1", "model": "m", "toolId": "http", "toolInput": { "headers": { "x-api-key": key } } }),
    );
    let err = validate_draft(Stream::Session, map(&call)).unwrap_err();
    assert_eq!(err.details()["path"], "event.toolInput.headers[\"x-api-key\"]");
    // An unknown type that is itself a credential is refused by the screen, which never echoes it.
    let err = validate_draft(Stream::Run, map(&draft(key, json!({})))).unwrap_err();
    assert_eq!(path_of(err.clone()), "event.type");
    assert!(!err.to_string().contains(&key[..12]), "{err}");
}

#[test]
fn stored_bodies_parse_tolerantly() {
    let body = json!({ "nodeId": "n1", "reason": "branch_not_taken" });
    assert_eq!(parse_stored(Stream::Run, "node:skipped", map(&body)).unwrap(), Some(()));
    assert_eq!(parse_stored(Stream::Run, "node:exploded", map(&body)).unwrap(), None);
    assert_eq!(
        parse_stored(Stream::Session, "iteration:started", map(&json!({}))).unwrap(),
        None
    );
    let bad = json!({ "nodeId": "n1", "reason": "tired" });
    let err = parse_stored(Stream::Run, "node:skipped", map(&bad)).unwrap_err();
    assert_eq!(err.code(), "EVENT_LOG_CORRUPT");
    assert!(err.to_string().contains("event.reason"), "{err}");
    // A known type on the wrong stream, or a body naming another type, is corruption too.
    assert_eq!(
        parse_stored(Stream::Session, "node:skipped", map(&body))
            .unwrap_err()
            .code(),
        "EVENT_LOG_CORRUPT"
    );
    let named = with(&body, "type", json!("node:failed"));
    assert_eq!(
        parse_stored(Stream::Run, "node:skipped", map(&named))
            .unwrap_err()
            .code(),
        "EVENT_LOG_CORRUPT"
    );
    assert_eq!(
        parse_stored(
            Stream::Run,
            "node:skipped",
            map(&with(&body, "type", json!("node:skipped")))
        )
        .unwrap(),
        Some(())
    );
}

#[test]
fn terminals() {
    for t in ["run:completed", "run:failed", "run:cancelled"] {
        assert!(is_run_terminal(t));
    }
    for t in ["run:paused", "run:timeout", "node:completed", "session:cancelled"] {
        assert!(!is_run_terminal(t));
    }
    let d = json!({ "nodeId": "n7" });
    for t in ["node:completed", "node:failed", "node:skipped"] {
        assert_eq!(node_terminal(t, map(&d)).as_deref(), Some("n7"));
    }
    for t in ["node:started", "node:retrying", "media_job:submitted", "run:completed"] {
        assert_eq!(node_terminal(t, map(&d)), None);
    }
}

#[test]
fn the_shared_examples_fixture_covers_every_type_and_agrees() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../__test__/fixtures/run-event-examples.json");
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let types = fx["types"].as_object().unwrap();
    for (t, _) in SHAPES.iter() {
        let ex = &types[*t];
        let stream = if ex["stream"] == "session" {
            Stream::Session
        } else {
            Stream::Run
        };
        assert!(validate_draft(stream, map(&ex["valid"])).is_ok(), "{t} valid example");
        let err = validate_draft(stream, map(&ex["invalid"]["draft"])).unwrap_err();
        assert_eq!(
            path_of(err),
            ex["invalid"]["path"].as_str().unwrap(),
            "{t} invalid example"
        );
    }
}
