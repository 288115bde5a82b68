//! Free functions: pure computations exposed synchronously.

use crate::{guarded, throw};
use little_world_kernel::error::WorldError;
use little_world_kernel::{canonical, events::shape, ids};
use little_world_vocabularies::materialize::{self, pricing, pricing::Pricing};
use little_world_vocabularies::run_events;
use napi::Env;
use napi_derive::napi;

/// RFC 8785 canonical JSON of a JSON text.
#[napi(js_name = "canonicalizeJson")]
pub fn canonicalize_json(env: Env, json: String) -> napi::Result<String> {
    guarded(|| canonical::canonicalize_text(&json).map_err(|e| WorldError::validation("value", e.to_string())))
        .map_err(|e| throw(&env, &e))
}

/// Check a JSON array of envelopes: one run, dense sequences from 1, ids that match their content.
#[napi(js_name = "validateEventLogShapeJson")]
pub fn validate_event_log_shape_json(env: Env, events_json: String) -> napi::Result<()> {
    guarded(|| shape::check_log_text(&events_json)).map_err(|e| throw(&env, &e))
}

/// Fold a JSON array of one run's envelopes into its state (canonical JSON), pricing calls with
/// the bundled registry and `pricingJson` merged over it.
#[napi(js_name = "materializeEventsJson")]
pub fn materialize_events_json(
    env: Env,
    run_id: String,
    events_json: String,
    pricing_json: Option<String>,
) -> napi::Result<String> {
    guarded(|| {
        Pricing::with_override(pricing_json.as_deref())
            .and_then(|p| materialize::fold_events_json(&run_id, &events_json, &p))
    })
    .map_err(|e| throw(&env, &e))
}

/// The bundled pricing registry's JSON text.
#[napi(js_name = "bundledPricingJson")]
pub fn bundled_pricing_json() -> &'static str {
    pricing::BUNDLED_JSON
}

/// The run-event cost restore over a JSON array of run events.
#[napi(js_name = "restoreRunCostsJson")]
pub fn restore_run_costs_json(env: Env, events_json: String) -> napi::Result<String> {
    guarded(|| {
        parse_events(&events_json)
            .and_then(|events| run_events::restore_costs(&events))
            .map(|c| c.to_json().to_string())
    })
    .map_err(|e| throw(&env, &e))
}

/// The run-event fold over a JSON array of run events; the state as canonical JSON.
#[napi(js_name = "foldRunEventsJson")]
pub fn fold_run_events_json(env: Env, events_json: String) -> napi::Result<String> {
    guarded(|| {
        parse_events(&events_json)
            .and_then(|events| run_events::fold(&events))
            .map(|state| canonical::to_string(&state))
    })
    .map_err(|e| throw(&env, &e))
}

/// Refuse an id that is not of `kind`: `run` (`run_` + 1-80 of `[A-Za-z0-9_-]`), `session`
/// (`ses_` + the same), `stream` (either) or `outer-loop` (1-128 of `[A-Za-z0-9_-]`).
#[napi(js_name = "checkId")]
pub fn check_id(env: Env, kind: String, id: String) -> napi::Result<()> {
    guarded(|| match kind.as_str() {
        "run" => ids::check_run_id(&id),
        "session" => ids::check_session_id(&id),
        "stream" => ids::check_stream_id(&id),
        "outer-loop" => little_world_kernel::outer_loop::check_outer_loop_id(&id),
        other => Err(WorldError::validation("kind", format!("is not a kind of id: {other}"))),
    })
    .map_err(|e| throw(&env, &e))
}

/// The types each vocabulary knows, as JSON: `{"events": [...], "runEvents": [...],
/// "sessionEvents": [...]}` (the event log's own types, and the run events a run or a session
/// holds).
#[napi(js_name = "knownEventTypesJson")]
pub fn known_event_types_json() -> String {
    serde_json::json!({
        "events": little_world_vocabularies::log_types::known_types(),
        "runEvents": run_events::known_types(run_events::Stream::Run),
        "sessionEvents": run_events::known_types(run_events::Stream::Session),
    })
    .to_string()
}

/// Whether a string looks like a credential that run events refuse (so that no message echoes it).
#[napi(js_name = "looksLikeCredential")]
pub fn looks_like_credential(s: String) -> bool {
    run_events::looks_like_credential(&s)
}

fn parse_events(text: &str) -> little_world_kernel::error::Result<Vec<serde_json::Value>> {
    // A list of run events, each as deep as its payload: one level more than a payload.
    match canonical::parse_around(text, 1) {
        Ok(serde_json::Value::Array(events)) => Ok(events),
        Ok(_) => Err(WorldError::validation("events", "must be an array of run events")),
        Err(e) => Err(WorldError::validation("events", e.to_string())),
    }
}

/// Which loaded copy of this library (and of the SQLite built into it) answers: the address of
/// one of its statics, the same for every `require` of one file and different for another copy.
/// Two copies in one process cannot see each other's SQLite locks (POSIX locks are per process,
/// and SQLite shares them only among its own connections), so `world.ts` refuses to open a data
/// directory through one copy while another has it open.
#[napi(js_name = "addonInstanceId")]
pub fn addon_instance_id() -> String {
    static ME: u8 = 0;
    format!("{}:{:p}", std::process::id(), &ME)
}
