//! The two string formats the run-event vocabulary pins down: ISO-8601 instants and UUIDs.
//!
//! The run events stamp times as ISO 8601 (`startedAt`, `deadlineAt`, the envelope's `timestamp`)
//! and names `run:started.workflowId` a UUID. No parsing crate is in the tree (`time` is built
//! without its parsing feature), so these are small hand-written matchers. An instant is accepted
//! in the form the sister engine writes and reads back (`z.string().datetime({ offset: true })`):
//! `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, with a real calendar date.

/// An instant as seconds since 1970-01-01T00:00:00Z plus nanoseconds, so two instants written
/// with different offsets compare correctly (never lexically).
pub type Instant = (i64, u32);

/// Parse an ISO-8601 date-time with a `Z` or `±HH:MM` offset; `None` when it is not one.
pub fn parse_instant(s: &str) -> Option<Instant> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let year = digits(&b[0..4])?;
    let month = digits(&b[5..7])?;
    let day = digits(&b[8..10])?;
    let hour = digits(&b[11..13])?;
    let minute = digits(&b[14..16])?;
    let second = digits(&b[17..19])?;
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut rest = &b[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        for (i, d) in frac[..n].iter().take(9).enumerate() {
            nanos += u32::from(d - b'0') * 10u32.pow(8 - i as u32);
        }
        rest = &frac[n..];
    }
    let offset_secs = match rest {
        [b'Z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let h = digits(&[*h1, *h2])?;
            let m = digits(&[*m1, *m2])?;
            if h > 23 || m > 59 {
                return None;
            }
            let secs = i64::from(h * 3600 + m * 60);
            if *sign == b'+' {
                secs
            } else {
                -secs
            }
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(year), month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset_secs;
    Some((secs, nanos))
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

fn digits(b: &[u8]) -> Option<u32> {
    b.iter().try_fold(0u32, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
