use super::*;
use serde_json::json;

fn fixture() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("__test__/fixtures/materialize-cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn envelopes(run_id: &str, events: &[Value]) -> Vec<String> {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut env = json!({
                "eventId": "evt_0000000000000000",
                "runId": run_id,
                "sequence": i + 1,
                "type": e["type"],
                "recordedAt": e["recordedAt"],
                "payload": e["payload"],
            });
            if let Some(k) = e.get("appendIdempotencyKey") {
                env["appendIdempotencyKey"] = k.clone();
            }
            canonical::to_string(&env)
        })
        .collect()
}

#[test]
fn hand_computed_cases() {
    let fx = fixture();
    let pricing = Pricing::with_override(Some(&fx["pricing"].to_string())).unwrap();
    for case in fx["cases"].as_array().unwrap() {
        let run_id = case["runId"].as_str().unwrap();
        let mut fold = Fold::new(run_id, &pricing);
        for env in envelopes(run_id, case["events"].as_array().unwrap()) {
            fold.push(&env).unwrap();
        }
        let got = fold.state_json();
        let want = canonical::to_string(&case["expected"]);
        assert_eq!(got, want, "case {}", case["name"]);
        // The array entry point gives the same bytes.
        let array = format!("[{}]", envelopes(run_id, case["events"].as_array().unwrap()).join(","));
        assert_eq!(
            fold_events_json(run_id, &array, &pricing).unwrap(),
            want,
            "case {}",
            case["name"]
        );
    }
}

#[test]
fn a_million_priced_calls_sum_exactly() {
    let pricing = Pricing::bundled();
    let mut fold = Fold::new("run_million", pricing);
    let rates = pricing.rates("openai", "gpt-5").unwrap();
    for i in 0..1_000_000u64 {
        let env = format!(
            r#"{{"eventId":"evt_0","payload":{{"callId":"c","model":{{"modelId":"gpt-5","provider":"openai"}},"response":{{"usage":{{"cachedInputTokens":10,"inputTokens":123,"outputTokens":45}}}},"turn":1}},"recordedAt":"2026-01-01T00:00:00.000Z","runId":"run_million","sequence":{},"type":"harness.model.responded"}}"#,
            i + 1
        );
        fold.push(&env).unwrap();
    }
    let one = rates.cost(123, 10, 45);
    assert_eq!(fold.usage.cost, one * 1_000_000);
    let state = fold.state();
    assert_eq!(
        state["usage"]["costUsd"].as_f64().unwrap(),
        femto_to_usd(one * 1_000_000)
    );
    assert_eq!(state["usage"]["pricedCalls"], 1_000_000);
}

#[test]
fn refuses_a_log_with_a_hole_or_another_run() {
    let pricing = Pricing::bundled();
    let ok = envelopes(
        "run_h",
        &[json!({"type": "RunStarted", "payload": {}, "recordedAt": "t"})],
    );
    let mut fold = Fold::new("run_h", pricing);
    fold.push(&ok[0]).unwrap();
    assert_eq!(fold.push(&ok[0]).unwrap_err().code(), "EVENT_LOG_CORRUPT");
    let mut fold = Fold::new("run_other", pricing);
    assert_eq!(fold.push(&ok[0]).unwrap_err().code(), "EVENT_LOG_CORRUPT");
}

#[test]
fn finds_references_only_where_strings_are_exactly_refs() {
    let mut fold = Fold::new("run_r", Pricing::bundled());
    fold.collect_artifacts(r#"{"a":"artifact://art_00000000000000aa","artifact://art_00000000000000bb":1,"c":"x \"artifact://art_00000000000000cc\"","d":["artifact://art_00000000000000dd"],"e":"artifact://art_00000000000000ee!"}"#);
    assert_eq!(
        fold.artifacts,
        vec!["artifact://art_00000000000000aa", "artifact://art_00000000000000dd"]
    );
}
