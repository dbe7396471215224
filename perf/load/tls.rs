//! STOMP over TLS for the harness (`--tls`): a rustls client session over a `TcpStream`, used
//! blocking (publishers, handshakes) or non-blocking (receiver groups under `poll(2)`).
//!
//! rustls reads at most 4 KiB from a socket per `read_tls`, which at fan-out rates would be many
//! more `read(2)`s than the plain path makes. So ciphertext is read here in one large `read(2)`
//! into `staged` and fed to rustls from memory; decrypted bytes go straight into the caller's
//! buffer. Bytes left in `staged` or in rustls are invisible to `poll(2)`, so
//! [`TlsStream::has_buffered_input`] tells the poll loops to read again without waiting.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

use crate::conn::LoadError;

/// The first handshake's version and cipher suite (`TLSv1_3 TLS13_AES_256_GCM_SHA384`), for
/// the report.
static NEGOTIATED: OnceLock<String> = OnceLock::new();

pub fn negotiated() -> Option<String> {
    NEGOTIATED.get().cloned()
}

/// What every TLS connection of a run shares: the client config and the name to verify.
#[derive(Clone, Debug)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

impl TlsClient {
    /// A client trusting only the PEM CA certificates in `ca_file`, verifying `server_name`
    /// (a DNS name, or an IP address matched against the certificate's IP SANs). Without
    /// `resume`, session resumption is off: every connection pays a full handshake.
    ///
    /// # Errors
    /// An unreadable CA file, no certificate in it, or an invalid server name.
    pub fn new(ca_file: &Path, server_name: &str, resume: bool) -> Result<TlsClient, LoadError> {
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(ca_file).map_err(|e| LoadError::Setup(format!("--tls-ca {}: {e}", ca_file.display())))?;
        for cert in certs {
            let cert = cert.map_err(|e| LoadError::Setup(format!("--tls-ca {}: {e}", ca_file.display())))?;
            roots.add(cert).map_err(|e| LoadError::Setup(format!("--tls-ca {}: {e}", ca_file.display())))?;
        }
        if roots.is_empty() {
            return Err(LoadError::Setup(format!("--tls-ca {}: no certificate in the file", ca_file.display())));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| LoadError::Setup(format!("TLS client config: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        if !resume {
            config.resumption = Resumption::disabled();
        }
        let server_name = ServerName::try_from(server_name.to_owned()).map_err(|e| LoadError::Setup(format!("--tls-server-name {server_name}: {e}")))?;
        Ok(TlsClient { config: Arc::new(config), server_name })
    }

    /// A new session (nothing sent yet: [`TlsStream::handshake`] does that).
    ///
    /// # Errors
    /// rustls refusing the config (it does not for one built by [`TlsClient::new`]).
    pub fn session(&self, tcp: TcpStream, staged: usize) -> Result<TlsStream, LoadError> {
        let mut tls = ClientConnection::new(Arc::clone(&self.config), self.server_name.clone()).map_err(|e| LoadError::Setup(format!("TLS session: {e}")))?;
        // Everything written is encrypted at once; `Conn`'s own write buffer is the bound.
        tls.set_buffer_limit(None);
        Ok(TlsStream { tcp, tls, staged: vec![0; staged].into_boxed_slice(), pos: 0, len: 0, eof: false, maybe_more: false })
    }
}

pub struct TlsStream {
    pub tcp: TcpStream,
    tls: ClientConnection,
    /// Ciphertext read from the socket; `staged[pos..len]` is not yet given to rustls.
    staged: Box<[u8]>,
    pos: usize,
    len: usize,
    /// The socket reached EOF, or the server sent close_notify.
    eof: bool,
    /// The last read filled the caller's buffer: rustls may hold more plaintext.
    maybe_more: bool,
}

impl TlsStream {
    /// Blocking handshake; a read timeout on the socket makes each wait end, and `expired` says
    /// whether to give up then.
    ///
    /// # Errors
    /// The handshake's failure (certificate not trusted, wrong name, protocol), EOF, or
    /// `TimedOut` once `expired()`.
    pub fn handshake(&mut self, expired: impl Fn() -> bool) -> io::Result<()> {
        while self.tls.is_handshaking() {
            match self.tls.complete_io(&mut self.tcp) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    if expired() {
                        return Err(io::Error::new(ErrorKind::TimedOut, "TLS handshake did not finish in time"));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if NEGOTIATED.get().is_none() {
            let version = self.tls.protocol_version().map_or_else(|| "?".to_owned(), |v| format!("{v:?}"));
            let suite = self.tls.negotiated_cipher_suite().map_or_else(|| "?".to_owned(), |s| format!("{:?}", s.suite()));
            let _ = NEGOTIATED.set(format!("{version} {suite}"));
        }
        // TLS 1.3: the client's Finished may still be queued.
        self.write_queued()
    }

    /// Decrypted bytes into `out`, as much as is at hand; reads the socket (once) only when
    /// nothing is. `Ok(0)` is EOF. Socket errors pass through (`WouldBlock` when non-blocking).
    pub fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        loop {
            filled += self.take_plaintext(&mut out[filled..])?;
            if filled == out.len() {
                self.maybe_more = true;
                return Ok(filled);
            }
            if self.pos < self.len {
                let n = self.tls.read_tls(&mut &self.staged[self.pos..self.len])?;
                if n == 0 {
                    // close_notify came: rustls reads nothing more.
                    self.eof = true;
                    self.pos = self.len;
                } else {
                    self.pos += n;
                }
                self.tls.process_new_packets().map_err(|e| io::Error::new(ErrorKind::InvalidData, e))?;
                continue;
            }
            self.maybe_more = false;
            if filled > 0 || self.eof {
                return Ok(filled);
            }
            let n = self.tcp.read(&mut self.staged)?;
            if n == 0 {
                self.eof = true;
                return Ok(0);
            }
            self.pos = 0;
            self.len = n;
        }
    }

    /// Plaintext rustls already decrypted; 0 when it has none.
    fn take_plaintext(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        match self.tls.reader().read(out) {
            Ok(0) => {
                self.eof = true; // close_notify, and nothing left before it
                Ok(0)
            }
            Ok(n) => Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Input already read from the socket that `poll(2)` cannot see.
    pub fn has_buffered_input(&self) -> bool {
        self.pos < self.len || self.maybe_more
    }

    /// Encrypts `data` into rustls's send queue (no socket I/O).
    pub fn queue(&mut self, data: &[u8]) -> io::Result<()> {
        self.tls.writer().write_all(data)
    }

    /// Blocking: encrypts and writes all of `data`.
    ///
    /// # Errors
    /// Socket errors (`WouldBlock` when SO_SNDTIMEO expires).
    pub fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.queue(data)?;
        self.write_queued()
    }

    /// Blocking: writes rustls's send queue out.
    fn write_queued(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::Error::new(ErrorKind::WriteZero, "socket closed")),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Non-blocking: writes what the socket takes of the send queue. `Ok(true)` when empty.
    pub fn write_some(&mut self) -> io::Result<bool> {
        match self.write_queued() {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn has_pending_write(&self) -> bool {
        self.tls.wants_write()
    }
}
