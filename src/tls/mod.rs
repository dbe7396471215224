//! STOMP over TLS: the listener's rustls configuration, re-read on SIGHUP, and the peer
//! identity of a mutual-TLS client.
//!
//! Why futures-rustls over glommio's own `TcpStream` (and not rustls' `ServerConnection`
//! driven by hand): glommio's stream already implements futures-io, so the handshake and every
//! later read and write run on the accepting core's executor as ordinary futures, with no
//! extra thread and no second copy of the read/write-readiness logic that futures-rustls has
//! already got right (partial records, close_notify, write-while-reading).
//!
//! Why an `ArcSwap`: every accept on every core reads the current configuration, and SIGHUP
//! replaces it from another thread; a lock-free load keeps the accept path free of a mutex,
//! and connections already open keep the configuration they were accepted with.
mod identity;

pub use identity::common_name;

use crate::config::StompTls;
use arc_swap::ArcSwap;
use bytes::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use std::sync::Arc;

/// The STOMP TLS listener's configuration: the files it comes from and what was last loaded
/// from them.
pub struct Tls {
    files: StompTls,
    current: ArcSwap<ServerConfig>,
}

impl Tls {
    /// Loads the certificate chain, key and optional client CA. `Err` is a one-line reason.
    pub fn load(files: &StompTls) -> Result<Tls, String> {
        let config = server_config(files)?;
        Ok(Tls { files: files.clone(), current: ArcSwap::from_pointee(config) })
    }

    /// What a new connection is handshaken with.
    pub fn acceptor(&self) -> futures_rustls::TlsAcceptor {
        futures_rustls::TlsAcceptor::from(self.current.load_full())
    }

    /// Re-reads the files (SIGHUP). New connections use the new configuration; on any error the
    /// old one stays and the reason is logged.
    pub fn reload(&self) {
        match server_config(&self.files) {
            Ok(config) => {
                self.current.store(Arc::new(config));
                tracing::info!(cert = %self.files.cert_file.display(), "TLS certificate and key reloaded");
            }
            Err(reason) => tracing::error!(%reason, "TLS reload refused; keeping the previous certificate"),
        }
    }
}

/// The transport identity of a mutual-TLS client: its leaf certificate's subject CN. `None`
/// without a client certificate or without a CN.
pub fn peer_identity(conn: &rustls::ServerConnection) -> Option<Bytes> {
    let leaf = conn.peer_certificates()?.first()?;
    common_name(leaf.as_ref()).filter(|cn| !cn.is_empty()).map(Bytes::copy_from_slice)
}

fn server_config(files: &StompTls) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = read_certs(&files.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&files.key_file).map_err(|e| format!("cannot read a private key from {}: {e}", files.key_file.display()))?;
    // TLS 1.2 and 1.3 only: rustls implements nothing older, and this makes it explicit.
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca_file)? {
                roots.add(cert).map_err(|e| format!("invalid CA certificate in {}: {e}", ca_file.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("invalid client CA {}: {e}", ca_file.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    builder.with_single_cert(chain, key).map_err(|e| format!("invalid certificate/key pair {}: {e}", files.cert_file.display()))
}

fn read_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(certs)
}
