//! The append rules on both backends: dense sequences, idempotent retries, payload rules, artifact
//! references, canonical envelopes and the log's shape check.

use super::*;
use crate::canonical;
use crate::store::postgres;
use crate::store::r#virtual::VirtualLog;
use crate::store::sqlite::{self, Durability};
use crate::store::{IndexQuery, LogWriter};
use serde_json::json;

struct NoArtifacts;
impl Artifacts for NoArtifacts {
    fn artifact_exists(&self, id: &str) -> Result<bool> {
        Ok(id == "art_00000000000000aa")
    }
    fn json_id(&self, _run: &str, _step: &str, _name: &str, _json: &str) -> String {
        "art_00000000000000aa".into()
    }
    fn store_json(&self, _run: &str, _step: &str, _name: &str, _json: String) -> Result<String> {
        Ok("art_00000000000000aa".into())
    }
}

fn req(run: &str, t: &str, payload: serde_json::Value, key: Option<&str>) -> AppendRequest {
    AppendRequest {
        run_id: run.into(),
        event_type: t.into(),
        payload_json: payload.to_string(),
        key: key.map(str::to_string),
        draft: None,
        expected_sequence: None,
        index: Vec::new(),
        strings: Vec::new(),
    }
}

/// An append prepared, or why it is refused: also a keyed append's refusal, which `prepare` leaves
/// for the writer to tell (see `PreparedAppend::refused`).
fn prep(r: AppendRequest) -> Result<PreparedAppend> {
    let p = prepare(r, &NoArtifacts)?;
    match p.refused {
        Some(e) => Err(e),
        None => Ok(p),
    }
}

fn validation_path(e: WorldError) -> String {
    match e {
        WorldError::Validation { path, .. } => path,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

/// A writer, its reader, and what keeps their storage alive until the test is done.
type Backend = (
    Box<dyn LogWriter>,
    Box<dyn crate::store::LogReader>,
    Option<Box<dyn std::any::Any>>,
);

/// Every backend: memory, SQLite, and PostgreSQL in a fresh schema when the test server is there.
fn backends() -> Vec<Backend> {
    let mem = VirtualLog::new();
    let dir = tempfile::tempdir().unwrap();
    let (w, r) = sqlite::open(dir.path(), Durability::Normal).unwrap();
    let mut all: Vec<Backend> = vec![
        (Box::new(mem.clone()), Box::new(mem), None),
        (Box::new(w), Box::new(r), Some(Box::new(dir))),
    ];
    if let Some(schema) = crate::pg::testing::test_schema() {
        let db = schema.db();
        all.push((
            Box::new(postgres::PgWriter::new(db.clone()).unwrap()),
            Box::new(postgres::PgReader::new(db)),
            Some(Box::new(schema)),
        ));
    }
    all
}

#[test]
fn sequences_are_dense_per_run_and_rejections_consume_none() {
    for (mut w, r, _dir) in backends() {
        let mut batch: Vec<PreparedAppend> = (0..10)
            .map(|i| {
                prep(req(
                    if i % 2 == 0 { "run_a" } else { "run_b" },
                    "StepStarted",
                    json!({"stepPath": format!("s{i}")}),
                    None,
                ))
                .unwrap()
            })
            .collect();
        let out = commit_batch(&mut *w, &NoArtifacts, &mut batch, "2026-01-01T00:00:00.000Z");
        assert!(out.iter().all(|o| o.is_ok()));
        // A keyed conflict in the middle of a group is rolled back alone.
        let first = prep(req(
            "run_a",
            "my.tool.failed",
            json!({"callId": "c", "error": {"message": "x"}, "durationMs": 1}),
            Some("k1"),
        ))
        .unwrap();
        let conflict = prep(req(
            "run_a",
            "my.tool.failed",
            json!({"callId": "c", "error": {"message": "y"}, "durationMs": 1}),
            Some("k1"),
        ))
        .unwrap();
        let after = prep(req("run_a", "StepStarted", json!({"stepPath": "z"}), None)).unwrap();
        let out = commit_batch(
            &mut *w,
            &NoArtifacts,
            &mut [first, conflict, after],
            "2026-01-01T00:00:01.000Z",
        );
        assert!(out[0].is_ok());
        assert_eq!(out[1].as_ref().unwrap_err().code(), "EVENT_APPEND_IDEMPOTENCY_CONFLICT");
        let after: serde_json::Value = serde_json::from_str(out[2].as_ref().unwrap()).unwrap();
        assert_eq!(after["sequence"], 7);
        let mut seqs = vec![];
        r.rows("run_a", 0, None, &mut |row| {
            seqs.push(row.sequence);
            Ok(())
        })
        .unwrap();
        assert_eq!(seqs, (1..=7).collect::<Vec<_>>());
    }
}

#[test]
fn a_unit_commits_whole_or_not_at_all_and_a_refused_one_consumes_no_sequence() {
    for (mut w, r, _dir) in backends() {
        let step = |run: &str, path: &str| prep(req(run, "StepStarted", json!({"stepPath": path}), None)).unwrap();
        let mut expecting = step("run_u", "late");
        expecting.expected_sequence = Some(0); // Two places behind once the first unit commits.
                                               // Units: one append; a group of two; a group of two whose second is refused; one append.
        let mut batch = vec![
            step("run_u", "a"),
            step("run_u", "b"),
            step("run_u", "c"),
            step("run_u", "d"),
            expecting,
            step("run_u", "e"),
        ];
        let out = commit_units(
            &mut *w,
            &NoArtifacts,
            &mut batch,
            &[1, 2, 2, 1],
            "2026-01-01T00:00:00.000Z",
        );
        let sequences =
            |o: &UnitOutcome| -> Vec<u64> { o.as_ref().unwrap().iter().map(|e| sequence_of(e).unwrap()).collect() };
        assert_eq!(sequences(&out[0]), [1]);
        assert_eq!(sequences(&out[1]), [2, 3]);
        assert_eq!(out[2].as_ref().unwrap_err().code(), "EVENT_SEQUENCE_CONFLICT");
        // The refused group's first append is undone, its place taken by the next unit.
        assert_eq!(sequences(&out[3]), [4]);
        let mut paths = vec![];
        r.rows("run_u", 0, None, &mut |row| {
            let env: serde_json::Value = serde_json::from_str(row.envelope).unwrap();
            paths.push(env["payload"]["stepPath"].as_str().unwrap().to_string());
            Ok(())
        })
        .unwrap();
        assert_eq!(paths, ["a", "b", "c", "e"]);
    }
}

#[test]
fn idempotent_retry_returns_the_stored_envelope() {
    for (mut w, _r, _dir) in backends() {
        let make = || {
            prep(req(
                "run_k",
                "my.model.called",
                json!({"turn": 1, "promptHash": "h", "request": {"model": "m", "messages": [], "tools": []}}),
                Some("key-1"),
            ))
            .unwrap()
        };
        let a = commit_batch(&mut *w, &NoArtifacts, &mut [make()], "2026-01-01T00:00:00.000Z")
            .remove(0)
            .unwrap();
        // Same key twice in one group, and again later with another clock: all identical.
        let b = commit_batch(&mut *w, &NoArtifacts, &mut [make(), make()], "2026-01-02T00:00:00.000Z");
        assert_eq!(b[0].as_ref().unwrap(), &a);
        assert_eq!(b[1].as_ref().unwrap(), &a);
        let env: serde_json::Value = serde_json::from_str(&a).unwrap();
        assert_eq!(env["sequence"], 1);
        assert_eq!(env["appendIdempotencyKey"], "key-1");
        assert!(env["canonicalRequestDigest"].as_str().unwrap().starts_with("sha256:"));
        shape::check_envelope(&env).unwrap();
    }
}

#[test]
fn a_type_that_needs_a_key_is_refused_without_one() {
    let e = prep(req(
        "run_a",
        "keyed.failed",
        json!({"runId": "run_a", "error": {"message": "x"}}),
        None,
    ))
    .unwrap_err();
    assert_eq!(validation_path(e), "appendIdempotencyKey");
}

#[test]
fn cost_usd_in_any_usage_is_refused_with_its_path() {
    let e = prep(req(
        "run_a",
        "my.fact",
        json!({"a": [{"usage": {"costUsd": 1, "inputTokens": 1}}]}),
        None,
    ))
    .unwrap_err();
    assert_eq!(validation_path(e), "payload.a[0].usage.costUsd");
    let e = prep(req(
        "run_a",
        "my.model.responded",
        json!({"turn": 1, "callId": "c", "model": {"provider": "openai", "modelId": "gpt-5"}, "response": {"usage": {"inputTokens": 1, "outputTokens": 1, "costUsd": 0.1}}}),
        Some("k"),
    ))
    .unwrap_err();
    assert_eq!(validation_path(e), "payload.response.usage.costUsd");
}

#[test]
fn artifact_references_must_exist() {
    assert!(prep(req(
        "run_a",
        "my.fact",
        json!({"x": "artifact://art_00000000000000aa"}),
        None
    ))
    .is_ok());
    let e = prep(req(
        "run_a",
        "my.fact",
        json!({"x": ["artifact://art_00000000000000bb"]}),
        None,
    ))
    .unwrap_err();
    assert_eq!(e.code(), "ARTIFACT_NOT_FOUND");
    assert!(e.to_string().contains("payload.x[0]"), "{e}");
}

#[test]
fn payloads_must_be_objects_of_storable_json() {
    let bad = |json: &str| {
        prepare(
            AppendRequest {
                strings: Vec::new(),
                run_id: "run_a".into(),
                event_type: "t".into(),
                payload_json: json.into(),
                key: None,
                draft: None,
                expected_sequence: None,
                index: Vec::new(),
            },
            &NoArtifacts,
        )
        .unwrap_err()
    };
    assert_eq!(validation_path(bad("[1]")), "payload");
    assert_eq!(validation_path(bad("{\"a\":1e999}")), "payload");
    assert_eq!(validation_path(bad("{\"a\":\"\\udc00\"}")), "payload");
    let deep = format!("{{\"a\":{}{}}}", "[".repeat(1000), "]".repeat(1000));
    assert_eq!(validation_path(bad(&deep)), "payload");
    let e = prepare(
        AppendRequest {
            strings: Vec::new(),
            run_id: "run_/x".into(),
            event_type: "t".into(),
            payload_json: "{}".into(),
            key: None,
            draft: None,
            expected_sequence: None,
            index: Vec::new(),
        },
        &NoArtifacts,
    )
    .unwrap_err();
    assert_eq!(e.code(), "WORLD_PATH");
    let e = prepare(
        AppendRequest {
            strings: Vec::new(),
            run_id: "run_a".into(),
            event_type: "".into(),
            payload_json: "{}".into(),
            key: None,
            draft: None,
            expected_sequence: None,
            index: Vec::new(),
        },
        &NoArtifacts,
    )
    .unwrap_err();
    assert_eq!(validation_path(e), "type");
}

#[test]
fn payload_is_stored_canonical_and_ids_match() {
    let p = prep(req(
        "run_c",
        "x",
        json!({"b": 1.0, "a": "\u{e9}", "\u{E000}": 1, "\u{1F600}": 2}),
        None,
    ))
    .unwrap();
    assert_eq!(p.payload(), "{\"a\":\"\u{e9}\",\"b\":1,\"\u{1F600}\":2,\"\u{E000}\":1}");
    let mut mem = VirtualLog::new();
    let env = commit_batch(&mut mem, &NoArtifacts, &mut [p], "2026-01-01T00:00:00.000Z")
        .remove(0)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&env).unwrap();
    shape::check_log(std::slice::from_ref(&v)).unwrap();
    assert_eq!(canonical::to_string(&v), env, "the stored envelope is canonical");
}

#[test]
fn shape_check_finds_holes_and_tampering() {
    let mut mem = VirtualLog::new();
    let mut batch: Vec<_> = (0..3)
        .map(|i| prep(req("run_s", "x", json!({"i": i}), None)).unwrap())
        .collect();
    let envs: Vec<serde_json::Value> = commit_batch(&mut mem, &NoArtifacts, &mut batch, "2026-01-01T00:00:00.000Z")
        .into_iter()
        .map(|e| serde_json::from_str(&e.unwrap()).unwrap())
        .collect();
    shape::check_log(&envs).unwrap();
    let hole = vec![envs[0].clone(), envs[2].clone()];
    assert_eq!(shape::check_log(&hole).unwrap_err().code(), "EVENT_LOG_CORRUPT");
    let mut tampered = envs.clone();
    tampered[1]["payload"]["i"] = json!(42);
    let err = shape::check_log(&tampered).unwrap_err();
    assert_eq!(err.code(), "EVENT_LOG_CORRUPT");
    assert!(err.to_string().contains("sequence 2"), "{err}");
}

#[test]
fn strings_sent_beside_the_payload_take_their_placeholders_exactly_once() {
    let beside = |payload: serde_json::Value, strings: &[&str]| {
        let mut r = req("run_s", "custom.fact", payload, None);
        r.strings = strings.iter().map(|s| s.to_string()).collect();
        prep(r)
    };
    let p = beside(
        json!({"a": ["\u{0}1", {"b": "\u{0}0"}], "\u{0}k": "short"}),
        &["zero", "one"],
    )
    .unwrap();
    assert_eq!(p.payload(), r#"{"\u0000k":"short","a":["one",{"b":"zero"}]}"#);
    // The same event as one whose strings were inline: same canonical payload, same id.
    let inline = prep(req(
        "run_s",
        "custom.fact",
        json!({"a": ["one", {"b": "zero"}], "\u{0}k": "short"}),
        None,
    ))
    .unwrap();
    assert_eq!(p.payload(), inline.payload());
    assert_eq!(
        ids::event_id_finish(&p.id_prefix, 1, "custom.fact"),
        ids::event_id_finish(&inline.id_prefix, 1, "custom.fact")
    );
    // Without strings beside it, a string starting with U+0000 is the caller's own.
    let own = prep(req("run_s", "custom.fact", json!({"a": "\u{0}0"}), None)).unwrap();
    assert_eq!(own.payload(), r#"{"a":"\u00000"}"#);
    for (payload, strings) in [
        (json!({"a": "\u{0}0", "b": "\u{0}0"}), &["x"][..]), // used twice
        (json!({"a": "\u{0}0"}), &["x", "y"][..]),           // one left over
        (json!({"a": "\u{0}2"}), &["x"][..]),                // out of range
        (json!({"a": "\u{0}"}), &["x"][..]),                 // no index
    ] {
        let e = beside(payload.clone(), strings).unwrap_err();
        assert_eq!(e.code(), "RUNTIME_INTEGRITY", "{payload} {strings:?}: {e}");
    }
}

#[test]
fn envelopes_finished_in_their_prepared_heads_are_the_canonical_json_of_their_fields() {
    // Keyed and keyless, in groups of one and of several, with a payload that needs escaping and
    // sorting: each committed envelope is byte for byte the canonical JSON of its own fields, its
    // id and digest are the ones computed from its content, and the payload is the prepared one.
    for (mut w, _r, _dir) in backends() {
        for group in [1usize, 3] {
            let mut batch: Vec<PreparedAppend> = (0..group)
                .map(|i| {
                    let payload = json!({"z": "tab\there \"q\" é 😀", "a": [1.5, -0.0, 1e21], "i": i, "stepPath": "s"});
                    let key = (i % 2 == 0).then(|| format!("key-{group}-{i}"));
                    prep(req("run_h", "StepStarted", payload, key.as_deref())).unwrap()
                })
                .collect();
            let payloads: Vec<String> = batch.iter().map(|p| p.payload().to_string()).collect();
            let out = commit_batch(&mut *w, &NoArtifacts, &mut batch, "2026-01-01T00:00:00.000Z");
            for ((o, item), payload) in out.into_iter().zip(&batch).zip(&payloads) {
                let text = o.unwrap();
                let value: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(text, serde_json_canonicalizer::to_string(&value).unwrap());
                assert_eq!(canonical::to_string(&value["payload"]), *payload);
                let seq = value["sequence"].as_u64().unwrap();
                assert_eq!(
                    value["eventId"],
                    ids::event_id_finish(&item.id_prefix, seq, "StepStarted")
                );
                match &item.key {
                    Some(k) => {
                        assert_eq!(value["appendIdempotencyKey"], k.as_str());
                        assert_eq!(
                            value["canonicalRequestDigest"],
                            ids::request_digest("run_h", "StepStarted", payload).as_str()
                        );
                    }
                    None => assert!(value.get("canonicalRequestDigest").is_none()),
                }
            }
        }
    }
}

/// A retry of an append stored before gets its envelope back, even when a rule added since
/// refuses its payload: a runtime resuming after an upgrade retries what it may have committed.
#[test]
fn a_keyed_retry_of_an_append_stored_under_looser_rules_returns_it() {
    let at = "2026-01-01T00:00:00.000Z";
    let session = |cached: u64| json!({"runId": "run_child", "usage": {"inputTokens": 10, "outputTokens": 1, "cachedInputTokens": cached, "reasoningTokens": 0}});
    for (mut w, r, _dir) in backends() {
        let keyed = |cached: u64, key: &str| req("run_a", "keyed.usage", session(cached), Some(key));
        // Stored as an earlier version stored it: this version refuses cached above input tokens.
        let mut stored = prepare(keyed(20, "k"), &NoArtifacts).unwrap();
        assert!(stored.refused.take().is_some());
        let first = commit_batch(&mut *w, &NoArtifacts, &mut [stored], at)
            .remove(0)
            .unwrap();

        let retry = prepare(keyed(20, "k"), &NoArtifacts).unwrap();
        assert_eq!(answer_refused(&*r, retry).unwrap(), first);
        // The payload is still refused under another key, and another payload under this key
        // is refused for what it holds (not as a conflict).
        let answers = [keyed(20, "k2"), keyed(30, "k"), keyed(20, "k")]
            .map(|request| answer_refused(&*r, prepare(request, &NoArtifacts).unwrap()));
        for refused in &answers[..2] {
            let e = refused.clone().unwrap_err();
            assert_eq!(validation_path(e), "payload.usage.cachedInputTokens");
        }
        assert_eq!(answers[2].clone().unwrap(), first);
        // Given to the writer in a group anyway, refused appends write nothing.
        let mut group =
            [keyed(20, "k2"), keyed(30, "k"), keyed(20, "k")].map(|request| prepare(request, &NoArtifacts).unwrap());
        for out in commit_batch(&mut *w, &NoArtifacts, &mut group, at) {
            assert_eq!(validation_path(out.unwrap_err()), "payload.usage.cachedInputTokens");
        }
        assert_eq!(r.last_sequence("run_a").unwrap(), 1);

        // Also one whose large value was moved into an artifact: the retry's digest is taken
        // after the same move, so it matches.
        let big = |key: &str| {
            let payload =
                json!({"callId": "c", "durationMs": 1, "result": "x".repeat(300_000), "usage": {"costUsd": 1}});
            req("run_a", "keyed.tool", payload, Some(key))
        };
        let mut stored = prepare(big("k3"), &NoArtifacts).unwrap();
        assert!(stored.refused.take().is_some());
        stored.spill = None; // NoArtifacts stores nothing anyway
        let first = commit_batch(&mut *w, &NoArtifacts, &mut [stored], at)
            .remove(0)
            .unwrap();
        assert!(
            first.contains("\"resultRef\":\"artifact://art_00000000000000aa\""),
            "{first}"
        );
        let retry = prepare(big("k3"), &NoArtifacts).unwrap();
        assert!(retry.spill.is_none(), "a refused append stores no artifact");
        assert_eq!(answer_refused(&*r, retry).unwrap(), first);
        let other = prepare(big("k4"), &NoArtifacts).unwrap();
        assert_eq!(
            validation_path(answer_refused(&*r, other).unwrap_err()),
            "payload.usage.costUsd"
        );
        // A request that gives the value and a reference both is another request, though moving
        // its value would have overwritten its reference with the stored one.
        let mut both = json!({"callId": "c", "durationMs": 1, "result": "x".repeat(300_000), "usage": {"costUsd": 1}});
        both["resultRef"] = json!("artifact://art_00000000000000aa");
        let both = prepare(req("run_a", "keyed.tool", both, Some("k3")), &NoArtifacts).unwrap();
        assert!(answer_refused(&*r, both).is_err());
    }
}

/// A keyed append is refused for its first fault, as an unkeyed one is: a later check must not
/// replace it (one that names a credential-like key, or another class of error).
#[test]
fn a_keyed_append_is_refused_for_the_same_fault_as_an_unkeyed_one() {
    let payloads = [
        json!({"nodeId": "n1", "x": {"usage": {"costUsd": 0.01}}}),
        json!({"nodeId": 5, "note": "artifact://art_0000000000000000"}),
    ];
    for payload in payloads {
        let unkeyed = prep(req("run_a", "sample.node_ended", payload.clone(), None)).unwrap_err();
        let keyed = prep(req("run_a", "sample.node_ended", payload.clone(), Some("k"))).unwrap_err();
        assert_eq!(keyed.code(), unkeyed.code(), "{keyed}");
        assert_eq!(keyed.to_string(), unkeyed.to_string());
    }
}

/// Generated inputs, on every backend: what is stored is what an independent canonicalizer makes
/// of the payload, with the event id it hashes to; and no payload text, however broken, makes
/// the append rules panic or store anything when they refuse it.
mod properties {
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest, Sha256};

    /// JSON values of a few levels, with strings that need escaping and numbers of every size.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            "[a-zA-Z0-9 \"\\\\\u{1}\u{7f}é€\u{2028}😀]{0,8}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[a-z_é😀]{0,5}", inner, 0..5)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// `evt_` + the first 16 hex of sha256 of the JCS of `{runId, sequence, type, payload}`, by
    /// the oracle canonicalizer.
    fn oracle_event_id(run: &str, sequence: u64, t: &str, payload: &serde_json::Value) -> String {
        let pre = json!({"runId": run, "sequence": sequence, "type": t, "payload": payload});
        let text = serde_json_canonicalizer::to_string(&pre).unwrap();
        format!("evt_{}", hex::encode(&Sha256::digest(text.as_bytes())[..8]))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn stored_payloads_are_the_oracles_canonical_form(values in prop::collection::vec(json_value(), 1..8)) {
            for (mut w, r, _dir) in backends() {
                let mut batch: Vec<PreparedAppend> = values
                    .iter()
                    .map(|v| prep(req("run_p", "Fact", json!({ "v": v }), None)).unwrap())
                    .collect();
                let out = commit_batch(&mut *w, &NoArtifacts, &mut batch, "2026-01-01T00:00:00.000Z");
                let mut listed = Vec::new();
                r.envelopes("run_p", 0, None, &mut |e| {
                    listed.push(e.to_string());
                    Ok(())
                })
                .unwrap();
                prop_assert_eq!(listed.len(), values.len());
                for ((v, envelope), committed) in values.iter().zip(&listed).zip(out) {
                    prop_assert_eq!(&committed.unwrap(), envelope);
                    let parsed: serde_json::Value = serde_json::from_str(envelope).unwrap();
                    let payload = json!({ "v": v });
                    prop_assert_eq!(
                        canonical::to_string(&parsed["payload"]),
                        serde_json_canonicalizer::to_string(&payload).unwrap()
                    );
                    let sequence = parsed["sequence"].as_u64().unwrap();
                    prop_assert_eq!(parsed["eventId"].as_str().unwrap(), oracle_event_id("run_p", sequence, "Fact", &payload));
                    prop_assert_eq!(serde_json_canonicalizer::to_string(&parsed).unwrap(), envelope.clone());
                }
            }
        }

        #[test]
        fn no_payload_text_panics_and_a_refused_one_stores_nothing(text in ".{0,64}", t in prop_oneof![
            Just("Fact"), Just("sample.step"), Just("keyed.usage"), Just("sample.node_ended"), Just("sample.completed")
        ]) {
            let key = t.starts_with("keyed.").then_some("k");
            let r = AppendRequest { payload_json: text.clone(), ..req("run_h", t, json!({}), key) };
            if let Ok(mut p) = prep(r) {
                // What the rules accept commits, or is refused by the writer with a typed error.
                for (mut w, rd, _dir) in backends() {
                    let out = commit_batch(&mut *w, &NoArtifacts, std::slice::from_mut(&mut p.clone()), "2026-01-01T00:00:00.000Z");
                    let stored = rd.last_sequence("run_h").unwrap();
                    prop_assert_eq!(stored, u64::from(out[0].is_ok()));
                }
                p.head.clear();
            }
        }
    }
}

fn expecting(run: &str, step: &str, expected: Option<u64>, index: Vec<IndexWrite>) -> PreparedAppend {
    let mut r = req(run, "StepStarted", json!({"stepPath": step}), None);
    r.expected_sequence = expected;
    r.index = index;
    prep(r).unwrap()
}

fn set(index: &str, key: &str, value: Option<&str>) -> IndexWrite {
    IndexWrite {
        index: index.into(),
        key: key.into(),
        value: value.map(str::to_string),
    }
}

#[test]
fn an_append_expecting_another_last_sequence_is_refused_and_consumes_none() {
    for (mut w, r, _dir) in backends() {
        let at = "2026-01-01T00:00:00.000Z";
        // Expecting 0 on a new run, then 1, in one group: both hold.
        let out = commit_batch(
            &mut *w,
            &NoArtifacts,
            &mut [
                expecting("run_e", "a", Some(0), vec![]),
                expecting("run_e", "b", Some(1), vec![]),
            ],
            at,
        );
        assert!(out.iter().all(|o| o.is_ok()), "{out:?}");
        // A stale expectation between two that hold: refused alone, with what the log holds.
        let out = commit_batch(
            &mut *w,
            &NoArtifacts,
            &mut [
                expecting("run_e", "c", Some(2), vec![]),
                expecting("run_e", "d", Some(2), vec![]),
                expecting("run_e", "e", Some(3), vec![]),
            ],
            at,
        );
        assert!(out[0].is_ok() && out[2].is_ok());
        let err = out[1].as_ref().unwrap_err();
        assert_eq!(err.code(), "EVENT_SEQUENCE_CONFLICT");
        assert_eq!(
            err.details(),
            json!({"runId": "run_e", "expectedSequence": 2, "lastSequence": 3})
        );
        assert_eq!(r.last_sequence("run_e").unwrap(), 4);
        // A keyed retry is answered with its event whatever it expected.
        let keyed = |expected| {
            let mut q = req(
                "run_e",
                "my.tool.failed",
                json!({"callId": "c", "error": {"message": "x"}, "durationMs": 1}),
                Some("k"),
            );
            q.expected_sequence = Some(expected);
            prep(q).unwrap()
        };
        let first = commit_batch(&mut *w, &NoArtifacts, &mut [keyed(4)], at)
            .remove(0)
            .unwrap();
        let again = commit_batch(&mut *w, &NoArtifacts, &mut [keyed(4)], at)
            .remove(0)
            .unwrap();
        assert_eq!(first, again);
        assert_eq!(r.last_sequence("run_e").unwrap(), 5);
    }
}

#[test]
fn index_entries_are_owned_by_one_run_and_commit_or_roll_back_with_its_event() {
    for (mut w, r, _dir) in backends() {
        let at = "2026-01-01T00:00:00.000Z";
        let out = commit_batch(
            &mut *w,
            &NoArtifacts,
            &mut [
                expecting(
                    "run_a",
                    "a",
                    None,
                    vec![set("hooks", "tok", Some("pending")), set("by", "x", Some("1"))],
                ),
                // Another run may not take the key, even in the same group; its event is not written.
                expecting(
                    "run_b",
                    "b",
                    None,
                    vec![set("other", "k", Some("v")), set("hooks", "tok", Some("mine"))],
                ),
                // The owner may change its entry in the same group.
                expecting("run_a", "c", None, vec![set("hooks", "tok", Some("done"))]),
            ],
            at,
        );
        assert!(out[0].is_ok() && out[2].is_ok());
        let err = out[1].as_ref().unwrap_err();
        assert_eq!(err.code(), "INDEX_ENTRY_CONFLICT");
        assert_eq!(
            err.details(),
            json!({"runId": "run_b", "index": "hooks", "key": "tok", "holderRunId": "run_a"})
        );
        assert_eq!(r.last_sequence("run_b").unwrap(), 0);
        // What run_b's refused event would have written is not there.
        assert!(r.index_entry("other", "k").unwrap().is_none());
        let entry = r.index_entry("hooks", "tok").unwrap().unwrap();
        assert_eq!(
            (entry.value.as_str(), entry.run_id.as_str(), entry.sequence),
            ("done", "run_a", 2)
        );
        // The owner removes it; then another run may take it.
        let out = commit_batch(
            &mut *w,
            &NoArtifacts,
            &mut [
                expecting("run_a", "d", None, vec![set("hooks", "tok", None)]),
                expecting("run_b", "e", None, vec![set("hooks", "tok", Some("mine"))]),
            ],
            at,
        );
        assert!(out.iter().all(|o| o.is_ok()), "{out:?}");
        assert_eq!(r.index_entry("hooks", "tok").unwrap().unwrap().run_id, "run_b");
    }
}

#[test]
fn index_listings_filter_by_value_and_page_by_key_both_ways() {
    for (mut w, r, _dir) in backends() {
        let writes: Vec<IndexWrite> = (0..6)
            .map(|i| set("runs", &format!("k{i}"), Some(if i % 2 == 0 { "even" } else { "odd" })))
            .collect();
        let out = commit_batch(
            &mut *w,
            &NoArtifacts,
            &mut [expecting("run_l", "a", None, writes)],
            "2026-01-01T00:00:00.000Z",
        );
        assert!(out[0].is_ok());
        let keys = |value, after, limit, descending| -> Vec<String> {
            let q = IndexQuery {
                index: "runs",
                value,
                after,
                limit,
                descending,
            };
            r.index_entries(&q).unwrap().into_iter().map(|e| e.key).collect()
        };
        assert_eq!(keys(None, None, 100, false), ["k0", "k1", "k2", "k3", "k4", "k5"]);
        assert_eq!(keys(Some("even"), None, 100, false), ["k0", "k2", "k4"]);
        assert_eq!(keys(Some("even"), Some("k0"), 1, false), ["k2"]);
        assert_eq!(keys(None, Some("k4"), 2, true), ["k3", "k2"]);
        assert_eq!(keys(Some("odd"), None, 100, true), ["k5", "k3", "k1"]);
        assert!(keys(None, None, 100, false).len() == 6 && keys(Some("none"), None, 100, false).is_empty());
    }
}

#[test]
fn index_writes_are_checked_before_anything_is_written() {
    let long = "x".repeat(MAX_INDEX_LEN + 1);
    let cases = [
        (vec![set("", "k", Some("v"))], "index[0].index"),
        (
            vec![set("i", "k", Some("v")), set("i", &long, Some("v"))],
            "index[1].key",
        ),
        (vec![set("i", "k", Some("a\0b"))], "index[0].value"),
        (
            (0..=MAX_INDEX_WRITES).map(|i| set("i", &i.to_string(), None)).collect(),
            "index",
        ),
    ];
    for (writes, path) in cases {
        let mut r = req("run_v", "StepStarted", json!({"stepPath": "s"}), None);
        r.index = writes;
        assert_eq!(validation_path(prepare(r, &NoArtifacts).unwrap_err()), path);
    }
    let parsed = index_writes_from_json(r#"[{"index":"i","key":"k","value":null}]"#).unwrap();
    assert_eq!(parsed, vec![set("i", "k", None)]);
    assert_eq!(
        validation_path(index_writes_from_json(r#"[{"index":"i","key":"k","v":1}]"#).unwrap_err()),
        "index"
    );
}

#[test]
fn the_head_says_where_it_wrote_the_digest_the_event_id_and_the_payload() {
    for key in [None, Some("k \"quoted\" \u{e9}")] {
        let fields = EnvelopeFields {
            event_id: EVENT_ID_PLACEHOLDER,
            run_id: "run_layout",
            sequence: 0,
            event_type: "custom.t",
            key,
            digest: key.map(|_| DIGEST_PLACEHOLDER),
            recorded_at: "",
        };
        let mut out = b"prefix".to_vec();
        let layout = fields.write_head(&mut out);
        let at = |from: usize, len: usize| std::str::from_utf8(&out[from..from + len]).unwrap().to_string();
        assert_eq!(at(layout.event_id, EVENT_ID_PLACEHOLDER.len()), EVENT_ID_PLACEHOLDER);
        assert_eq!(
            layout.digest.map(|d| at(d, DIGEST_PLACEHOLDER.len())).as_deref(),
            key.map(|_| DIGEST_PLACEHOLDER)
        );
        assert_eq!(layout.payload, out.len());
        // A prepared append fills them in: the envelope it makes is the one its fields describe.
        let prepared = prep(req("run_layout", "custom.t", json!({"b": [1, "two"], "a": null}), key)).unwrap();
        assert_eq!(prepared.payload(), r#"{"a":null,"b":[1,"two"]}"#);
        let mut w = VirtualLog::new();
        let envelope = commit_batch(&mut w, &NoArtifacts, &mut [prepared], "2026-01-01T00:00:00.000Z")
            .remove(0)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&envelope).unwrap();
        shape::check_envelope(&v).unwrap();
        assert_eq!(v["payload"], json!({"a": null, "b": [1, "two"]}));
        assert_eq!(v["appendIdempotencyKey"].as_str(), key);
    }
}
