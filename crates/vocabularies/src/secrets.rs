//! Secret screening: no credential ever enters a stored run or session event.
//!
//! The run events make two promises about secrets: API keys and
//! other secrets never appear in any event payload, and a secret-typed input is masked as exactly
//! `{ secret: true, ref: 'inputs.<name>' }`. The producer is supposed to keep both; the world
//! refuses a draft that breaks either, so a wiring bug upstream cannot persist a key forever.
//!
//! The matchers are small hand-written scanners (no regex crate), each anchored on a credential's
//! fixed prefix and demanding a key-like tail, so prose, `sha256:<hex>` digests, UUIDs and ids
//! such as `run_abc` pass. A refusal names the field and the kind of credential, never the value
//! nor any part of it: when the credential is an object KEY, the path stops at the parent object.

use little_world_kernel::error::{Result, WorldError};
use little_world_kernel::json_path::{JsonPath, Seg};
use serde_json::{Map, Value};

/// A kind of credential the screen recognises (named in the refusal instead of the value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SecretKind {
    OpenAi,
    Anthropic,
    Aws,
    GitHub,
    GitLab,
    Google,
    Stripe,
    Slack,
    Npm,
    HuggingFace,
    SendGrid,
    Jwt,
    Bearer,
    PrivateKey,
}

impl SecretKind {
    fn describe(self) -> &'static str {
        match self {
            SecretKind::OpenAi => "an OpenAI API key",
            SecretKind::Anthropic => "an Anthropic API key",
            SecretKind::Aws => "an AWS access key id",
            SecretKind::GitHub => "a GitHub token",
            SecretKind::GitLab => "a GitLab token",
            SecretKind::Google => "a Google API key",
            SecretKind::Stripe => "a Stripe secret key",
            SecretKind::Slack => "a Slack token or webhook",
            SecretKind::Npm => "an npm token",
            SecretKind::HuggingFace => "a Hugging Face token",
            SecretKind::SendGrid => "a SendGrid API key",
            SecretKind::Jwt => "a JSON Web Token",
            SecretKind::Bearer => "a bearer-scheme credential",
            SecretKind::PrivateKey => "a private key block",
        }
    }
}

/// Refuse credentials anywhere in `value` (strings and object keys), and any `secret: true` object
/// that is not exactly a MaskedSecret. Paths are rooted at `root` (`event.inputs.apiKey`).
pub fn check_secrets(value: &Value, root: &str) -> Result<()> {
    walk(value, &mut JsonPath::new(root))
}

/// [`check_secrets`] of an object the caller holds as a map (a draft), without copying it.
pub(super) fn check_map(map: &Map<String, Value>, root: &str) -> Result<()> {
    walk_object(map, &mut JsonPath::new(root))
}

/// Whether `s` looks like a credential the screen refuses (for callers that must not echo it).
pub fn looks_like_credential(s: &str) -> bool {
    find_secret(s).is_some()
}

/// [`check_secrets`] of one string reported at `root` (an event type, a stream id or an
/// idempotency key, given apart).
pub fn screen_str(s: &str, root: &str) -> Result<()> {
    screen(s, &JsonPath::new(root), false)
}

fn walk<'v>(v: &'v Value, path: &mut JsonPath<'v>) -> Result<()> {
    match v {
        Value::String(s) => screen(s, path, false),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(Seg::Index(i));
                walk(item, path)?;
                path.pop();
            }
            Ok(())
        }
        Value::Object(map) => walk_object(map, path),
        _ => Ok(()),
    }
}

fn walk_object<'v>(map: &'v Map<String, Value>, path: &mut JsonPath<'v>) -> Result<()> {
    check_masked(map, path)?;
    for (k, item) in map {
        // Screen the key before it becomes part of any path we might report.
        screen(k, path, true)?;
        path.push(Seg::Key(k));
        walk(item, path)?;
        path.pop();
    }
    Ok(())
}

/// The message names the kind only; its wording avoids words a credential could contain.
fn screen(s: &str, path: &JsonPath<'_>, is_key: bool) -> Result<()> {
    let Some(kind) = find_secret(s) else {
        return Ok(());
    };
    let what = if is_key { "an object key here" } else { "this value" };
    Err(WorldError::validation(
        path.render(),
        format!(
            "{what} looks like {}; credentials never enter an event",
            kind.describe()
        ),
    ))
}

/// A `secret: true` object must be exactly `{ secret: true, ref: 'inputs.<name>' }`.
fn check_masked(map: &Map<String, Value>, path: &JsonPath<'_>) -> Result<()> {
    if map.get("secret") != Some(&Value::Bool(true)) {
        return Ok(());
    }
    let ref_ok = map
        .get("ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("inputs."))
        .is_some_and(|name| !name.is_empty());
    if map.len() == 2 && ref_ok {
        Ok(())
    } else {
        Err(WorldError::validation(
            path.render(),
            // Worded without the marker's field names, which a leaked value may well contain.
            "a masked input must be exactly the two-field MaskedSecret marker (flag true, ref 'inputs.<name>')",
        ))
    }
}

/// The first credential-shaped token in `s`, if any.
pub(super) fn find_secret(s: &str) -> Option<SecretKind> {
    let b = s.as_bytes();
    (0..b.len()).find_map(|i| secret_at(b, i))
}

/// Characters a key token is made of (`[A-Za-z0-9_-]`).
fn is_tok(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

/// Length of the run of bytes matching `f` from `i`.
fn run(b: &[u8], i: usize, f: impl Fn(u8) -> bool) -> usize {
    b.get(i..).map_or(0, |t| t.iter().take_while(|c| f(**c)).count())
}

fn secret_at(b: &[u8], i: usize) -> Option<SecretKind> {
    let rest = &b[i..];
    // A credential's prefix starts a token of its own, or follows anything but a letter or digit:
    // `OPENAI_API_KEY_sk-proj-…` and `key=AKIA…` hold one, `desk-…` and `risk-…` do not.
    let at_boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
    if !at_boundary {
        return None;
    }
    let tail = |from: usize, f: fn(u8) -> bool| run(b, i + from, f);
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    match rest.first()? {
        b's' if rest.starts_with(b"sk-") => {
            // sk-…, sk-proj-…, sk-svcacct-…, sk-ant-api03-…: a long key-like tail.
            (tail(3, is_tok) >= 20).then(|| {
                if rest.starts_with(b"sk-ant-") {
                    SecretKind::Anthropic
                } else {
                    SecretKind::OpenAi
                }
            })
        }
        // Stripe's secret and restricted keys: sk_live_…, sk_test_…, rk_live_…, rk_test_….
        b's' | b'r'
            if rest.len() > 8
                && rest[1..].starts_with(b"k_")
                && (rest[3..].starts_with(b"live_") || rest[3..].starts_with(b"test_")) =>
        {
            (tail(8, alnum) >= 20).then_some(SecretKind::Stripe)
        }
        b'A' if rest.starts_with(b"AKIA") || rest.starts_with(b"ASIA") => {
            let body = tail(4, |c| c.is_ascii_uppercase() || c.is_ascii_digit());
            let after = b.get(i + 4 + body).copied();
            (body == 16 && !after.is_some_and(|c| c.is_ascii_alphanumeric())).then_some(SecretKind::Aws)
        }
        b'A' if rest.starts_with(b"AIza") => (tail(4, is_tok) >= 35).then_some(SecretKind::Google),
        b'g' if rest.starts_with(b"github_pat_") => {
            (tail(11, |c| c.is_ascii_alphanumeric() || c == b'_') >= 22).then_some(SecretKind::GitHub)
        }
        b'g' if rest.len() > 4 && rest.starts_with(b"gh") && rest[3] == b'_' => {
            let classic = matches!(rest[2], b'p' | b'o' | b'u' | b's' | b'r');
            (classic && tail(4, alnum) >= 30).then_some(SecretKind::GitHub)
        }
        b'g' if rest.starts_with(b"glpat-") => (tail(6, is_tok) >= 20).then_some(SecretKind::GitLab),
        // Slack: xoxb-…, xoxp-…, xoxa-…, xoxr-…, xoxs-…, xoxe-…, and incoming-webhook URLs.
        b'x' if rest.len() > 5 && rest.starts_with(b"xox") && b"abposer".contains(&rest[3]) && rest[4] == b'-' => {
            let body = &b[i + 5..i + 5 + tail(5, |c| c.is_ascii_alphanumeric() || c == b'-')];
            (body.len() >= 10 && body.iter().any(u8::is_ascii_digit)).then_some(SecretKind::Slack)
        }
        b'h' if rest.starts_with(b"hooks.slack.com/services/") => {
            (tail(25, |c| c.is_ascii_alphanumeric() || c == b'/') >= 20).then_some(SecretKind::Slack)
        }
        b'n' if rest.starts_with(b"npm_") => (tail(4, alnum) >= 36).then_some(SecretKind::Npm),
        b'h' if rest.starts_with(b"hf_") => (tail(3, alnum) >= 30).then_some(SecretKind::HuggingFace),
        b'S' if rest.starts_with(b"SG.") => {
            let first = tail(3, is_tok);
            let dot = b.get(i + 3 + first) == Some(&b'.');
            (first >= 16 && dot && tail(4 + first, is_tok) >= 30).then_some(SecretKind::SendGrid)
        }
        // A JSON Web Token: three base64url parts, the first two JSON objects (`eyJ` is `{"`).
        b'e' if rest.starts_with(b"eyJ") => {
            let b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
            let header = tail(0, b64);
            let at = i + header;
            let payload = (b.get(at) == Some(&b'.') && b[at + 1..].starts_with(b"eyJ")).then(|| run(b, at + 1, b64))?;
            let sig_at = at + 1 + payload;
            (header >= 10 && payload >= 10 && b.get(sig_at) == Some(&b'.') && run(b, sig_at + 1, b64) >= 10)
                .then_some(SecretKind::Jwt)
        }
        b'B' | b'b' if rest.len() > 7 => {
            if !rest[..6].eq_ignore_ascii_case(b"bearer") {
                return None;
            }
            let gap = run(b, i + 6, |c| c == b' ' || c == b'\t');
            (gap > 0 && is_bearer_token(&b[i + 6 + gap..])).then_some(SecretKind::Bearer)
        }
        // Any private key block: PEM (RSA, EC, OPENSSH, ENCRYPTED, …) and PGP's.
        b'-' if rest.starts_with(b"-----BEGIN ") => {
            let label = &rest[11..];
            let end = label.windows(5).position(|w| w == b"-----")?;
            label[..end]
                .windows(11)
                .any(|w| w == b"PRIVATE KEY")
                .then_some(SecretKind::PrivateKey)
        }
        _ => None,
    }
}

/// A bearer credential, not a word: at least 16 token characters with a digit, or at least 20
/// letters and digits mixing upper and lower case (random base62). "Bearer authentication" passes.
fn is_bearer_token(t: &[u8]) -> bool {
    let n = run(t, 0, |c| c.is_ascii_alphanumeric() || b"._~+/=-".contains(&c));
    let tok = &t[..n];
    let has = |f: fn(&u8) -> bool| tok.iter().any(f);
    (n >= 16 && has(u8::is_ascii_digit))
        || (n >= 20
            && tok.iter().all(u8::is_ascii_alphanumeric)
            && has(u8::is_ascii_uppercase)
            && has(u8::is_ascii_lowercase))
}

/// The credential screen, as the kernel asks it: a run event's stream id and idempotency key
/// carry no credential, and an error never shows a key that looks like one.
pub struct CredentialScreen;

impl little_world_kernel::vocabulary::Vocabulary for CredentialScreen {
    fn screen(&self, text: &str, field: &str) -> Result<()> {
        screen_str(text, field)
    }

    fn hides(&self, text: &str) -> bool {
        looks_like_credential(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// One credential of each kind as a producer bug would leak it: (text, the credential part
    /// that must never be echoed, kind).
    const SECRETS: &[(&str, &str, SecretKind)] = &[
        (
            "sk-proj-Q3vN8wLz2pKx7RtY5mBc9HdF1aJgE4sU6oWi0XnV",
            "sk-proj-Q3vN8wLz2pKx7RtY5mBc9HdF1aJgE4sU6oWi0XnV",
            SecretKind::OpenAi,
        ),
        (
            "sk-5fT9qLm2Xv8RzK4pNw7YbJc1HdGs6AeU3oQiZrMx0tVn",
            "sk-5fT9qLm2Xv8RzK4pNw7YbJc1HdGs6AeU3oQiZrMx0tVn",
            SecretKind::OpenAi,
        ),
        (
            "sk-ant-api03-Xy7Qm2LpV9zR4kT8nW1bJ6cH3dF5gS0aE-uIoPqRsTuVwXyZ_AA",
            "sk-ant-api03-Xy7Qm2LpV9zR4kT8nW1bJ6cH3dF5gS0aE-uIoPqRsTuVwXyZ_AA",
            SecretKind::Anthropic,
        ),
        ("AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE", SecretKind::Aws),
        ("ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A", SecretKind::Aws),
        (
            "ghp_Zx8Kq2Lm9Vt4Rw7Yp1Nc6Hb3Jd5Fg0Se8Ua2",
            "ghp_Zx8Kq2Lm9Vt4Rw7Yp1Nc6Hb3Jd5Fg0Se8Ua2",
            SecretKind::GitHub,
        ),
        (
            "gho_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
            "gho_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
            SecretKind::GitHub,
        ),
        (
            "github_pat_11ABCDEFG0aBcDeFgHiJkL_mNoPqRsTuVwXyZ0123456789abcdefGHIJKLmnop",
            "github_pat_11ABCDEFG0aBcDeFgHiJkL_mNoPqRsTuVwXyZ0123456789abcdefGHIJKLmnop",
            SecretKind::GitHub,
        ),
        (
            "AIzaSyD4kT8nW1bJ6cH3dF5gS0aE9uIoPqRsTuV",
            "AIzaSyD4kT8nW1bJ6cH3dF5gS0aE9uIoPqRsTuV",
            SecretKind::Google,
        ),
        (
            "Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
            "Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
            SecretKind::Bearer,
        ),
        (
            "Authorization: bearer 9f8e7d6c5b4a39281726354453627180",
            "9f8e7d6c5b4a39281726354453627180",
            SecretKind::Bearer,
        ),
        (
            "Bearer ZqXvLmNpRtKwYbHcQaSd",
            "Bearer ZqXvLmNpRtKwYbHcQaSd",
            SecretKind::Bearer,
        ),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7Vq3\n-----END RSA PRIVATE KEY-----",
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7Vq3\n-----END RSA PRIVATE KEY-----",
            SecretKind::PrivateKey,
        ),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
            SecretKind::PrivateKey,
        ),
        (
            "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGV0c3QBCADk\n-----END PGP PRIVATE KEY BLOCK-----",
            "lQOYBGV0c3QBCADk",
            SecretKind::PrivateKey,
        ),
        // A key written straight after an underscore or an `=`, as in an environment dump.
        (
            "OPENAI_API_KEY_sk-proj-Q3vN8wLz2pKx7RtY5mBc9HdF1aJgE4sU6oWi0XnV",
            "Q3vN8wLz2pKx7RtY5mBc9HdF1aJgE4sU6oWi0XnV",
            SecretKind::OpenAi,
        ),
        ("AWS_KEY=AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE", SecretKind::Aws),
        (
            "sk_live_51HxQ2vKZp8Lm3Nw7Rt4Yb6Jc9Hd1FgAeU",
            "51HxQ2vKZp8Lm3Nw7Rt4Yb6Jc9Hd1FgAeU",
            SecretKind::Stripe,
        ),
        (
            "rk_test_4eC39HqLyjWDarjtT1zdp7dc4eC39HqLyjW",
            "4eC39HqLyjWDarjtT1zdp7dc",
            SecretKind::Stripe,
        ),
        (
            "xoxb-2048563921-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
            "1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
            SecretKind::Slack,
        ),
        (
            "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
            "XXXXXXXXXXXXXXXXXXXXXXXX",
            SecretKind::Slack,
        ),
        ("glpat-Zx8Kq2Lm9Vt4Rw7Yp1Nc", "Zx8Kq2Lm9Vt4Rw7Yp1Nc", SecretKind::GitLab),
        (
            "npm_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
            "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
            SecretKind::Npm,
        ),
        (
            "hf_QmVtYkLxNpRzWsTbHcJdFgAeUiOo1234567",
            "QmVtYkLxNpRzWsTbHcJdFgAeUiOo1234567",
            SecretKind::HuggingFace,
        ),
        (
            "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",
            "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr",
            SecretKind::SendGrid,
        ),
        (
            "token=eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
            "dozjgNryP4J3jVmNHl0w5N",
            SecretKind::Jwt,
        ),
    ];

    /// Whether any 6-byte window of `secret` appears in `text`.
    fn leaks(text: &str, secret: &str) -> bool {
        secret
            .as_bytes()
            .windows(6)
            .any(|w| text.as_bytes().windows(6).any(|t| t == w))
    }

    fn assert_refused_without_leak(v: &Value, core: &str, want_path: &str) {
        let err = check_secrets(v, "event").expect_err(core);
        assert_eq!(err.code(), "EVENT_VALIDATION");
        assert_eq!(err.details()["path"], want_path, "{core}");
        assert!(!leaks(&err.to_string(), core), "Display leaks {core}: {err}");
        assert!(!leaks(&err.details().to_string(), core), "details leak {core}");
        assert!(!leaks(&format!("{err:?}"), core), "Debug leaks {core}");
    }

    #[test]
    fn each_credential_kind_is_refused_without_echo() {
        for (text, core, kind) in SECRETS {
            assert_eq!(find_secret(text), Some(*kind), "{text}");
            // Bare, embedded in prose, deep in an array, and as an object key.
            assert_refused_without_leak(&json!({ "toolInput": text }), core, "event.toolInput");
            let prose = format!("use {text} for the call");
            assert_refused_without_leak(&json!({ "output": { "text": prose } }), core, "event.output.text");
            assert_refused_without_leak(&json!({ "a": [1, { "b": [text] }] }), core, "event.a[1].b[0]");
            let mut keyed = Map::new();
            keyed.insert(text.to_string(), json!(1));
            assert_refused_without_leak(&json!({ "inputs": keyed }), core, "event.inputs");
        }
    }

    #[test]
    fn ordinary_strings_pass() {
        for ok in [
            "The quick brown fox jumps over the lazy dog.",
            "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "3f2b8c1e-9a4d-4e6f-8b2a-1c3d5e7f9a0b",
            "run_abc",
            "ses_x-1",
            "evt_0123456789abcdef",
            "artifact://art_0123456789abcdef",
            "risk-assessment-of-the-quarterly-report-for-finance",
            "sk-short",
            "desk-1234567890abcdefghijklmnop",
            "AKIA is the prefix of an AWS access key id",
            "AKIAIOSFODNN7EXAMPLEEXTRA",
            "The bearer of bad news arrived.",
            "Bearer authentication is described in RFC 6750.",
            "Bearer tokens-are-described-in-rfcs",
            "ghp_short",
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
            "-----BEGIN PUBLIC KEY-----",
            "[redacted]",
            "sk_live_short",
            "xoxb-not-a-token",
            "eyJ is how base64 of {\" begins",
            "hf_hub_download",
            "npm_config_cache",
            "-----BEGIN PGP PUBLIC KEY BLOCK-----",
            "",
        ] {
            assert_eq!(find_secret(ok), None, "{ok}");
            assert!(check_secrets(&json!({ "x": ok, ok: true }), "event").is_ok(), "{ok}");
        }
    }

    #[test]
    fn masked_secrets() {
        let ok = json!({ "inputs": { "apiKey": { "secret": true, "ref": "inputs.apiKey" }, "topic": "cats" } });
        assert!(check_secrets(&ok, "event").is_ok());
        // `secret: false` (or a non-boolean) is ordinary data.
        assert!(check_secrets(&json!({ "secret": false, "note": "x" }), "event").is_ok());
        assert!(check_secrets(&json!({ "secret": "true", "note": "x" }), "event").is_ok());
        for bad in [
            json!({ "secret": true }),
            json!({ "secret": true, "ref": "inputs." }),
            json!({ "secret": true, "ref": "env.OPENAI_API_KEY" }),
            json!({ "secret": true, "ref": "keychain:openai" }),
            json!({ "secret": true, "ref": 7 }),
            json!({ "secret": true, "ref": "inputs.apiKey", "value": "my-supersecret-hunter2" }),
        ] {
            let v = json!({ "inputs": { "apiKey": bad } });
            let err = check_secrets(&v, "event").unwrap_err();
            assert_eq!(err.details()["path"], "event.inputs.apiKey");
            assert!(!leaks(&err.to_string(), "my-supersecret-hunter2"), "{err}");
        }
        // The ref of a well-formed mask is screened like any string.
        let v = json!({ "secret": true, "ref": "inputs.AKIAIOSFODNN7EXAMPLE" });
        assert_eq!(check_secrets(&v, "event").unwrap_err().details()["path"], "event.ref");
    }
}
