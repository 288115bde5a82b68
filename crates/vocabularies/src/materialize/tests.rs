//! The materializer: hand-computed cases, exact money, refused logs, and the two-thread fold.

use super::stored::{BATCH, PIPELINE_AT};
use super::*;
use serde_json::json;

fn fixture() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../__test__/fixtures/materialize-cases.json");
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

/// Rows for `events` of `run_id` as the writer stores them: the columns, and the canonical
/// envelope built from the same values.
fn stored_rows(run_id: &str, events: &[Value]) -> Vec<little_world_kernel::store::StoredEvent> {
    envelopes(run_id, events)
        .into_iter()
        .zip(events)
        .enumerate()
        .map(|(i, (envelope, e))| little_world_kernel::store::StoredEvent {
            run_id: run_id.into(),
            sequence: i as u64 + 1,
            event_id: "evt_0000000000000000".into(),
            event_type: e["type"].as_str().unwrap().into(),
            key: e.get("appendIdempotencyKey").and_then(Value::as_str).map(String::from),
            digest: None,
            recorded_at: e["recordedAt"].as_str().unwrap().into(),
            envelope,
        })
        .collect()
}

/// A store holding `rows`; its writer is kept with the directory, since a reader of a writable
/// store refuses to read once the writer's close has removed the WAL.
fn sqlite_with(
    rows: &[little_world_kernel::store::StoredEvent],
) -> (
    (tempfile::TempDir, little_world_kernel::store::sqlite::SqliteWriter),
    little_world_kernel::store::sqlite::SqliteReader,
) {
    use little_world_kernel::store::{LogWriter, Scope};
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, reader) =
        little_world_kernel::store::sqlite::open(dir.path(), little_world_kernel::store::sqlite::Durability::Normal)
            .unwrap();
    writer
        .transaction(&Scope::NONE, &mut |tx| {
            for r in rows {
                tx.insert(&r.as_ref())?;
            }
            Ok(())
        })
        .unwrap();
    ((dir, writer), reader)
}

#[test]
fn folding_stored_rows_gives_the_state_folding_their_envelopes_does() {
    let fx = fixture();
    let pricing = Pricing::with_override(Some(&fx["pricing"].to_string())).unwrap();
    for case in fx["cases"].as_array().unwrap() {
        let run_id = case["runId"].as_str().unwrap();
        let (_dir, reader) = sqlite_with(&stored_rows(run_id, case["events"].as_array().unwrap()));
        assert_eq!(
            fold_stored(&reader, run_id, &pricing).unwrap(),
            canonical::to_string(&case["expected"]),
            "case {}",
            case["name"]
        );
    }
}

#[test]
fn folding_stored_rows_parses_every_payload_and_reads_envelopes_in_any_json_form() {
    let pricing = Pricing::bundled();
    let events = [
        json!({"type": "RunStarted", "payload": {}, "recordedAt": "2026-01-01T00:00:00.000Z"}),
        // A type the fold does not read, and one with escapes in its type and key.
        json!({"type": "custom.note", "payload": {"n": [1, 2]}, "recordedAt": "2026-01-01T00:00:01.000Z"}),
        json!({"type": "custom \"quoted\" é", "appendIdempotencyKey": "k\u{1}\"", "payload": {"a": "artifact://art_0123456789abcdef"},
               "recordedAt": "2026-01-01T00:00:02.000Z"}),
        json!({"type": "RunCompleted", "payload": {"output": {"ok": true}}, "recordedAt": "2026-01-01T00:00:03.000Z"}),
    ];
    let rows = stored_rows("run_s", &events);
    let (_dir, reader) = sqlite_with(&rows);
    let mut fold = Fold::new("run_s", pricing);
    for r in &rows {
        fold.push(&r.envelope).unwrap();
    }
    let want = fold.state_json();
    assert!(want.contains("artifact://art_0123456789abcdef"), "{want}");
    assert_eq!(fold_stored(&reader, "run_s", pricing).unwrap(), want);

    // A stored envelope in another (still valid) form is parsed whole: same state.
    let mut spaced = rows.clone();
    spaced[1].envelope = spaced[1].envelope.replacen('{', "{ ", 1);
    let (_dir2, reader) = sqlite_with(&spaced);
    assert_eq!(fold_stored(&reader, "run_s", pricing).unwrap(), want);

    // A broken payload is corruption whether or not the fold reads that type.
    for (i, from, to) in [(1, "[1,2]", "[1,2"), (2, "\"a\":", "\"a\""), (3, "true}", "tru}")] {
        let mut broken = rows.clone();
        assert!(broken[i].envelope.contains(from), "{}", broken[i].envelope);
        broken[i].envelope = broken[i].envelope.replacen(from, to, 1);
        let (_dir3, reader) = sqlite_with(&broken);
        let err = fold_stored(&reader, "run_s", pricing).unwrap_err();
        assert_eq!(err.code(), "EVENT_LOG_CORRUPT", "row {i}: {err}");
        assert!(err.to_string().contains("does not parse"), "row {i}: {err}");
    }
}

/// `n` events of a run: starts, priced and unpriced model calls, outputs with artifact references.
fn long_run(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let at = format!("2026-01-01T00:{:02}:{:02}.{:03}Z", i / 60_000 % 60, i / 1000 % 60, i % 1000);
            let step = format!("step/{}", i % 37);
            match i % 5 {
                0 => json!({"type": "StepStarted", "payload": {"stepPath": step, "stepKind": "ai.generate"}, "recordedAt": at}),
                1 | 2 => json!({"type": "harness.model.responded", "recordedAt": at, "payload": {
                    "callId": format!("c{i}"), "stepPath": step,
                    "model": if i % 3 == 0 { json!({"provider": "openai", "modelId": "gpt-5"}) } else { json!({"provider": "nobody", "modelId": "unpriced"}) },
                    "response": {"text": "ok \"quoted\" é", "usage": {"inputTokens": 1000 + i % 97, "outputTokens": 200 + i % 13, "cachedInputTokens": 100}}}}),
                3 => json!({"type": "custom.note", "payload": {"n": i, "ref": format!("artifact://art_{:016x}", i % 50)}, "recordedAt": at}),
                _ => json!({"type": "StepCompleted", "payload": {"stepPath": step, "output": {"n": i}}, "recordedAt": at}),
            }
        })
        .collect()
}

#[test]
fn a_long_run_folds_on_two_threads_to_the_same_state() {
    let pricing = Pricing::bundled();
    let n = PIPELINE_AT as usize + 3 * BATCH + 17;
    let rows = stored_rows("run_long", &long_run(n));
    let mut fold = Fold::new("run_long", pricing);
    for r in &rows {
        fold.push(&r.envelope).unwrap();
    }
    let want = fold.state_json();
    assert!(
        want.contains("\"eventCount\":") && want.contains("art_0000000000000030"),
        "{want}"
    );
    let (_dir, reader) = sqlite_with(&rows);
    assert_eq!(fold_stored(&reader, "run_long", pricing).unwrap(), want);
    // At the process's thread limit, one thread folds it all, to the same state.
    little_world_kernel::runtime::fail_thread_starts(0, 1);
    assert_eq!(fold_stored(&reader, "run_long", pricing).unwrap(), want);
}

#[test]
fn a_long_run_reports_its_first_corrupt_event_in_sequence_order() {
    let pricing = Pricing::bundled();
    let n = PIPELINE_AT as usize + 2 * BATCH;
    let rows = stored_rows("run_bad", &long_run(n));
    let unparsable = |rows: &mut Vec<little_world_kernel::store::StoredEvent>, i: usize| {
        let e = &mut rows[i].envelope;
        e.truncate(e.len() - 1);
    };
    // A model call whose usage is not a number: the envelope parses, its payload's fields do not.
    let wrong_field = |rows: &mut Vec<little_world_kernel::store::StoredEvent>, i: usize| {
        assert_eq!(rows[i].event_type, "harness.model.responded");
        rows[i].envelope = rows[i]
            .envelope
            .replacen("\"inputTokens\":", "\"inputTokens\":\"x\",\"was\":", 1);
    };
    let expect = |rows: &[little_world_kernel::store::StoredEvent], sequence: u64, says: &str| {
        let (_dir, reader) = sqlite_with(rows);
        let err = fold_stored(&reader, "run_bad", pricing).unwrap_err();
        assert_eq!(err.code(), "EVENT_LOG_CORRUPT", "{err}");
        assert_eq!(err.details()["sequence"], json!(sequence), "{err}");
        assert!(err.to_string().contains(says), "{err}");
    };
    // Early (the reading thread must stop), mid-batch, and the very last event.
    for at in [3, PIPELINE_AT as usize + BATCH / 2, n - 1] {
        let mut bad = rows.clone();
        unparsable(&mut bad, at);
        expect(&bad, at as u64 + 1, "envelope does not parse");
    }
    // A field error a few events before an unparsable envelope in the same batch comes first.
    let mut both = rows.clone();
    wrong_field(&mut both, 2 * BATCH + 7);
    unparsable(&mut both, 2 * BATCH + 9);
    expect(
        &both,
        2 * BATCH as u64 + 8,
        "the harness.model.responded payload's response is not what a harness.model.responded carries there",
    );
    // And a later one does not hide an earlier unparsable envelope.
    let mut both = rows.clone();
    unparsable(&mut both, 2 * BATCH + 3);
    wrong_field(&mut both, 2 * BATCH + 7);
    expect(&both, 2 * BATCH as u64 + 4, "envelope does not parse");
}

/// Every type allows extra fields, so a name the fold reads on one type may hold anything on
/// another; the fold must read past it as if it were absent (it used to call the log corrupt).
#[test]
fn extra_fields_of_another_type_under_a_name_the_fold_reads_are_ignored() {
    let pricing = Pricing::bundled();
    let at = "2026-01-01T00:00:00.000Z";
    let event = |t: &str, payload: Value| json!({"type": t, "payload": payload, "recordedAt": at});
    let plain = [
        event("RunStarted", json!({})),
        event("StepStarted", json!({"stepPath": "a"})),
        event("StepCompleted", json!({"stepPath": "a", "output": 1})),
        event(
            "harness.model.responded",
            json!({"turn": 1, "callId": "c", "stepPath": "a",
            "model": {"provider": "openai", "modelId": "gpt-5"},
            "response": {"usage": {"inputTokens": 1000, "outputTokens": 10}}}),
        ),
    ];
    let extras = [
        event("RunStarted", json!({"model": 5, "runId": ["x"], "supervise": "yes"})),
        event(
            "StepStarted",
            json!({"stepPath": "a", "model": "gpt-6-sol", "outputRef": {"k": 1}, "groupId": 7}),
        ),
        event(
            "StepCompleted",
            json!({"stepPath": "a", "output": 1, "response": "sk-live-SECRET123", "stepKind": false}),
        ),
        event(
            "harness.model.responded",
            json!({"turn": 1, "callId": "c", "stepPath": "a",
            "model": {"provider": "openai", "modelId": "gpt-5"}, "cycleNumber": "one", "role": 3,
            "response": {"usage": {"inputTokens": 1000, "outputTokens": 10}}}),
        ),
    ];
    // With a value nested past serde_json's own limit beside the mistyped field.
    let deep = canonical::parse(&format!("{}1{}", "[".repeat(300), "]".repeat(300))).unwrap();
    let mut extras = extras;
    extras[1]["payload"]["deep"] = deep;
    let fold_all = |events: &[Value]| {
        let mut fold = Fold::new("run_x", pricing);
        for env in envelopes("run_x", events) {
            fold.push(&env).unwrap();
        }
        fold.state_json()
    };
    let want = fold_all(&plain);
    assert!(want.contains("\"status\":\"completed\""), "{want}");
    assert_eq!(fold_all(&extras), want);

    // A required field in another form is still corruption, and says so without quoting values.
    let mut bad = plain.clone();
    bad[3]["payload"]["model"] = json!("sk-live-SECRET123");
    let mut fold = Fold::new("run_x", pricing);
    let err = envelopes("run_x", &bad)
        .iter()
        .try_for_each(|env| fold.push(env))
        .unwrap_err();
    assert_eq!(err.code(), "EVENT_LOG_CORRUPT");
    assert!(
        err.to_string()
            .contains("the harness.model.responded payload's model is not what"),
        "{err}"
    );
    assert!(!err.to_string().contains("SECRET"), "{err}");
    // Also one the fold could read past: a step path of another type would move the call's cost
    // off its step, and a step's completion would be dropped.
    for (i, field) in [(3, "stepPath"), (2, "stepPath"), (0, "workflowVersionId")] {
        let mut bad = plain.clone();
        bad[i]["payload"][field] = json!(7);
        let mut fold = Fold::new("run_x", pricing);
        let err = envelopes("run_x", &bad)
            .iter()
            .try_for_each(|env| fold.push(env))
            .unwrap_err();
        assert_eq!(err.code(), "EVENT_LOG_CORRUPT", "{field}");
        assert!(
            err.to_string().contains(&format!("payload's {field} is not what")),
            "{err}"
        );
    }
    // So is a payload that is not an object.
    let mut bad = plain.clone();
    bad[1]["payload"] = json!("sk-live-SECRET123");
    let mut fold = Fold::new("run_x", pricing);
    let err = envelopes("run_x", &bad)
        .iter()
        .try_for_each(|env| fold.push(env))
        .unwrap_err();
    assert!(
        err.to_string().contains("the StepStarted payload is not a JSON object"),
        "{err}"
    );
    assert!(!err.to_string().contains("SECRET"), "{err}");
}

#[test]
fn a_long_listing_read_on_one_thread_at_the_thread_limit_holds_the_same_rows() {
    use little_world_kernel::events::packed::list_packed_parallel;
    let rows = stored_rows("run_list", &long_run(40_123));
    let (_dir, reader) = sqlite_with(&rows);
    let flat = |parts: Vec<little_world_kernel::events::packed::Packed>| {
        let sequences: Vec<f64> = parts
            .iter()
            .flat_map(|p| {
                p.table
                    .chunks(little_world_kernel::events::packed::STRIDE)
                    .map(|r| r[0])
            })
            .collect();
        let text: String = parts.iter().map(|p| p.text.as_str()).collect();
        (parts.len(), sequences, text)
    };
    let (two, sequences, text) = flat(list_packed_parallel(&reader, "run_list", 0, None).unwrap());
    assert_eq!(two, 2);
    assert_eq!(sequences, (1..=40_123).map(f64::from).collect::<Vec<_>>());
    little_world_kernel::runtime::fail_thread_starts(0, 1);
    let (one, alone, alone_text) = flat(list_packed_parallel(&reader, "run_list", 0, None).unwrap());
    assert_eq!(one, 1);
    assert_eq!(alone, sequences);
    assert_eq!(alone_text, text);
}

/// The rows of `events` as [`stored_rows`] makes them, each with an event id of its own.
fn rows_with_ids(run_id: &str, events: &[Value]) -> Vec<little_world_kernel::store::StoredEvent> {
    let mut rows = stored_rows(run_id, events);
    for r in &mut rows {
        r.event_id = format!("evt_{:016x}", r.sequence);
        r.envelope = r.envelope.replacen("evt_0000000000000000", &r.event_id, 1);
    }
    rows
}

#[test]
fn a_fold_resumed_from_a_snapshot_at_any_event_gives_the_same_state() {
    let fx = fixture();
    let pricing = Pricing::with_override(Some(&fx["pricing"].to_string())).unwrap();
    let mut logs: Vec<(String, Vec<String>)> = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let run_id = case["runId"].as_str().unwrap();
            (
                run_id.to_string(),
                envelopes(run_id, case["events"].as_array().unwrap()),
            )
        })
        .collect();
    let outer = [
        json!({"type": "RunStarted", "payload": {"workflowVersionId": "wv1"}, "recordedAt": "2026-01-01T00:00:00.000Z"}),
        json!({"type": "StepFailed", "payload": {"stepPath": "s", "error": {"message": "x"}}, "recordedAt": "2026-01-01T00:00:01.000Z"}),
        json!({"type": "OuterLoopCycleCompleted", "payload": {"outerLoopId": "ol", "cycleNumber": 1, "supervise": {"kind": "continue"}},
               "recordedAt": "2026-01-01T00:00:02.000Z"}),
        json!({"type": "OuterLoopCycleCompleted", "payload": {"outerLoopId": "ol", "cycleNumber": 2,
               "supervise": {"kind": "done", "finalOutput": {"a": [1]}}}, "recordedAt": "2026-01-01T00:00:03.000Z"}),
    ];
    logs.push(("run_outer".into(), envelopes("run_outer", &outer)));
    logs.push((
        "run_long".into(),
        rows_with_ids("run_long", &long_run(120))
            .into_iter()
            .map(|r| r.envelope)
            .collect(),
    ));
    for (run_id, log) in &logs {
        let mut whole = Fold::new(run_id, &pricing);
        for env in log {
            whole.push(env).unwrap();
        }
        let want = whole.state_json();
        for cut in 0..=log.len() {
            let mut first = Fold::new(run_id, &pricing);
            for env in &log[..cut] {
                first.push(env).unwrap();
            }
            let text = first.snapshot_text();
            let mut resumed = Fold::from_snapshot(run_id, &pricing, &text).unwrap();
            // Everything the fold holds is in the snapshot: its text comes back the same.
            assert_eq!(resumed.snapshot_text(), text, "{run_id} at {cut}");
            for env in &log[cut..] {
                resumed.push(env).unwrap();
            }
            assert_eq!(resumed.state_json(), want, "{run_id} resumed at {cut}");
        }
    }
}

#[test]
fn a_snapshot_is_used_only_while_its_text_and_the_log_agree_with_it() {
    use little_world_kernel::store::r#virtual::VirtualLog;
    use little_world_kernel::store::{FoldSnapshots, LogWriter, Scope, StoredSnapshot};
    let pricing = Pricing::bundled();
    let n = snapshot::SNAPSHOT_EVERY as usize + 40;
    let rows = rows_with_ids("run_snap", &long_run(n));
    let log = VirtualLog::new();
    log.clone()
        .transaction(&Scope::NONE, &mut |tx| {
            rows.iter().try_for_each(|r| tx.insert(&r.as_ref()))
        })
        .unwrap();
    let mut whole = Fold::new("run_snap", pricing);
    for r in &rows {
        whole.push(&r.envelope).unwrap();
    }
    let want = whole.state_json();
    let key = snapshot::key(pricing);
    assert_eq!(log.snapshot("run_snap", &key).unwrap(), None);
    snapshot::take(&log, "run_snap", pricing).unwrap();
    let taken = log.snapshot("run_snap", &key).unwrap().unwrap();
    assert_eq!(taken.sequence, n as u64);
    assert_eq!(fold_stored(&log, "run_snap", pricing).unwrap(), want);

    // A snapshot whose digest holds is what the fold starts from: one that says the run has
    // another status shows in the state.
    let (_, body) = taken.state.split_once('\n').unwrap();
    assert!(body.contains("\"status\":\"running\""), "{body}");
    let forged = body.replacen("\"status\":\"running\"", "\"status\":\"failed\"", 1);
    let with_digest = |body: &str, sequence: u64| StoredSnapshot {
        sequence,
        state: format!("{}\n{body}", little_world_kernel::ids::sha256_tagged(body.as_bytes())),
    };
    let other = VirtualLog::new();
    other
        .clone()
        .transaction(&Scope::NONE, &mut |tx| {
            rows.iter().try_for_each(|r| tx.insert(&r.as_ref()))
        })
        .unwrap();
    other
        .put_snapshot("run_snap", &key, &with_digest(&forged, n as u64))
        .unwrap();
    assert!(fold_stored(&other, "run_snap", pricing)
        .unwrap()
        .contains("\"status\":\"failed\""));

    // Passed over, and the log read from its start instead: a text that does not match its
    // digest, one taken after an event the log does not have there, one past the log's end, and
    // one folded with other prices.
    let cases = [
        StoredSnapshot {
            sequence: n as u64,
            state: taken
                .state
                .replacen("\"status\":\"running\"", "\"status\":\"failed\"", 1),
        },
        with_digest(
            &forged.replacen(&format!("evt_{n:016x}"), "evt_00000000000000ff", 1),
            n as u64,
        ),
        with_digest(
            &forged.replacen(&format!("\"eventCount\":{n}"), &format!("\"eventCount\":{}", n + 1), 1),
            n as u64 + 1,
        ),
    ];
    for (i, bad) in cases.into_iter().enumerate() {
        let log = VirtualLog::new();
        log.clone()
            .transaction(&Scope::NONE, &mut |tx| {
                rows.iter().try_for_each(|r| tx.insert(&r.as_ref()))
            })
            .unwrap();
        log.put_snapshot("run_snap", &key, &bad).unwrap();
        assert_eq!(fold_stored(&log, "run_snap", pricing).unwrap(), want, "case {i}");
    }
    let priced = Pricing::with_override(Some(
        r#"{"models":[{"provider":"nobody","modelId":"unpriced","inputPerMTok":1,"outputPerMTok":2}]}"#,
    ))
    .unwrap();
    assert_ne!(snapshot::key(&priced), key);
    let mut repriced = Fold::new("run_snap", &priced);
    for r in &rows {
        repriced.push(&r.envelope).unwrap();
    }
    assert_eq!(fold_stored(&other, "run_snap", &priced).unwrap(), repriced.state_json());
}

#[test]
fn the_fold_version_names_what_the_fold_computes() {
    // Snapshots of another FOLD_VERSION are not used, so a change to what the fold computes or
    // keeps must raise it: this digest of the fixture's snapshots changes with any such change.
    let fx = fixture();
    let pricing = Pricing::with_override(Some(&fx["pricing"].to_string())).unwrap();
    let mut all = format!("version {}\n", snapshot::FOLD_VERSION);
    for case in fx["cases"].as_array().unwrap() {
        let run_id = case["runId"].as_str().unwrap();
        let mut fold = Fold::new(run_id, &pricing);
        for env in envelopes(run_id, case["events"].as_array().unwrap()) {
            fold.push(&env).unwrap();
            all.push_str(&fold.snapshot_text());
        }
    }
    assert_eq!(
        little_world_kernel::ids::sha256_tagged(all.as_bytes()),
        "sha256:cdeb91b291889be55c52b30559ba9521409eed6a446a123a90fd4d3ee5eb76be",
        "what the fold computes or keeps changed: raise FOLD_VERSION, then update this digest"
    );
}
