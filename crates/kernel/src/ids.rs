//! Identifiers and digests: run and session ids, event ids, request digests, artifact ids.
//!
//! Every id in the world is a prefix of a sha256 over canonical JSON, so the same facts always
//! get the same ids. The preimages are built directly as canonical text (their keys are ASCII and
//! written in sorted order) around already-canonical payloads, so nothing is serialized twice.

use crate::canonical::{string_literal, write_str};
use crate::error::{Result, WorldError};
use sha2::{Digest, Sha256};

/// Longest tail after `run_` / `ses_`.
pub const MAX_ID_TAIL: usize = 80;

/// Lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `sha256:<hex>` of `bytes`, the form manifests and digests use.
pub fn sha256_tagged(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

fn id_tail_ok(tail: &str) -> bool {
    !tail.is_empty()
        && tail.len() <= MAX_ID_TAIL
        && tail
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Check a run id: `run_` followed by 1–80 of `[A-Za-z0-9_-]`.
pub fn check_run_id(run_id: &str) -> Result<()> {
    match run_id.strip_prefix("run_") {
        Some(tail) if id_tail_ok(tail) => Ok(()),
        _ => Err(WorldError::Path {
            message: format!(
                "invalid run id {}: expected run_ followed by 1-{MAX_ID_TAIL} of [A-Za-z0-9_-]",
                shown(run_id)
            ),
        }),
    }
}

/// Check a session id: `ses_` followed by 1–80 of `[A-Za-z0-9_-]`.
pub fn check_session_id(session_id: &str) -> Result<()> {
    match session_id.strip_prefix("ses_") {
        Some(tail) if id_tail_ok(tail) => Ok(()),
        _ => Err(WorldError::Path {
            message: format!(
                "invalid session id {}: expected ses_ followed by 1-{MAX_ID_TAIL} of [A-Za-z0-9_-]",
                shown(session_id)
            ),
        }),
    }
}

/// Check a stream id, which is either a run id or a session id.
pub fn check_stream_id(stream_id: &str) -> Result<()> {
    if stream_id.starts_with("ses_") {
        check_session_id(stream_id)
    } else {
        check_run_id(stream_id)
    }
}

/// A bad id shown in an error: quoted, and cut short so a huge string cannot flood a message.
fn shown(id: &str) -> String {
    let cut: String = id.chars().take(100).collect();
    if cut.len() < id.len() {
        format!("{}…", string_literal(&cut))
    } else {
        string_literal(&cut)
    }
}

/// `evt_` + the first 16 hex of sha256(JCS({runId, sequence, type, payload})).
pub fn event_id(run_id: &str, sequence: u64, event_type: &str, canonical_payload: &str) -> String {
    event_id_finish(&event_id_prefix(run_id, canonical_payload), sequence, event_type)
}

/// The event-id hash with everything before the sequence absorbed: `{"payload":…,"runId":…,
/// "sequence":`. The payload comes first in the preimage, so it can be hashed before the
/// sequence is known, off the writer thread.
pub fn event_id_prefix(run_id: &str, canonical_payload: &str) -> Sha256 {
    let mut h = Sha256::new();
    h.update(b"{\"payload\":");
    h.update(canonical_payload.as_bytes());
    h.update(b",\"runId\":");
    let mut run = Vec::with_capacity(run_id.len() + 2);
    write_str(run_id, &mut run);
    h.update(&run);
    h.update(b",\"sequence\":");
    h
}

/// Finish an event id from its [`event_id_prefix`]: absorb the sequence and the type.
pub fn event_id_finish(prefix: &Sha256, sequence: u64, event_type: &str) -> String {
    let mut h = prefix.clone();
    h.update(itoa::Buffer::new().format(sequence).as_bytes());
    let mut tail = Vec::with_capacity(event_type.len() + 12);
    tail.extend_from_slice(b",\"type\":");
    write_str(event_type, &mut tail);
    tail.push(b'}');
    h.update(&tail);
    let digest = h.finalize();
    format!("evt_{}", hex::encode(&digest[..8]))
}

/// `sha256:` + hex(sha256(JCS({runId, type, payload}))).
pub fn request_digest(run_id: &str, event_type: &str, canonical_payload: &str) -> String {
    let mut pre = Vec::with_capacity(canonical_payload.len() + run_id.len() + event_type.len() + 32);
    pre.extend_from_slice(b"{\"payload\":");
    pre.extend_from_slice(canonical_payload.as_bytes());
    pre.extend_from_slice(b",\"runId\":");
    write_str(run_id, &mut pre);
    pre.extend_from_slice(b",\"type\":");
    write_str(event_type, &mut pre);
    pre.push(b'}');
    sha256_tagged(&pre)
}

/// Whether `s` is exactly an artifact reference: `artifact://art_` + 16 lower-case hex digits.
pub fn is_artifact_ref(s: &str) -> bool {
    s.strip_prefix("artifact://").is_some_and(is_artifact_id)
}

/// Whether `s` is an artifact id: `art_` + 16 lower-case hex digits.
pub fn is_artifact_id(s: &str) -> bool {
    s.strip_prefix("art_")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical;
    use serde_json::json;

    #[test]
    fn run_ids() {
        assert!(check_run_id("run_a").is_ok());
        assert!(check_run_id(&format!("run_{}", "x".repeat(80))).is_ok());
        for bad in [
            "run_",
            "run",
            "",
            "run_a/b",
            "run_..",
            &format!("run_{}", "x".repeat(81)),
            "RUN_a",
            "run_é",
        ] {
            let err = check_run_id(bad).unwrap_err();
            assert_eq!(err.code(), "WORLD_PATH", "{bad}");
        }
        assert!(check_session_id("ses_1").is_ok());
        assert!(check_session_id("run_1").is_err());
    }

    #[test]
    fn event_id_is_sha256_of_the_canonical_preimage() {
        let payload = json!({"b": [1, 2.5, "x"], "a": null});
        let canon = canonical::to_string(&payload);
        let pre = json!({"runId": "run_a", "sequence": 7, "type": "StepStarted", "payload": payload});
        let want = format!("evt_{}", &sha256_hex(canonical::to_string(&pre).as_bytes())[..16]);
        assert_eq!(event_id("run_a", 7, "StepStarted", &canon), want);

        let pre = json!({"runId": "run_a", "type": "StepStarted", "payload": payload});
        let want = format!("sha256:{}", sha256_hex(canonical::to_string(&pre).as_bytes()));
        assert_eq!(request_digest("run_a", "StepStarted", &canon), want);
    }
}
