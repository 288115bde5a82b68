//! Builders shared by the run-event tests.

use little_world_kernel::error::WorldError;
use serde_json::{json, Map, Value};

/// A draft of type `t` with `fields`.
pub fn draft(t: &str, fields: Value) -> Value {
    let mut v = fields;
    v["type"] = json!(t);
    v
}

/// `v` as the map the API takes.
pub fn map(v: &Value) -> &Map<String, Value> {
    v.as_object().expect("an object")
}

/// A copy of `base` with the dotted field set to `x` (parents must exist).
pub fn with(base: &Value, dotted: &str, x: Value) -> Value {
    let mut v = base.clone();
    let mut cur = &mut v;
    let parts: Vec<&str> = dotted.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        cur = &mut cur[*p];
    }
    cur[parts[parts.len() - 1]] = x;
    v
}

/// A copy of `base` without the dotted field.
pub fn without(base: &Value, dotted: &str) -> Value {
    let mut v = base.clone();
    let mut cur = &mut v;
    let parts: Vec<&str> = dotted.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        cur = &mut cur[*p];
    }
    cur.as_object_mut().unwrap().remove(parts[parts.len() - 1]);
    v
}

/// The path of a validation error (panics on any other error).
pub fn path_of(err: WorldError) -> String {
    match err {
        WorldError::Validation { path, .. } => path,
        other => panic!("not a validation error: {other}"),
    }
}

/// A full run event: the draft's fields plus the envelope of `run_1` at `seq`.
pub fn ev(seq: u64, t: &str, fields: Value) -> Value {
    let mut v = draft(t, fields);
    v["runId"] = json!("run_1");
    v["sequenceNumber"] = json!(seq);
    v["timestamp"] = json!(format!("2026-05-21T10:{:02}:{:02}.000Z", seq / 60 % 60, seq % 60));
    v
}

/// A deterministic Fisher-Yates shuffle driven by a 64-bit LCG (Knuth's MMIX constants).
pub fn shuffled<T: Clone>(items: &[T], seed: u64) -> Vec<T> {
    let mut out = items.to_vec();
    let mut state = seed.wrapping_mul(2).wrapping_add(1);
    for i in (1..out.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = ((state >> 33) % (i as u64 + 1)) as usize;
        out.swap(i, j);
    }
    out
}
