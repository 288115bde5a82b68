//! Wall-clock timestamps in the one format the world records: ISO-8601 UTC with milliseconds.

use time::format_description::FormatItem;
use time::macros::format_description;
use time::OffsetDateTime;

const ISO_MS: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// Now, as `2026-05-21T10:00:00.000Z`.
pub fn now_iso() -> String {
    format_iso(OffsetDateTime::now_utc())
}

/// Format a UTC instant as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format_iso(t: OffsetDateTime) -> String {
    t.format(ISO_MS).expect("a UTC instant always formats")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_milliseconds() {
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_779_357_600_123_456_789).unwrap();
        assert_eq!(format_iso(t), "2026-05-21T10:00:00.123Z");
        let s = now_iso();
        assert_eq!(s.len(), 24);
        assert!(s.ends_with('Z'));
    }
}
