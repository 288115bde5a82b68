//! The archive that carries runs from one world to another: its lines, written and read.
//!
//! An archive is JSON Lines, one record per line, each an object whose `kind` says what it is:
//!
//! ```text
//! {"kind":"archive","format":"little-workflow-archive","version":1,"exportedAt":"…"}
//! {"kind":"run","runId":"run_…","lastSequence":3}
//! {"kind":"event","envelope":{…the envelope exactly as stored…}}            one per event, in order
//! {"kind":"artifact","manifest":{…},"bytes":"<base64>"}                      one per artifact
//! {"kind":"index","index":"…","key":"…","value":"…","sequence":2}           one per index entry
//! {"kind":"end","runId":"run_…","events":3,"artifacts":1,"indexEntries":1}
//! …more runs…
//! {"kind":"archive-end","runs":1}
//! ```
//!
//! A run's records sit between its `run` and `end` lines, and an archive ends with `archive-end`,
//! so a truncated archive is found out. The envelope is the stored canonical text, byte for byte;
//! nothing else in the archive is trusted: importing re-checks each record (see
//! `crate::world::archive`).

use crate::artifacts::Manifest;
use crate::error::{Result, WorldError};
use crate::store::IndexEntry;
use base64::Engine;

/// The `format` of the archive's first line.
pub const FORMAT: &str = "little-workflow-archive";
/// The version of the format this build writes and reads.
pub const VERSION: u64 = 1;

/// One line of an archive, as read.
#[derive(Debug)]
pub enum Record<'a> {
    Archive {
        format: String,
        version: u64,
    },
    Run {
        run_id: String,
        last_sequence: u64,
    },
    /// The envelope's text, as the line holds it.
    Event {
        envelope: &'a str,
    },
    Artifact {
        manifest: Manifest,
        bytes: String,
    },
    Index {
        index: String,
        key: String,
        value: String,
        sequence: u64,
    },
    End {
        run_id: String,
        events: u64,
        artifacts: u64,
        index_entries: u64,
    },
    ArchiveEnd {
        runs: u64,
    },
}

/// The fields of each kind of line, as read (`kind` included, so that no other field is allowed).
mod lines {
    use super::Manifest;
    use serde::de::IgnoredAny;
    use serde::Deserialize;
    use serde_json::value::RawValue;

    #[derive(Deserialize)]
    pub struct Kind<'a> {
        #[serde(borrow)]
        pub kind: std::borrow::Cow<'a, str>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct Archive {
        #[allow(dead_code)]
        kind: IgnoredAny,
        pub format: String,
        pub version: u64,
        #[allow(dead_code)]
        exported_at: String,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct Run {
        #[allow(dead_code)]
        kind: IgnoredAny,
        pub run_id: String,
        pub last_sequence: u64,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Event<'a> {
        #[allow(dead_code)]
        kind: IgnoredAny,
        #[serde(borrow)]
        pub envelope: &'a RawValue,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Artifact {
        #[allow(dead_code)]
        kind: IgnoredAny,
        pub manifest: Manifest,
        pub bytes: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Index {
        #[allow(dead_code)]
        kind: IgnoredAny,
        pub index: String,
        pub key: String,
        pub value: String,
        pub sequence: u64,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct End {
        #[allow(dead_code)]
        kind: IgnoredAny,
        pub run_id: String,
        pub events: u64,
        pub artifacts: u64,
        pub index_entries: u64,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ArchiveEnd {
        #[allow(dead_code)]
        kind: IgnoredAny,
        pub runs: u64,
    }
}

/// A record that is not where it belongs, or does not read: the archive is damaged. Names the
/// run being read, if any, and the line.
pub fn damaged(run_id: Option<&str>, line: u64, reason: impl std::fmt::Display) -> WorldError {
    WorldError::EventLogCorrupt {
        run_id: run_id.map(str::to_string),
        sequence: None,
        reason: format!("line {line} of the archive: {reason}"),
    }
}

/// Read one line (without its newline).
pub fn parse<'a>(text: &'a [u8], run_id: Option<&str>, line: u64) -> Result<Record<'a>> {
    let text = std::str::from_utf8(text).map_err(|_| damaged(run_id, line, "the line is not UTF-8"))?;
    let bad = |e: serde_json::Error| damaged(run_id, line, format!("the line is not an archive record ({e})"));
    // An event line as this build writes it, read without parsing its envelope twice (the import
    // parses it once more anyway, and compares it byte for byte).
    const EVENT: &str = "{\"kind\":\"event\",\"envelope\":";
    if let Some(envelope) = text.strip_prefix(EVENT).and_then(|t| t.strip_suffix('}')) {
        if envelope.starts_with('{') && envelope.ends_with('}') {
            return Ok(Record::Event { envelope });
        }
    }
    let kind: lines::Kind = serde_json::from_str(text).map_err(bad)?;
    Ok(match kind.kind.as_ref() {
        "archive" => {
            let r: lines::Archive = serde_json::from_str(text).map_err(bad)?;
            Record::Archive {
                format: r.format,
                version: r.version,
            }
        }
        "run" => {
            let r: lines::Run = serde_json::from_str(text).map_err(bad)?;
            Record::Run {
                run_id: r.run_id,
                last_sequence: r.last_sequence,
            }
        }
        "event" => {
            let r: lines::Event = serde_json::from_str(text).map_err(bad)?;
            Record::Event {
                envelope: r.envelope.get(),
            }
        }
        "artifact" => {
            let r: lines::Artifact = serde_json::from_str(text).map_err(bad)?;
            Record::Artifact {
                manifest: r.manifest,
                bytes: r.bytes,
            }
        }
        "index" => {
            let r: lines::Index = serde_json::from_str(text).map_err(bad)?;
            Record::Index {
                index: r.index,
                key: r.key,
                value: r.value,
                sequence: r.sequence,
            }
        }
        "end" => {
            let r: lines::End = serde_json::from_str(text).map_err(bad)?;
            Record::End {
                run_id: r.run_id,
                events: r.events,
                artifacts: r.artifacts,
                index_entries: r.index_entries,
            }
        }
        "archive-end" => {
            let r: lines::ArchiveEnd = serde_json::from_str(text).map_err(bad)?;
            Record::ArchiveEnd { runs: r.runs }
        }
        other => return Err(damaged(run_id, line, format!("no record is of kind {other:?}"))),
    })
}

/// The bytes of an `artifact` record.
pub fn artifact_bytes(text: &str, run_id: &str, line: u64) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| damaged(Some(run_id), line, format!("the artifact's bytes are not base64 ({e})")))
}

/// Where an archive's lines are written.
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Writer<'a> {
        Writer { out }
    }

    fn line(&mut self, value: serde_json::Value) {
        serde_json::to_writer(&mut *self.out, &value).expect("a record serializes");
        self.out.push(b'\n');
    }

    pub fn header(&mut self, exported_at: &str) {
        self.line(serde_json::json!({
            "kind": "archive", "format": FORMAT, "version": VERSION, "exportedAt": exported_at,
        }));
    }

    pub fn run(&mut self, run_id: &str, last_sequence: u64) {
        self.line(serde_json::json!({ "kind": "run", "runId": run_id, "lastSequence": last_sequence }));
    }

    /// An event, its stored envelope copied in as it is.
    pub fn event(&mut self, envelope: &str) {
        self.out.extend_from_slice(b"{\"kind\":\"event\",\"envelope\":");
        self.out.extend_from_slice(envelope.as_bytes());
        self.out.extend_from_slice(b"}\n");
    }

    pub fn artifact(&mut self, manifest: &Manifest, bytes: &[u8]) {
        self.out.extend_from_slice(b"{\"kind\":\"artifact\",\"manifest\":");
        self.out.extend_from_slice(manifest.to_json().as_bytes());
        self.out.extend_from_slice(b",\"bytes\":\"");
        let at = self.out.len();
        let len = base64::encoded_len(bytes.len(), true).expect("an artifact's base64 fits in memory");
        self.out.resize(at + len, 0);
        base64::engine::general_purpose::STANDARD
            .encode_slice(bytes, &mut self.out[at..])
            .expect("the buffer has room for the base64");
        self.out.extend_from_slice(b"\"}\n");
    }

    pub fn index(&mut self, entry: &IndexEntry) {
        self.line(serde_json::json!({
            "kind": "index", "index": entry.index, "key": entry.key, "value": entry.value, "sequence": entry.sequence,
        }));
    }

    pub fn end(&mut self, run_id: &str, events: u64, artifacts: u64, index_entries: u64) {
        self.line(serde_json::json!({
            "kind": "end", "runId": run_id, "events": events, "artifacts": artifacts, "indexEntries": index_entries,
        }));
    }

    pub fn archive_end(&mut self, runs: u64) {
        self.line(serde_json::json!({ "kind": "archive-end", "runs": runs }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_written_reads_back() {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        w.header("2026-01-01T00:00:00.000Z");
        w.run("run_a", 1);
        w.event(r#"{"eventId":"e","payload":{"a":"\n"},"sequence":1}"#);
        w.index(&IndexEntry {
            index: "i".into(),
            key: "k".into(),
            value: "v".into(),
            run_id: "run_a".into(),
            sequence: 1,
        });
        w.end("run_a", 1, 0, 1);
        w.archive_end(1);
        let lines: Vec<&[u8]> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 6);
        let kinds: Vec<String> = lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                format!("{:?}", parse(l, None, i as u64 + 1).unwrap())
                    .split([' ', '{'])
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(kinds, ["Archive", "Run", "Event", "Index", "End", "ArchiveEnd"]);
        match parse(lines[2], None, 3).unwrap() {
            Record::Event { envelope } => {
                assert_eq!(envelope, r#"{"eventId":"e","payload":{"a":"\n"},"sequence":1}"#)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_line_that_is_not_a_record_names_its_line() {
        let e = parse(br#"{"kind":"event"}"#, Some("run_a"), 7).unwrap_err();
        assert_eq!(e.code(), "EVENT_LOG_CORRUPT");
        assert!(
            e.to_string().contains("run_a") && e.to_string().contains("line 7"),
            "{e}"
        );
    }
}
