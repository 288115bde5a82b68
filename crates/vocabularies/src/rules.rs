//! The rule language every vocabulary's shapes are written in.
//!
//! A shape is a table of fields, each a dotted name (`tokensUsed.input`, `response.usage`) with a
//! rule and whether it must be present. A nested field is only checked when its parent object is
//! present (an optional `error` with a required `error.code`); a shape that needs the parent lists
//! it, as an `Object`, before its fields. Errors name the field from the root they are given
//! (`payload.stepPath`, `event.patches[0].uri`). A vocabulary's cross-field refinements run after
//! its fields have checked out, so they can trust the types.

use crate::iso;
use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::ids::is_artifact_ref;
use little_world_kernel::json_path::dotted;
use little_world_kernel::numbers::is_count;
use serde_json::{Map, Value};

/// What a field must hold.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// Any JSON value (only its presence is required).
    Any,
    /// A string, possibly empty (free text: messages, tokens, diffs).
    Str,
    /// A non-empty string (identifiers: node ids, models, gate ids).
    NonEmpty,
    /// `true` or `false`.
    Bool,
    /// An object (a record of anything).
    Object,
    /// An array (of anything).
    Array,
    /// A non-negative safe integer (micro-cents, token counts, milliseconds).
    Count,
    /// A positive safe integer (1-based attempt numbers, a positive estimate).
    Positive,
    /// An integer percentage, 0 to 100.
    Pct,
    /// A finite non-negative number (a billed volume such as seconds of audio).
    Number,
    /// An ISO-8601 date-time with a `Z` or `±HH:MM` offset.
    Instant,
    /// A UUID.
    Uuid,
    /// An error envelope: an object with at least a string `message`.
    Error,
    /// An artifact reference string (`artifact://art_` and 16 hex digits).
    ArtifactRef,
    /// A string or a number (a branch's name or index).
    Label,
    /// One of a closed set of strings.
    OneOf(&'static [&'static str]),
    /// An array of at least `min` non-empty strings.
    Ids(usize),
    /// An array of at least `min` objects, each checked against `fields`.
    Records(&'static [Field], usize),
}

/// A field of a shape: a dotted name (`error.code`), its rule, and whether it must be present.
#[derive(Debug)]
pub struct Field {
    pub name: &'static str,
    pub rule: Rule,
    pub required: bool,
}

/// A field that must be present.
pub const fn req(name: &'static str, rule: Rule) -> Field {
    Field {
        name,
        rule,
        required: true,
    }
}

/// A field that may be absent.
pub const fn opt(name: &'static str, rule: Rule) -> Field {
    Field {
        name,
        rule,
        required: false,
    }
}

/// Where a dotted name leads in an object.
enum Found<'v> {
    Value(&'v Value),
    Missing,
    /// An enclosing object is absent (its own field decides whether that is allowed).
    NoParent,
}

fn lookup<'v>(map: &'v Map<String, Value>, name: &str) -> Found<'v> {
    let mut parts = name.split('.');
    let mut cur = map;
    let mut part = parts.next().unwrap_or_default();
    for next in parts {
        match cur.get(part).and_then(Value::as_object) {
            Some(obj) => cur = obj,
            None => return Found::NoParent,
        }
        part = next;
    }
    cur.get(part).map_or(Found::Missing, Found::Value)
}

/// Check `fields` of `map`, reporting paths under `root` (`event`, `event.patches[0]`).
pub fn check_fields(t: &str, map: &Map<String, Value>, fields: &[Field], root: &str) -> Result<()> {
    for field in fields {
        match lookup(map, field.name) {
            Found::Value(v) => check(field.rule, v, &dotted(root, field.name), t)?,
            Found::Missing if field.required => {
                return Err(WorldError::validation(
                    dotted(root, field.name),
                    format!("{t} requires {}", describe(field.rule)),
                ))
            }
            Found::Missing | Found::NoParent => {}
        }
    }
    Ok(())
}

/// Check one value against `rule`, reporting `path`.
pub fn check(rule: Rule, v: &Value, path: &str, t: &str) -> Result<()> {
    let ok = match rule {
        Rule::Any => true,
        Rule::Str => v.is_string(),
        Rule::NonEmpty => v.as_str().is_some_and(|s| !s.is_empty()),
        Rule::Bool => v.is_boolean(),
        Rule::Object => v.is_object(),
        Rule::Array => v.is_array(),
        Rule::Count => is_count(v),
        Rule::Positive => is_count(v) && v.as_f64() != Some(0.0),
        Rule::Pct => is_count(v) && v.as_f64().is_some_and(|f| f <= 100.0),
        Rule::Number => v.as_f64().is_some_and(|f| f.is_finite() && f >= 0.0),
        Rule::Instant => v.as_str().is_some_and(iso::is_instant),
        Rule::Uuid => v.as_str().is_some_and(iso::is_uuid),
        Rule::Error => v.get("message").is_some_and(Value::is_string),
        Rule::ArtifactRef => v.as_str().is_some_and(is_artifact_ref),
        Rule::Label => v.is_string() || v.is_number(),
        Rule::OneOf(set) => v.as_str().is_some_and(|s| set.contains(&s)),
        Rule::Ids(min) | Rule::Records(_, min) => match v.as_array() {
            Some(items) if items.len() >= min => return check_items(rule, items, path, t),
            _ => false,
        },
    };
    if ok {
        Ok(())
    } else {
        Err(WorldError::validation(path, format!("must be {}", describe(rule))))
    }
}

fn check_items(rule: Rule, items: &[Value], path: &str, t: &str) -> Result<()> {
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match rule {
            Rule::Records(fields, _) => match item.as_object() {
                Some(obj) => check_fields(t, obj, fields, &at)?,
                None => return Err(WorldError::validation(at, "must be an object")),
            },
            _ => check(Rule::NonEmpty, item, &at, t)?,
        }
    }
    Ok(())
}

fn describe(rule: Rule) -> String {
    match rule {
        Rule::Any => "a value".into(),
        Rule::Str => "a string".into(),
        Rule::NonEmpty => "a non-empty string".into(),
        Rule::Bool => "a boolean".into(),
        Rule::Object => "an object".into(),
        Rule::Array => "an array".into(),
        Rule::Count => "a non-negative safe integer".into(),
        Rule::Positive => "a positive safe integer".into(),
        Rule::Pct => "an integer from 0 to 100".into(),
        Rule::Number => "a finite non-negative number".into(),
        Rule::Instant => "an ISO-8601 date-time with an offset (2026-05-21T10:00:00Z)".into(),
        Rule::Uuid => "a UUID".into(),
        Rule::Error => "an error object with a string message".into(),
        Rule::ArtifactRef => "an artifact reference (artifact://art_ + 16 hex)".into(),
        Rule::Label => "a string or a number".into(),
        Rule::OneOf(set) => format!("one of {}", set.join(", ")),
        Rule::Ids(0) => "an array of non-empty strings".into(),
        Rule::Ids(min) => format!("an array of at least {min} non-empty string(s)"),
        Rule::Records(_, 0) => "an array of objects".into(),
        Rule::Records(_, min) => format!("an array of at least {min} object(s)"),
    }
}

/// A safe integer field already checked by its rule, however it was written (`5` or `5.0`).
pub fn count(map: &Map<String, Value>, field: &str) -> Option<u64> {
    map.get(field).and_then(as_count)
}

/// A non-negative safe integer as `u64`, also when JSON wrote it with a fraction of zero.
pub fn as_count(v: &Value) -> Option<u64> {
    is_count(v).then(|| v.as_u64().unwrap_or_else(|| v.as_f64().unwrap_or_default() as u64))
}

/// [`count`], 0 when absent.
pub fn int(map: &Map<String, Value>, field: &str) -> u64 {
    count(map, field).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    static INNER: &[Field] = &[req("uri", Rule::NonEmpty), req("unifiedDiff", Rule::Str)];
    static FIELDS: &[Field] = &[
        opt("error", Rule::Object),
        req("error.code", Rule::OneOf(&["a", "b"])),
        req("patches", Rule::Records(INNER, 1)),
        opt("ids", Rule::Ids(0)),
    ];

    fn path_of(v: Value) -> String {
        let err = check_fields("x:y", v.as_object().unwrap(), FIELDS, "event").unwrap_err();
        err.details()["path"].as_str().unwrap().to_string()
    }

    #[test]
    fn nested_and_array_paths() {
        let ok = json!({ "patches": [{ "uri": "a", "unifiedDiff": "" }] });
        assert!(check_fields("x:y", ok.as_object().unwrap(), FIELDS, "event").is_ok());
        // The optional parent is absent, so its required child is not asked for.
        assert_eq!(path_of(json!({ "error": {}, "patches": [] })), "event.error.code");
        assert_eq!(path_of(json!({ "patches": [] })), "event.patches");
        assert_eq!(path_of(json!({ "patches": [{ "uri": "" }] })), "event.patches[0].uri");
        assert_eq!(
            path_of(json!({ "patches": [{ "uri": "a" }] })),
            "event.patches[0].unifiedDiff"
        );
        assert_eq!(path_of(json!({ "patches": [7] })), "event.patches[0]");
        let ids = json!({ "patches": [{ "uri": "a", "unifiedDiff": "" }], "ids": ["a", ""] });
        assert_eq!(path_of(ids), "event.ids[1]");
    }

    #[test]
    fn numbers() {
        let c = |r: Rule, v: Value| check(r, &v, "event.x", "x:y").is_ok();
        assert!(c(Rule::Count, json!(0)) && !c(Rule::Count, json!(-1)) && !c(Rule::Count, json!(1.5)));
        assert!(!c(Rule::Count, json!(9_007_199_254_740_992u64)));
        assert!(c(Rule::Count, json!(9_007_199_254_740_991u64)));
        assert!(!c(Rule::Positive, json!(0)) && c(Rule::Positive, json!(1)));
        assert!(c(Rule::Pct, json!(100)) && !c(Rule::Pct, json!(101)) && !c(Rule::Pct, json!(50.5)));
        assert!(c(Rule::Number, json!(2.5)) && !c(Rule::Number, json!(-0.5)) && !c(Rule::Number, json!("1")));
        assert_eq!(as_count(&json!(5000.0)), Some(5000));
        assert_eq!(as_count(&json!(9_007_199_254_740_991u64)), Some(9_007_199_254_740_991));
        assert_eq!(as_count(&json!(-1)), None);
    }
}
