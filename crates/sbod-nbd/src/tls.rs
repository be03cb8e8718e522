//! TLS for NBD (NBD_OPT_STARTTLS): rustls with the ring provider, certificates in PEM.
//!
//! File layout follows libnbd/nbdkit/qemu: a client's `tls-certificates=DIR` holds
//! `ca-cert.pem` (and `client-cert.pem` + `client-key.pem` if the server wants them).

use crate::uri::{NbdUri, Transport};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io;
use std::path::Path;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn bad(what: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {e}", what.display()),
    )
}

fn certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let v = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(path, e))?;
    if v.is_empty() {
        return Err(bad(path, "no certificate in the file"));
    }
    Ok(v)
}

fn key(path: &Path) -> io::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| bad(path, e))
}

/// The system's trust store (Debian's bundle).
const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The client configuration an `nbds://` URI asks for.
pub fn client_config(uri: &NbdUri) -> io::Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?;
    let builder = if uri.tls_verify_peer {
        let ca = match &uri.tls_certificates {
            Some(d) => d.join("ca-cert.pem"),
            None => SYSTEM_CAS.into(),
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(&ca)? {
            roots.add(c).map_err(|e| bad(&ca, e))?;
        }
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
    };
    let cfg = match &uri.tls_certificates {
        Some(d) if d.join("client-cert.pem").exists() => builder
            .with_client_auth_cert(
                certs(&d.join("client-cert.pem"))?,
                key(&d.join("client-key.pem"))?,
            )
            .map_err(|e| bad(d, e))?,
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// Wrap an NBD stream after the server acknowledged STARTTLS.
pub(crate) async fn connect<S>(
    s: S,
    uri: &NbdUri,
    cfg: Arc<rustls::ClientConfig>,
) -> io::Result<Box<dyn crate::client::Stream>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let name = match (&uri.tls_hostname, &uri.transport) {
        (Some(h), _) => h.clone(),
        (None, Transport::Tcp { host, .. }) => host.clone(),
        (None, Transport::Unix { .. }) => "localhost".into(),
    };
    let name = ServerName::try_from(name.clone()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{name}' is not a TLS server name: {e}"),
        )
    })?;
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, s)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake with {uri}: {e}")))?;
    Ok(Box::new(tls))
}

/// The server side: a certificate chain and its key, in PEM files.
pub fn server_config(cert: &Path, key_file: &Path) -> io::Result<Arc<rustls::ServerConfig>> {
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(certs(cert)?, key(key_file)?)
        .map_err(|e| bad(key_file, e))?;
    Ok(Arc::new(cfg))
}

/// `tls-verify-peer=false`: accept any certificate (encryption without authentication).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
