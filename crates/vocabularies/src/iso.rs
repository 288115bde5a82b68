//! The two string formats the vocabularies pin down: ISO-8601 instants and UUIDs.
//!
//! The run events stamp times as ISO 8601 (`startedAt`, `deadlineAt`, the envelope's `timestamp`)
//! and names `run:started.workflowId` a UUID. An instant is accepted in the form the sister engine
//! writes and reads back (`z.string().datetime({ offset: true })`):
//! `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, with a real calendar date; `time` parses it as RFC
//! 3339, which also allows what that form does not (another separator than `T`, a lower-case `z`,
//! a leap second), so those are refused first.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// An instant as seconds since 1970-01-01T00:00:00Z plus nanoseconds, so two instants written
/// with different offsets compare correctly (never lexically).
pub type Instant = (i64, u32);

/// Parse an ISO-8601 date-time with a `Z` or `±HH:MM` offset; `None` when it is not one.
pub fn parse_instant(s: &str) -> Option<Instant> {
    let b = s.as_bytes();
    if b.get(10) != Some(&b'T') || s.ends_with('z') || s.get(17..19) == Some("60") {
        return None;
    }
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    Some((t.unix_timestamp(), t.nanosecond()))
}

/// Whether `s` is an ISO-8601 date-time (see [`parse_instant`]).
pub fn is_instant(s: &str) -> bool {
    parse_instant(s).is_some()
}

/// Whether `s` is a UUID in its canonical 8-4-4-4-12 hex form (either case).
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants() {
        assert_eq!(parse_instant("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(parse_instant("1970-01-01T01:00:00+01:00"), Some((0, 0)));
        assert_eq!(
            parse_instant("2026-05-21T10:00:00.123Z").map(|i| i.1),
            Some(123_000_000)
        );
        assert!(is_instant("2024-02-29T23:59:59.999999999-07:30"));
        assert!(parse_instant("2026-05-21T10:00:00Z") > parse_instant("2026-05-21T11:59:00+02:00"));
        for bad in [
            "",
            "2026-05-21",
            "2026-05-21 10:00:00Z",
            "2026-05-21T10:00:00",
            "2026-05-21T10:00Z",
            "2026-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-05-21T24:00:00Z",
            "2026-05-21T10:00:00.Z",
            "2026-05-21T10:00:00+0100",
            "2026-05-21T10:00:00Zjunk",
            "2026-05-21t10:00:00Z",
            "2026-05-21T10:00:00z",
            "2026-06-30T23:59:60Z",
            "2026-05-21T10:00:00+24:00",
            "yesterday at noon, roughly",
        ] {
            assert!(!is_instant(bad), "{bad}");
        }
    }

    #[test]
    fn uuids() {
        assert!(is_uuid("3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b"));
        assert!(is_uuid("3F2B8C1E-9A4D-4E6F-8B2A-1C3D5E7F9A0B"));
        assert!(!is_uuid("wf_research"));
        assert!(!is_uuid("3f2b8c1e9a4d4e6f8b2a1c3d5e7f9a0b"));
        assert!(!is_uuid("3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0g"));
    }
}
