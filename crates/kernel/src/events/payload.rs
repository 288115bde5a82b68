//! A payload's text made a map, with the strings sent beside it put back; the rules every
//! payload shares (no `costUsd` in a usage object, every artifact reference present); and a large
//! value moved out into an artifact.

use super::{Artifacts, Spill, INLINE_LIMIT};
use crate::canonical;
use crate::error::{Result, WorldError};
use crate::ids;
use crate::json_path::{JsonPath, Seg};
use crate::vocabulary::Spillable;
use serde_json::{Map, Value};

/// Parse a payload's JSON text; it must be an object.
pub fn parse_payload(text: &str) -> Result<Map<String, Value>> {
    match canonical::parse(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(WorldError::validation("payload", "must be a JSON object")),
        Err(e) => Err(WorldError::validation("payload", e.to_string())),
    }
}

/// Put the strings sent beside a payload's JSON text in the places of their placeholders; each
/// must be used exactly once.
pub fn put_strings_back(payload: &mut Map<String, Value>, strings: Vec<String>) -> Result<()> {
    fn walk(v: &mut Value, strings: &mut [Option<String>]) -> std::result::Result<(), String> {
        match v {
            Value::String(s) if s.starts_with('\0') => {
                let slot = s[1..].parse::<usize>().ok().and_then(|i| strings.get_mut(i));
                *s = slot
                    .and_then(Option::take)
                    .ok_or_else(|| format!("{s:?} names no unused string sent beside the payload"))?;
                Ok(())
            }
            Value::Array(items) => items.iter_mut().try_for_each(|item| walk(item, strings)),
            Value::Object(map) => map.values_mut().try_for_each(|item| walk(item, strings)),
            _ => Ok(()),
        }
    }
    let mut slots: Vec<Option<String>> = strings.into_iter().map(Some).collect();
    payload
        .values_mut()
        .try_for_each(|v| walk(v, &mut slots))
        .and_then(|()| match slots.iter().position(Option::is_some) {
            Some(i) => Err(format!("string {i} sent beside the payload has no placeholder")),
            None => Ok(()),
        })
        .map_err(|reason| WorldError::RuntimeIntegrity {
            reason: format!("internal error: the binding sent a malformed payload: {reason}"),
        })
}

/// The payload rules every type shares.
pub fn check_payload(payload: &Map<String, Value>, artifacts: &dyn Artifacts) -> Result<()> {
    let mut path = JsonPath::new("payload");
    scan_object(payload, &mut path, artifacts)
}

/// Walk the payload: refuse `costUsd` in any usage object, and check every artifact reference.
pub(super) fn scan<'v>(v: &'v Value, path: &mut JsonPath<'v>, artifacts: &dyn Artifacts) -> Result<()> {
    match v {
        Value::String(s) if ids::is_artifact_ref(s) => {
            let id = &s["artifact://".len()..];
            if !artifacts.artifact_exists(id)? {
                return Err(WorldError::ArtifactNotFound {
                    artifact_id: id.to_string(),
                    run_id: None,
                    path: Some(path.render()),
                });
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Seg::Index(i));
                scan(item, path, artifacts)?;
                path.pop();
            }
            Ok(())
        }
        Value::Object(map) => scan_object(map, path, artifacts),
        _ => Ok(()),
    }
}

fn scan_object<'v>(map: &'v Map<String, Value>, path: &mut JsonPath<'v>, artifacts: &dyn Artifacts) -> Result<()> {
    for (k, v) in map {
        path.push(Seg::Key(k));
        if k == "usage" {
            if let Some(usage) = v.as_object() {
                if usage.contains_key("costUsd") {
                    return Err(WorldError::validation(
                        path.render_with("costUsd"),
                        "events are token-only: a usage object may not carry costUsd (cost is computed at materialization)",
                    ));
                }
            }
        }
        scan(v, path, artifacts)?;
        path.pop();
    }
    Ok(())
}

/// Put a reference to a `json` artifact in the place of a large output, args or result; the
/// artifact itself is stored by the writer (see [`PreparedAppend::spill`]).
pub(super) fn offload_large_values(
    spillable: Spillable,
    payload: &mut Map<String, Value>,
    run_id: &str,
    artifacts: &dyn Artifacts,
) -> Option<Spill> {
    let (field, ref_field, step_path) = (spillable.field, spillable.reference, spillable.step_path);
    // A payload with both the value and its reference is refused (and only a refused one has
    // both): moving the value would overwrite the reference it gave, and could make its digest
    // that of another request.
    if payload.contains_key(ref_field) {
        return None;
    }
    let value = payload.get(field)?;
    let text = canonical::to_string(value);
    if text.len() < INLINE_LIMIT {
        return None;
    }
    let artifact_id = artifacts.json_id(run_id, &step_path, field, &text);
    payload.remove(field);
    payload.insert(
        ref_field.to_string(),
        Value::String(format!("artifact://{artifact_id}")),
    );
    Some(Spill {
        step_path,
        name: field,
        text,
        artifact_id,
    })
}
