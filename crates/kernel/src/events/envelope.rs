//! The envelope's text: written by one piece of code that knows its layout ([`EnvelopeFields`],
//! which says where it wrote the event id, the digest and the payload), with placeholders for
//! what is known only at commit, filled in place.

use super::AppendRequest;
use crate::canonical;
use crate::ids;
use serde_json::{Map, Value};

/// Stands for an event id (`evt_` and 16 hex digits) in a prepared head.
pub(super) const EVENT_ID_PLACEHOLDER: &str = "evt_0000000000000000";

/// Stands for a request digest (`sha256:` and 64 hex digits) in a prepared head.
pub(super) const DIGEST_PLACEHOLDER: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Write `with` over `placeholder`, which `text` holds at `at`; both are ASCII of one length.
pub(super) fn fill_placeholder(text: &mut String, at: usize, placeholder: &str, with: &str) {
    assert!(
        with.is_ascii() && with.len() == placeholder.len() && text.get(at..at + with.len()) == Some(placeholder),
        "a placeholder is filled with what it stands for"
    );
    text.replace_range(at..at + with.len(), with);
}

/// A prepared append's envelope, up to its sequence: its text, where its event id and payload
/// are, its request digest (written in its place when keyed), and its event id's hash so far.
pub(super) struct Head {
    pub(super) text: String,
    pub(super) id_at: usize,
    pub(super) payload_at: usize,
    pub(super) digest: Option<String>,
    pub(super) id_prefix: sha2::Sha256,
}

impl Head {
    pub(super) fn write(req: &AppendRequest, payload: Map<String, Value>, capacity: usize) -> Head {
        let mut text = Vec::with_capacity(capacity);
        let layout = EnvelopeFields {
            event_id: EVENT_ID_PLACEHOLDER,
            run_id: &req.run_id,
            sequence: 0,
            event_type: &req.event_type,
            key: req.key.as_deref(),
            digest: req.key.as_ref().map(|_| DIGEST_PLACEHOLDER),
            recorded_at: "",
        }
        .write_head(&mut text);
        canonical::write_value(&Value::Object(payload), &mut text);
        // Only valid UTF-8 was written: string contents are copied whole from `&str`s.
        let mut head = String::from_utf8(text).expect("canonical JSON is UTF-8");
        let canonical = &head[layout.payload..];
        let digest = req
            .key
            .as_ref()
            .map(|_| ids::request_digest(&req.run_id, &req.event_type, canonical));
        let id_prefix = ids::event_id_prefix(&req.run_id, canonical);
        if let (Some(d), Some(at)) = (&digest, layout.digest) {
            fill_placeholder(&mut head, at, DIGEST_PLACEHOLDER, d);
        }
        Head {
            text: head,
            id_at: layout.event_id,
            payload_at: layout.payload,
            digest,
            id_prefix,
        }
    }
}

/// The sequence of a canonical envelope: its last `,"sequence":` (the type after it is a string
/// literal, whose quotes are escaped) is followed by it.
pub fn sequence_of(envelope: &str) -> Option<u64> {
    const FIELD: &str = ",\"sequence\":";
    let at = envelope.rfind(FIELD)? + FIELD.len();
    let digits = envelope[at..].split(',').next()?;
    digits.parse().ok()
}

/// Everything of an envelope but its payload. The canonical envelope is
/// `{[key,][digest,]"eventId":…,"payload":<payload>,"recordedAt":…,"runId":…,"sequence":…,"type":…}`
/// (its keys are ASCII, in sorted order); this writes the parts before and after the payload, for
/// building envelopes and for finding the payload inside a stored one.
#[derive(Debug, Clone, Copy)]
pub struct EnvelopeFields<'a> {
    pub event_id: &'a str,
    pub run_id: &'a str,
    pub sequence: u64,
    pub event_type: &'a str,
    pub key: Option<&'a str>,
    pub digest: Option<&'a str>,
    pub recorded_at: &'a str,
}

/// Where [`EnvelopeFields::write_head`] wrote what a prepared head fills in later: the byte offsets
/// in its output of the digest's and the event id's text (inside their quotes) and of the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLayout {
    pub digest: Option<usize>,
    pub event_id: usize,
    pub payload: usize,
}

impl EnvelopeFields<'_> {
    /// Append the envelope's text up to and including `"payload":`; returns where it put the
    /// digest, the event id and where the payload goes.
    pub fn write_head(&self, out: &mut Vec<u8>) -> HeadLayout {
        use canonical::write_str;
        // A string's text starts after its opening quote.
        let text_at = |out: &Vec<u8>| out.len() + 1;
        out.push(b'{');
        if let Some(k) = self.key {
            out.extend_from_slice(b"\"appendIdempotencyKey\":");
            write_str(k, out);
            out.push(b',');
        }
        let mut digest = None;
        if let Some(d) = self.digest {
            out.extend_from_slice(b"\"canonicalRequestDigest\":");
            digest = Some(text_at(out));
            write_str(d, out);
            out.push(b',');
        }
        out.extend_from_slice(b"\"eventId\":");
        let event_id = text_at(out);
        write_str(self.event_id, out);
        out.extend_from_slice(b",\"payload\":");
        HeadLayout {
            digest,
            event_id,
            payload: out.len(),
        }
    }

    /// Append the envelope's text after the payload, from `,"recordedAt":` to the closing brace.
    pub fn write_tail(&self, out: &mut Vec<u8>) {
        use canonical::write_str;
        out.extend_from_slice(b",\"recordedAt\":");
        write_str(self.recorded_at, out);
        out.extend_from_slice(b",\"runId\":");
        write_str(self.run_id, out);
        out.extend_from_slice(b",\"sequence\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.sequence).as_bytes());
        out.extend_from_slice(b",\"type\":");
        write_str(self.event_type, out);
        out.push(b'}');
    }

    /// [`EnvelopeFields::write_tail`] onto a finished head.
    pub fn finish(&self, envelope: &mut String) {
        let mut tail = Vec::with_capacity(64 + self.run_id.len() + self.event_type.len());
        self.write_tail(&mut tail);
        envelope.push_str(&String::from_utf8(tail).expect("canonical JSON is UTF-8"));
    }
}
