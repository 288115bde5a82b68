//! RFC 8785 (JCS) canonical JSON.
//!
//! Owns the byte form of every payload, envelope and id preimage in the world: object keys sorted
//! by UTF-16 code units, no whitespace, numbers written exactly as JavaScript's `String(number)`
//! writes them (via `ryu-js`), strings escaped per the RFC.
//!
//! `serde_json_canonicalizer` passes the RFC vectors too and is kept as a test oracle, but it
//! re-parses every key and allocates a buffer per property; this writer runs on the append hot
//! path, so it walks a `serde_json::Value` once into one buffer.
//!
//! Parsing goes through [`parse`], which bounds nesting at [`MAX_DEPTH`] before serde recurses, so
//! a hostile input cannot overflow a thread's stack.

use serde_json::{Map, Number, Value};
use std::cmp::Ordering;

/// Deepest nesting of arrays and objects a payload may have.
pub const MAX_DEPTH: usize = 1000;

/// Why a JSON text was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Not JSON, or not representable (a number out of range, a lone surrogate).
    Invalid(String),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::TooDeep => write!(f, "is nested deeper than {MAX_DEPTH} levels"),
            ParseError::Invalid(why) => write!(f, "is not JSON that can be stored exactly ({why})"),
        }
    }
}

/// Parse JSON text into a value, refusing nesting deeper than [`MAX_DEPTH`].
pub fn parse(text: &str) -> Result<Value, ParseError> {
    parse_around(text, 0)
}

/// [`parse`] for a text that wraps values of up to [`MAX_DEPTH`] levels in `around` levels more:
/// a stored envelope around its payload (1), a list of envelopes (2), a materialized state around
/// a step's output (3).
pub fn parse_around(text: &str, around: usize) -> Result<Value, ParseError> {
    check_depth(text, around)?;
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let value = serde::Deserialize::deserialize(&mut de).map_err(|e| ParseError::Invalid(e.to_string()))?;
    de.end().map_err(|e| ParseError::Invalid(e.to_string()))?;
    Ok(value)
}

/// Maximum bracket nesting of a JSON text, ignoring brackets inside strings. Inside a string it
/// jumps from quote or backslash to the next with `memchr`, so long strings cost little.
/// Refuse `text` (as [`parse_around`] would) if it nests deeper than [`MAX_DEPTH`] + `around`,
/// without parsing it.
pub fn check_depth(text: &str, around: usize) -> Result<(), ParseError> {
    match nesting_depth(text.as_bytes()) > MAX_DEPTH + around {
        true => Err(ParseError::TooDeep),
        false => Ok(()),
    }
}

fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // Find the closing quote, stepping over escapes.
                i += 1;
                loop {
                    // Unterminated (also by an escape at the very end): the parser will say so.
                    match memchr::memchr2(b'"', b'\\', bytes.get(i..).unwrap_or_default()) {
                        None => return max,
                        Some(j) if bytes[i + j] == b'\\' => i += j + 2,
                        Some(j) => {
                            i += j + 1;
                            break;
                        }
                    }
                }
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    max
}

/// The canonical JSON text of `value`.
pub fn to_string(value: &Value) -> String {
    let mut out = Vec::with_capacity(128);
    write_value(value, &mut out);
    // Only valid UTF-8 was written: string contents are copied whole from `&str`s.
    String::from_utf8(out).expect("canonical JSON is UTF-8")
}

/// Append the canonical JSON of `value` to `out`.
pub fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(map, out),
    }
}

fn write_object(map: &Map<String, Value>, out: &mut Vec<u8>) {
    // serde_json's map iterates in UTF-8 byte order, which is code point order. That equals UTF-16
    // code unit order unless a key holds a character at or above U+E000 (UTF-8 lead byte 0xEE or
    // higher), where a supplementary character (a surrogate pair in UTF-16) sorts before U+E000..U+FFFF.
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    if entries.iter().any(|(k, _)| k.bytes().any(|b| b >= 0xEE)) {
        entries.sort_by(|a, b| cmp_utf16(a.0, b.0));
    }
    out.push(b'{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(k, out);
        out.push(b':');
        write_value(v, out);
    }
    out.push(b'}');
}

/// Compare two strings by their UTF-16 code units, as JavaScript sorts them.
pub fn cmp_utf16(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// Write a number as JavaScript's `String(number)` does; `-0` is written `0`.
pub fn write_number(n: &Number, out: &mut Vec<u8>) {
    const SAFE: u64 = 1 << 53;
    if let Some(u) = n.as_u64() {
        if u <= SAFE {
            out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
            return;
        }
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() <= SAFE {
            out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
            return;
        }
    }
    let f = n.as_f64().unwrap_or(0.0);
    write_f64(f, out);
}

/// Write a finite double as JavaScript's `String(number)` does.
pub fn write_f64(f: f64, out: &mut Vec<u8>) {
    if f == 0.0 {
        out.push(b'0');
        return;
    }
    let mut buf = ryu_js::Buffer::new();
    out.extend_from_slice(buf.format_finite(f).as_bytes());
}

/// Write a JSON string literal escaped per RFC 8785: the two-character escapes for `\b \t \n \f
/// \r " \\`, `\u00xx` (lower-case hex) for the other control characters, everything else as is.
pub fn write_str(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let mut rest = s.as_bytes();
    // Copy the runs that need no escape whole; most strings are one such run.
    while let Some(i) = first_escape(rest) {
        out.extend_from_slice(&rest[..i]);
        let b = rest[i];
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]]),
        }
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

/// The index of the first byte that needs escaping in a JSON string (a control character, `"`
/// or `\\`), looked for eight bytes at a time in a `u64`.
fn first_escape(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        // A byte below 0x20 has its top three bits clear; a quote or backslash XORs to zero.
        let control = has_zero(x & (0xE0 * ONES));
        let quote = has_zero(x ^ (b'"' as u64 * ONES));
        let backslash = has_zero(x ^ (b'\\' as u64 * ONES));
        if control | quote | backslash != 0 {
            let at = chunk.iter().position(|&b| needs_escape(b));
            return at.map(|p| offset + p);
        }
        offset += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| needs_escape(b))
        .map(|p| offset + p)
}

fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The canonical JSON of a string value (with quotes).
pub fn string_literal(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len() + 2);
    write_str(s, &mut out);
    String::from_utf8(out).expect("escaped string is UTF-8")
}

/// Canonicalize a JSON text: parse it and write it back canonically.
pub fn canonicalize_text(text: &str) -> Result<String, ParseError> {
    Ok(to_string(&parse(text)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn vectors_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../__test__/fixtures/jcs")
    }

    #[test]
    fn passes_every_rfc8785_vector() {
        let dir = vectors_dir();
        let mut count = 0;
        for entry in std::fs::read_dir(dir.join("input")).unwrap() {
            let path = entry.unwrap().path();
            let input = std::fs::read_to_string(&path).unwrap();
            let expected = std::fs::read_to_string(dir.join("output").join(path.file_name().unwrap())).unwrap();
            let ours = canonicalize_text(&input).unwrap();
            assert_eq!(ours, expected, "vector {}", path.display());
            // The crate we measured against agrees on every vector.
            let oracle = serde_json_canonicalizer::to_string(&parse(&input).unwrap()).unwrap();
            assert_eq!(oracle, expected, "oracle on {}", path.display());
            count += 1;
        }
        assert!(count >= 6, "expected the six RFC vectors, found {count}");
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 is a surrogate pair (0xD83D 0xDE00) in UTF-16, which sorts before U+E000, though
        // its code point is larger.
        let text = "{\"\u{E000}\":1,\"\u{1F600}\":2,\"a\":3}";
        assert_eq!(
            canonicalize_text(text).unwrap(),
            "{\"a\":3,\"\u{1F600}\":2,\"\u{E000}\":1}"
        );
        let text = "{\"\u{FFFF}\":1,\"\u{10000}\":2}";
        assert_eq!(canonicalize_text(text).unwrap(), "{\"\u{10000}\":2,\"\u{FFFF}\":1}");
    }

    #[test]
    fn numbers_are_written_as_javascript_does() {
        let cases = [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("1.0", "1"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("123456789012345678901234", "1.2345678901234569e+23"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("9007199254740993", "9007199254740992"),
            ("-9007199254740993", "-9007199254740992"),
            ("18446744073709551615", "18446744073709552000"),
            ("5e-324", "5e-324"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("333333333.33333329", "333333333.3333333"),
            ("-1.5", "-1.5"),
        ];
        for (input, want) in cases {
            assert_eq!(canonicalize_text(input).unwrap(), want, "input {input}");
        }
    }

    #[test]
    fn strings_are_escaped_per_rfc() {
        let text = "\"\\u0000\\u001f\\b\\f\\n\\r\\t\\\"\\\\/\\u007f\\u2028\u{e9}\"";
        assert_eq!(
            canonicalize_text(text).unwrap(),
            "\"\\u0000\\u001f\\b\\f\\n\\r\\t\\\"\\\\/\u{7f}\u{2028}\u{e9}\""
        );
    }

    #[test]
    fn finds_the_first_byte_to_escape() {
        for (s, want) in [
            ("", None),
            ("abcdefgh", None),
            ("abcdefghi\"", Some(9)),
            ("\u{1}", Some(0)),
            ("é\\x", Some(2)),
            ("0123456789\n", Some(10)),
        ] {
            assert_eq!(first_escape(s.as_bytes()), want, "{s:?}");
        }
        // Every position of a long string, and bytes at or above 0x80 never count.
        for at in 0..40 {
            let mut v = vec![b'a'; 40];
            v[at] = 0x1f;
            assert_eq!(first_escape(&v), Some(at));
        }
        assert_eq!(first_escape("ÿÿÿÿÿÿÿÿ€€€".as_bytes()), None);
    }

    /// The scan, at every position of strings long enough to take every path of it (whole
    /// words, the bytes left over), against a byte-at-a-time search.
    #[test]
    fn the_scans_agree_with_a_byte_at_a_time_search() {
        type Scan = fn(&[u8]) -> Option<usize>;
        let scans: &[(&str, Scan)] = &[("first_escape", first_escape)];
        let naive = |v: &[u8]| v.iter().position(|&b| b < 0x20 || b == b'"' || b == b'\\');
        // Bytes around each edge that counts: 0x1f/0x20, 0x7f/0x80 and 0xff (unsigned).
        let fill = [b'a', b' ', 0x7f, 0x80, 0xe9, 0xff];
        let marks = [0x00, 0x01, 0x1f, b'"', b'\\', b'\n'];
        for (name, scan) in scans {
            for len in 0..=150 {
                for &f in &fill {
                    let mut v = vec![f; len];
                    assert_eq!(scan(&v), None, "{name}: {len} bytes of {f:#x}");
                    for at in 0..len {
                        for &m in &marks {
                            v[at] = m;
                            // A second mark later on must not be found first.
                            if at + 1 < len {
                                v[len - 1] = b'"';
                            }
                            assert_eq!(scan(&v), naive(&v), "{name}: {m:#x} at {at} of {len} ({f:#x})");
                            assert_eq!(scan(&v), Some(at));
                            v[len - 1] = f;
                            v[at] = f;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn depth_is_bounded() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(&ok).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(parse(&deep), Err(ParseError::TooDeep));
        // Brackets inside strings do not count.
        let s = format!("[\"{}\"]", "[".repeat(5000));
        assert!(parse(&s).is_ok());
        let escaped = format!("[\"\\\"{}\\\\\"]", "{".repeat(5000));
        assert!(parse(&escaped).is_ok(), "escaped quotes do not end a string");
    }

    #[test]
    fn a_text_ending_in_an_escape_is_invalid_and_panics_nothing() {
        for text in ["\"\\", "[\"a\\", "{\"\\"] {
            assert!(matches!(parse(text), Err(ParseError::Invalid(_))), "{text}");
        }
    }

    #[test]
    fn lone_surrogates_and_huge_numbers_are_invalid() {
        assert!(matches!(parse("\"\\ud800\""), Err(ParseError::Invalid(_))));
        assert!(matches!(parse("1e400"), Err(ParseError::Invalid(_))));
        assert!(matches!(parse("[1] x"), Err(ParseError::Invalid(_))));
    }

    #[test]
    fn agrees_with_the_oracle_on_random_values() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(8785);
        for _ in 0..2000 {
            let v = random_value(&mut rng, 0);
            let ours = to_string(&v);
            let oracle = serde_json_canonicalizer::to_string(&v).unwrap();
            assert_eq!(ours, oracle);
            assert_eq!(
                canonicalize_text(&ours).unwrap(),
                ours,
                "canonical form is a fixed point"
            );
        }
    }

    fn random_value(rng: &mut impl rand::Rng, depth: usize) -> Value {
        let pick = if depth > 3 {
            rng.random_range(0..4)
        } else {
            rng.random_range(0..6)
        };
        match pick {
            0 => Value::Null,
            1 => Value::Bool(rng.random()),
            2 => {
                let bits: u64 = rng.random();
                let f = f64::from_bits(bits);
                if f.is_finite() {
                    serde_json::json!(f)
                } else {
                    serde_json::json!(rng.random::<i32>())
                }
            }
            3 => Value::String(random_string(rng)),
            4 => Value::Array(
                (0..rng.random_range(0..4))
                    .map(|_| random_value(rng, depth + 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.random_range(0..5))
                    .map(|_| (random_string(rng), random_value(rng, depth + 1)))
                    .collect(),
            ),
        }
    }

    fn random_string(rng: &mut impl rand::Rng) -> String {
        const POOL: &[char] = &[
            'a',
            'B',
            '0',
            '\n',
            '"',
            '\\',
            '\u{1}',
            '\u{7f}',
            'é',
            '€',
            '\u{E000}',
            '\u{FFFD}',
            '😀',
            '\u{10000}',
            '\u{2028}',
        ];
        (0..rng.random_range(0..6))
            .map(|_| POOL[rng.random_range(0..POOL.len())])
            .collect()
    }
}
