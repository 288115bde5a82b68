//! Free functions: pure computations exposed synchronously.

use super::throw;
use crate::core::error::WorldError;
use crate::core::{canonical, events::shape};
use napi::Env;
use napi_derive::napi;

/// RFC 8785 canonical JSON of a JSON text.
#[napi(js_name = "canonicalizeJson")]
pub fn canonicalize_json(env: Env, json: String) -> napi::Result<String> {
    canonical::canonicalize_text(&json).map_err(|e| throw(&env, &WorldError::validation("value", e.to_string())))
}

/// Check a JSON array of envelopes: one run, dense sequences from 1, ids that match their content.
#[napi(js_name = "validateEventLogShapeJson")]
pub fn validate_event_log_shape_json(env: Env, events_json: String) -> napi::Result<()> {
    shape::check_log_text(&events_json).map_err(|e| throw(&env, &e))
}
