//! TLS for the PostgreSQL store, with libpq's `sslmode` meanings, so a URL that works with
//! `psql` works with `--state` too:
//!
//! | `sslmode`          | encrypts                  | verifies the server's certificate              |
//! | ------------------ | ------------------------- | ---------------------------------------------- |
//! | `disable`          | never                     | -                                              |
//! | `prefer` (default) | when the server offers it | no                                             |
//! | `require`          | always                    | no; the chain when a root certificate is found |
//! | `verify-ca`        | always                    | the chain, against the root certificates       |
//! | `verify-full`      | always                    | the chain, and that it names the host          |
//!
//! Root certificates come from `sslrootcert=FILE` (PEM) in the URL, `sslrootcert=system` for
//! the system's trust store, then `PGSSLROOTCERT`, then `~/.postgresql/root.crt`, as libpq
//! looks for them; `PGSSLMODE` is the default mode. tokio-postgres itself only knows
//! `disable | prefer | require`, so these two parameters are taken off the URL here and the
//! verification is done by the rustls verifier built below.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<SslMode, String> {
        Ok(match s {
            "disable" => SslMode::Disable,
            // libpq's `allow` tries plain text first; encrypting when offered is never worse.
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "unknown sslmode `{other}`: use disable, prefer, require, verify-ca or verify-full"
                ))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres negotiates; the verification is ours.
    pub fn negotiation(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        }
    }
}

/// Where the trusted root certificates come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Roots {
    File(PathBuf),
    System,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    pub mode: SslMode,
    /// Where the root certificates are, when one was named or libpq's default file exists.
    pub roots: Option<Roots>,
}

/// Takes `sslmode` and `sslrootcert` off a `postgres://` URL and returns the URL tokio-postgres
/// should parse with the TLS settings. `env` reads the environment (a test passes its own).
pub fn split(url: &str, env: impl Fn(&str) -> Option<String>) -> Result<(String, Tls), String> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => (url, ""),
    };
    let (mut mode, mut roots) = (None, None);
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = || {
            percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map(|v| v.into_owned())
                .map_err(|_| format!("`{key}` in the URL is not valid UTF-8 once decoded"))
        };
        match key {
            "sslmode" => mode = Some(SslMode::parse(&decoded()?)?),
            // Empty means "not given", as in libpq.
            "sslrootcert" => roots = Some(decoded()?).filter(|r| !r.is_empty()),
            "sslcert" | "sslkey" | "sslpassword" => {
                return Err(format!(
                    "`{key}`: client certificates are not supported by the PostgreSQL store yet; authenticate with a password (in the URL or PGPASSWORD)"
                ))
            }
            _ => kept.push(pair),
        }
    }
    let named = roots.or_else(|| env("PGSSLROOTCERT").filter(|r| !r.is_empty()));
    let roots = match named {
        Some(r) if r == "system" => Some(Roots::System),
        Some(r) => Some(Roots::File(PathBuf::from(r))),
        None => env("HOME")
            .map(|home| PathBuf::from(home).join(".postgresql/root.crt"))
            .filter(|default| default.exists())
            .map(Roots::File),
    };
    let given = match (mode, env("PGSSLMODE").filter(|m| !m.is_empty())) {
        (Some(mode), _) => Some(mode),
        (None, Some(m)) => Some(SslMode::parse(&m).map_err(|e| format!("PGSSLMODE: {e}"))?),
        (None, None) => None,
    };
    let mode = match (given, &roots) {
        // The system's store trusts every public CA, so only a check of the host name means
        // anything with it; libpq 16 makes the same rule.
        (None, Some(Roots::System)) => SslMode::VerifyFull,
        (Some(mode), Some(Roots::System)) if mode != SslMode::VerifyFull => {
            return Err(format!(
            "sslrootcert=system trusts every public certificate authority, so it needs sslmode=verify-full (got {})",
            mode.name()
        ))
        }
        (Some(mode), _) => mode,
        (None, _) => SslMode::Prefer,
    };
    let url = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
    Ok((url, Tls { mode, roots }))
}

/// What the verifier checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    ChainAndName,
}

impl Tls {
    fn check(&self) -> Check {
        match (self.mode, &self.roots) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => Check::Nothing,
            (SslMode::Require | SslMode::VerifyCa, _) => Check::Chain,
            (SslMode::VerifyFull, _) => Check::ChainAndName,
        }
    }

    /// The connector tokio-postgres uses; fails when the root certificates cannot be read.
    pub fn connector(&self) -> Result<Connector, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let check = self.check();
        let verifier: Arc<dyn ServerCertVerifier> = match check {
            Check::Nothing => Arc::new(Unverified(provider.clone())),
            Check::Chain | Check::ChainAndName => {
                let roots = self.load_roots()?;
                let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| format!("the root certificates cannot be used: {e}"))?;
                if check == Check::Chain {
                    Arc::new(ChainOnly(webpki))
                } else {
                    webpki
                }
            }
        };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Connector(MakeRustlsConnect::new(config)))
    }

    fn load_roots(&self) -> Result<RootCertStore, String> {
        let mut store = RootCertStore::empty();
        match &self.roots {
            None => {
                return Err(format!(
                    "sslmode={} needs the root certificate that signed the server's: name it with `sslrootcert=FILE` in the URL (or PGSSLROOTCERT, or ~/.postgresql/root.crt), or use `sslrootcert=system` for the system's trusted roots",
                    if self.mode == SslMode::VerifyCa { "verify-ca" } else { "verify-full" }
                ))
            }
            Some(Roots::System) => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = store.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(format!(
                        "sslrootcert=system: no trusted root certificates were found on this machine ({} errors)",
                        found.errors.len()
                    ));
                }
            }
            Some(Roots::File(path)) => {
                let shown = path.display();
                let certs = CertificateDer::pem_file_iter(path)
                    .map_err(|e| format!("cannot read the root certificate file {shown}: {e}"))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("{shown} is not a PEM certificate file: {e}"))?;
                let (added, _) = store.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!("{shown} holds no usable certificate (PEM `BEGIN CERTIFICATE` blocks)"));
                }
            }
        }
        Ok(store)
    }
}

/// rustls for tokio-postgres, also for connections without a host name (a Unix socket):
/// tokio-postgres asks for a TLS connector before it knows whether TLS will be used, and
/// refuses a handshake without a host name itself. An empty TCP host name does reach the
/// handshake; the store refuses it with verify-full, the one mode that checks the name, and the
/// placeholder is a reserved name (RFC 2606) no certificate should carry.
#[derive(Clone)]
pub struct Connector(MakeRustlsConnect);

impl<S> MakeTlsConnect<S> for Connector
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<Self::TlsConnect, Self::Error> {
        let name = if hostname.is_empty() { "rdeploy.invalid" } else { hostname };
        MakeTlsConnect::<S>::make_tls_connect(&mut self.0, name)
    }
}

/// Whether a connection error is a verdict on the server's certificate, which retrying
/// cannot change (other TLS errors, such as a proxy restarting mid-handshake, are retried).
pub fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let verdict = |e: &rustls::Error| {
        matches!(
            e,
            rustls::Error::InvalidCertificate(_)
                | rustls::Error::NoCertificatesPresented
                | rustls::Error::UnsupportedNameType
        )
    };
    let mut source = Some(e);
    while let Some(s) = source {
        if s.downcast_ref::<rustls::Error>().is_some_and(verdict) {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()).is_some_and(verdict) {
                return true;
            }
        }
        source = s.source();
    }
    false
}

/// `require` without root certificates (and `prefer`): encrypted, not authenticated, as libpq
/// does. The handshake signatures are still checked, so the session keys are the server's.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not compared.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn libpq_parameters_are_taken_off_the_url_and_the_rest_kept() {
        let (url, tls) = split(
            "postgres://u@db.internal:5432/rdeploy?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=5",
            no_env,
        )
        .unwrap();
        assert_eq!(url, "postgres://u@db.internal:5432/rdeploy?application_name=x&connect_timeout=5");
        assert_eq!(tls, Tls { mode: SslMode::VerifyFull, roots: Some(Roots::File("/etc/ca.pem".into())) });
        assert_eq!(tls.check(), Check::ChainAndName);
    }

    #[test]
    fn defaults_follow_libpq() {
        let (url, tls) = split("postgres://u@h/db", no_env).unwrap();
        assert_eq!(url, "postgres://u@h/db");
        assert_eq!(tls, Tls { mode: SslMode::Prefer, roots: None });
        assert_eq!(tls.check(), Check::Nothing);

        let env = |k: &str| match k {
            "PGSSLMODE" => Some("require".to_string()),
            "PGSSLROOTCERT" => Some("/etc/ca.pem".to_string()),
            _ => None,
        };
        let (_, tls) = split("postgres://u@h/db", env).unwrap();
        assert_eq!(tls, Tls { mode: SslMode::Require, roots: Some(Roots::File("/etc/ca.pem".into())) });
        // libpq: with a root certificate, `require` verifies the chain like `verify-ca`.
        assert_eq!(tls.check(), Check::Chain);
        // The URL wins over the environment; an empty sslrootcert is "not given".
        let (_, tls) = split("postgres://u@h/db?sslmode=disable&sslrootcert=", env).unwrap();
        assert_eq!(tls, Tls { mode: SslMode::Disable, roots: Some(Roots::File("/etc/ca.pem".into())) });
    }

    #[test]
    fn the_system_store_is_only_used_with_a_host_name_check() {
        let (_, tls) = split("postgres://u@h/db?sslrootcert=system", no_env).unwrap();
        assert_eq!(tls, Tls { mode: SslMode::VerifyFull, roots: Some(Roots::System) });
        for weak in ["prefer", "require", "verify-ca"] {
            let e = split(&format!("postgres://u@h/db?sslrootcert=system&sslmode={weak}"), no_env).unwrap_err();
            assert!(e.contains("needs sslmode=verify-full"), "{e}");
        }
    }

    #[test]
    fn bad_settings_are_named() {
        let e = split("postgres://u@h/db?sslmode=verify", no_env).unwrap_err();
        assert!(e.contains("unknown sslmode `verify`"), "{e}");
        let e = split("postgres://u@h/db?sslcert=c.pem", no_env).unwrap_err();
        assert!(e.contains("client certificates are not supported"), "{e}");
        let (_, tls) = split("postgres://u@h/db?sslmode=verify-ca", no_env).unwrap();
        let e = tls.connector().err().unwrap();
        assert!(e.contains("sslmode=verify-ca needs the root certificate"), "{e}");
        let (_, tls) = split("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem", no_env).unwrap();
        let e = tls.connector().err().unwrap();
        assert!(e.contains("cannot read the root certificate file /nonexistent/ca.pem"), "{e}");
    }
}
