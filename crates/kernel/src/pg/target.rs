//! Reading a connection string: a `postgres://` URL or libpq's `key=value` form, with libpq's
//! `sslmode`s, into a client configuration and the TLS it needs.
//!
//! tokio-postgres parses both forms but knows only `sslmode=disable|prefer|require` and no
//! certificate settings, so the TLS settings (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`) are
//! taken out first and turned into a rustls configuration here, with libpq's meaning:
//! `prefer` and `require` encrypt without checking the server's certificate (unless `sslrootcert`
//! is given, when `require` checks it as `verify-ca` does), `verify-ca` checks that a trusted
//! authority signed it, `verify-full` also that it names the host.

use crate::error::{Result, WorldError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::str::FromStr;
use std::sync::Arc;
use tokio_postgres::config::{Host, SslMode};

pub use crate::error::Server;

/// A parsed connection string.
pub struct Target {
    pub config: tokio_postgres::Config,
    pub tls: tokio_postgres_rustls::MakeRustlsConnect,
    pub server: Server,
}

/// The TLS settings libpq has and tokio-postgres does not.
#[derive(Default)]
struct TlsSettings {
    mode: Option<String>,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl TlsSettings {
    /// Take `key` if it is one of ours; false for any other key.
    fn take(&mut self, key: &str, value: String) -> bool {
        let slot = match key {
            "sslmode" => &mut self.mode,
            "sslrootcert" => &mut self.root_cert,
            "sslcert" => &mut self.cert,
            "sslkey" => &mut self.key,
            _ => return false,
        };
        *slot = Some(value);
        true
    }
}

fn refused(message: impl Into<String>) -> WorldError {
    WorldError::validation("connectionString", message)
}

/// Parse `text`. A malformed string is an `EventValidationError` on `connectionString`, whose
/// message never repeats the string (it may hold a password).
pub fn parse(text: &str) -> Result<Target> {
    let mut tls = TlsSettings::default();
    let rest = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        strip_url(text, &mut tls)?
    } else {
        strip_key_values(text, &mut tls)?
    };
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(|e| {
        refused(format!(
            "is not a PostgreSQL connection string ({})",
            without_secrets(&e.to_string())
        ))
    })?;
    if config.get_user().is_none() {
        let user = std::env::var("PGUSER")
            .or_else(|_| std::env::var("USER"))
            .unwrap_or_else(|_| "postgres".into());
        config.user(&user);
    }
    if config.get_hosts().is_empty() {
        config.host(std::env::var("PGHOST").as_deref().unwrap_or("localhost"));
    }
    if config.get_dbname().is_none() {
        let user = config.get_user().unwrap_or("postgres").to_string();
        config.dbname(&user);
    }
    let mode = tls.mode.as_deref().unwrap_or("prefer");
    config.ssl_mode(match mode {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        "require" | "verify-ca" | "verify-full" => SslMode::Require,
        other => {
            return Err(refused(format!(
                "sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            )))
        }
    });
    config.connect_timeout(std::time::Duration::from_secs(10));
    config.keepalives(true);
    config.keepalives_idle(std::time::Duration::from_secs(30));
    let server = server_of(&config);
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(mode, &tls)?);
    Ok(Target { config, tls, server })
}

fn server_of(config: &tokio_postgres::Config) -> Server {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    Server {
        host,
        port: config.get_ports().first().copied().unwrap_or(5432),
        database: config.get_dbname().unwrap_or_default().to_string(),
    }
}

/// A parse error of tokio-postgres, with anything after `=` or `:` that might be a password cut.
fn without_secrets(message: &str) -> String {
    if message.contains("password") {
        "a parameter is malformed".into()
    } else {
        message.to_string()
    }
}

/// The URL without our query parameters.
fn strip_url(text: &str, tls: &mut TlsSettings) -> Result<String> {
    let Some((base, query)) = text.split_once('?') else {
        return Ok(text.to_string());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(k)?;
        if !tls.take(&key, percent_decode(v)?) {
            kept.push(pair);
        }
    }
    Ok(if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    })
}

fn percent_decode(s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(hex.ok_or_else(|| refused("has a malformed %-escape"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| refused("has a %-escape that is not UTF-8"))
}

/// The `key=value` string without our keys. Values may be quoted (`'a b'`, with `\'` and `\\`).
fn strip_key_values(text: &str, tls: &mut TlsSettings) -> Result<String> {
    let mut kept = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            // Only a word is named: anything else may be a URL of another scheme, password and all.
            if !key.is_empty() && key.len() <= 64 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(refused(format!("has {key:?} without a value")));
            }
            return Err(refused("is neither a postgres:// URL nor key=value pairs"));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut raw = String::new();
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            raw.push(chars.next().expect("a quote"));
            loop {
                match chars.next() {
                    Some('\\') => {
                        let c = chars.next().ok_or_else(|| refused("ends inside a quoted value"))?;
                        raw.push('\\');
                        raw.push(c);
                        value.push(c);
                    }
                    Some('\'') => {
                        raw.push('\'');
                        break;
                    }
                    Some(c) => {
                        raw.push(c);
                        value.push(c);
                    }
                    None => return Err(refused("ends inside a quoted value")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                raw.push(c);
                value.push(c);
                chars.next();
            }
        }
        if !tls.take(&key, value) {
            kept.push(format!("{key}={raw}"));
        }
    }
    Ok(kept.join(" "))
}

/// The rustls configuration for `mode`.
fn client_config(mode: &str, tls: &TlsSettings) -> Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(format!("TLS cannot be set up: {e}")))?;
    let verify = matches!(
        (mode, &tls.root_cert),
        ("verify-ca" | "verify-full", _) | ("require", Some(_))
    );
    let builder = if verify {
        let roots = Arc::new(roots(tls.root_cert.as_deref())?);
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| refused(format!("sslrootcert holds no usable certificate ({e})")))?;
        if mode == "verify-full" {
            builder.with_webpki_verifier(webpki)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(SignedByTrusted(webpki)))
        }
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
    };
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let certs = read_pem(cert, "sslcert")?;
            let certs = CertificateDer::pem_slice_iter(&certs)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| refused(format!("sslcert is not a PEM certificate ({e})")))?;
            let key = PrivateKeyDer::from_pem_slice(&read_pem(key, "sslkey")?)
                .map_err(|e| refused(format!("sslkey is not a PEM private key ({e})")))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| refused(format!("sslcert and sslkey do not go together ({e})")))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(refused("sslcert and sslkey must be given together")),
    }
}

fn read_pem(path: &str, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| WorldError::io(format!("reading {what}"), Some(path.into()), e))
}

/// The authorities a verifying mode trusts: `sslrootcert`'s file, the bundled public roots for
/// `sslrootcert=system`, or libpq's default `~/.postgresql/root.crt`.
fn roots(root_cert: Option<&str>) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    if root_cert == Some("system") {
        store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok(store);
    }
    let path = match root_cert {
        Some(p) => p.to_string(),
        None => {
            let home = std::env::var("HOME").unwrap_or_default();
            format!("{home}/.postgresql/root.crt")
        }
    };
    let pem = read_pem(&path, "sslrootcert")?;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| refused(format!("sslrootcert is not a PEM certificate ({e})")))?;
        store
            .add(cert)
            .map_err(|e| refused(format!("sslrootcert holds a certificate rustls refuses ({e})")))?;
    }
    Ok(store)
}

/// `prefer` and `require` without `sslrootcert`: the connection is encrypted, the certificate
/// not checked (libpq's meaning of these modes). Signatures are still checked, so the session
/// key is the holder's of the certificate the server presented.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the certificate must chain to a trusted authority; the name it carries is not
/// compared with the host.
#[derive(Debug)]
struct SignedByTrusted(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for SignedByTrusted {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_taken_out_of_both_forms() {
        let t = parse("postgres://u:secret@db.example:6543/app?sslmode=disable&application_name=x").unwrap();
        assert_eq!(t.server.to_string(), "db.example:6543/app");
        assert_eq!(t.config.get_ssl_mode(), SslMode::Disable);
        let t = parse("host=/tmp/sock port=5999 user=u dbname='my db' sslmode=disable").unwrap();
        assert_eq!(t.server.to_string(), "/tmp/sock:5999/my db");
        let t = parse("postgres://u@%2Ftmp%2Fs:5432/d?sslmode=require").unwrap();
        assert_eq!(t.config.get_ssl_mode(), SslMode::Require);
    }

    #[test]
    fn a_malformed_string_never_shows_its_password() {
        for text in [
            "postgres://u:hunter2@h/d?sslmode=bogus",
            "host=h password=hunter2 port=notaport",
            "user='hunter2",
            // Another scheme is read as key=value pairs, and its first word has no `=`.
            "mysql://u:hunter2@h/d",
            "postgresql:/u:hunter2@h/d",
        ] {
            let e = parse(text).err().expect("refused");
            assert_eq!(e.code(), "EVENT_VALIDATION");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn a_verifying_mode_needs_roots() {
        let e = parse("host=h sslmode=verify-full sslrootcert=/nonexistent/root.crt")
            .err()
            .expect("refused");
        assert_eq!(e.code(), "WORLD_IO");
        assert!(parse("host=h sslmode=verify-full sslrootcert=system").is_ok());
    }
}
