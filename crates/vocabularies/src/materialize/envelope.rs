//! The envelope and payload fields the fold reads, borrowed from a stored envelope's text.

use little_world_kernel::canonical;
use little_world_kernel::error::{Result, WorldError};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

#[derive(Deserialize)]
pub(super) struct Envelope<'a> {
    #[serde(rename = "eventId", borrow)]
    pub(super) event_id: Cow<'a, str>,
    #[serde(rename = "runId", borrow)]
    pub(super) run_id: Cow<'a, str>,
    pub(super) sequence: u64,
    #[serde(rename = "type", borrow)]
    pub(super) event_type: Cow<'a, str>,
    #[serde(rename = "recordedAt", borrow)]
    pub(super) recorded_at: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) payload: &'a RawValue,
}

/// Every payload field the fold reads, from any known type; absent fields are `None`. Every type
/// allows extra fields, so a name one type reads may hold anything on another (a `model` string on
/// a `StepStarted`): [`Fold::apply`] then reads the payload without such fields (see
/// [`without_extra_mistyped`]), as if they were absent. A field of the type's own shape that does
/// not read is a broken payload, as before.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct Fields<'a> {
    #[serde(borrow)]
    pub(super) step_path: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) step_kind: Option<Cow<'a, str>>,
    #[serde(borrow, deserialize_with = "present")]
    pub(super) output: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) output_ref: Option<Cow<'a, str>>,
    #[serde(borrow, deserialize_with = "present")]
    pub(super) error: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) workflow_version_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) group_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) role: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) run_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) manifest: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) manifest_hash: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) model: Option<ModelField<'a>>,
    pub(super) response: Option<ResponseField>,
    #[serde(borrow)]
    pub(super) outer_loop_id: Option<Cow<'a, str>>,
    pub(super) cycle_number: Option<u64>,
    #[serde(borrow)]
    pub(super) supervise: Option<Supervise<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ModelField<'a> {
    #[serde(borrow)]
    pub(super) provider: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) model_id: Cow<'a, str>,
}

#[derive(Deserialize)]
pub(super) struct ResponseField {
    #[serde(default)]
    pub(super) usage: Option<UsageField>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct UsageField {
    pub(super) input_tokens: u64,
    pub(super) output_tokens: u64,
    #[serde(default)]
    pub(super) cached_input_tokens: u64,
    #[serde(default)]
    pub(super) reasoning_tokens: u64,
}

#[derive(Deserialize)]
pub(super) struct Supervise<'a> {
    #[serde(borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(rename = "finalOutput", borrow, default, deserialize_with = "present")]
    pub(super) final_output: Option<&'a RawValue>,
}

/// The payload `text` of an event of type `t` without the extra fields [`Fields`] cannot read as
/// the type it reads them as; or why the payload is broken: it is not an object, or a field of
/// `t`'s own shape does not read. Only for a payload that did not read whole: that is rare, and
/// reading each field on its own costs twice what reading the payload does. A reason never quotes
/// a value (a payload may hold secrets).
pub(super) fn without_extra_mistyped(t: &str, text: &str) -> std::result::Result<String, String> {
    let fields = serde_json::from_str::<PayloadFields<'_>>(text)
        .map_err(|_| format!("the {t} payload is not a JSON object"))?
        .0;
    let mut kept = Vec::with_capacity(fields.len());
    for (name, value) in fields {
        let field = format!("{{{}:{}}}", canonical::string_literal(&name), value.get());
        if serde_json::from_str::<Fields<'_>>(&field).is_ok() {
            kept.push(field[1..field.len() - 1].to_string());
        } else if crate::log_types::declares(t, &name) {
            return Err(format!("the {t} payload's {name} is not what a {t} carries there"));
        }
    }
    Ok(format!("{{{}}}", kept.join(",")))
}

/// The fields of a JSON object, in order, each value as it is written.
pub(super) struct PayloadFields<'a>(pub(super) Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for PayloadFields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = PayloadFields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    out.push(entry);
                }
                Ok(PayloadFields(out))
            }
        }
        d.deserialize_map(Fields)
    }
}

/// A field that is present, even as `null` (serde would read a `null` as absent).
pub(super) fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<&'de RawValue>, D::Error> {
    <&RawValue as Deserialize>::deserialize(d).map(Some)
}

pub(super) fn boxed(raw: &RawValue) -> Box<RawValue> {
    raw.to_owned()
}

/// The envelope of the `sequence`th event of `run_id`, or why it is corrupt.
pub(super) fn parse_envelope<'a>(run_id: &str, sequence: u64, text: &'a str) -> Result<Envelope<'a>> {
    serde_json::from_str(text).map_err(|e| WorldError::EventLogCorrupt {
        run_id: Some(run_id.to_string()),
        sequence: Some(sequence),
        reason: format!("envelope does not parse: {e}"),
    })
}
