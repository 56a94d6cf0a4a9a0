//! The visibility API's TLS: its certificate (given, or self-signed at start), the listener
//! that completes handshakes off the accept loop, and which connections come from the API
//! server's front proxy (their client certificate chains to the cluster's request-header CA).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;

use super::auth::FrontProxy;

/// Where and how the visibility API serves.
#[derive(Clone, Debug)]
pub struct Options {
    /// The address to listen on (`--visibility-addr`).
    pub addr: SocketAddr,
    /// The server's certificate chain (PEM, `--visibility-tls-cert-file`); None with
    /// `key_file` None: a self-signed certificate made at start.
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM, `--visibility-tls-key-file`).
    pub key_file: Option<PathBuf>,
}

/// The connection a request came over: its peer, and whether that peer presented a client
/// certificate of the cluster's front proxy (only then are `X-Remote-*` headers believed).
#[derive(Clone, Debug)]
pub struct Peer {
    /// The remote address.
    pub addr: SocketAddr,
    /// The front proxy's certificate was verified on this connection.
    pub front_proxy: bool,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Peer {
        stream.remote_addr().clone()
    }
}

/// Accepts TCP connections and completes their TLS handshakes off the accept loop (a slow
/// client delays only itself), handing each finished one to the server.
pub struct TlsListener {
    local: SocketAddr,
    ready:
        tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, Peer)>,
}

/// Handshakes under way at most; more wait in the kernel's backlog.
const HANDSHAKES: usize = 64;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl TlsListener {
    /// Listens on `addr` with `config`; front-proxy certificates are those
    /// [`FrontProxy::allows`].
    pub async fn bind(
        addr: SocketAddr,
        config: Arc<rustls::ServerConfig>,
        front_proxy: Option<FrontProxy>,
    ) -> std::io::Result<TlsListener> {
        let tcp = tokio::net::TcpListener::bind(addr).await?;
        let local = tcp.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(HANDSHAKES);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let limit = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let (stream, remote) = match tcp.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "visibility API: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    return;
                };
                let (acceptor, tx, front_proxy) =
                    (acceptor.clone(), tx.clone(), front_proxy.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, %remote, "visibility API: TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    let front = front_proxy.as_ref().is_some_and(|fp| {
                        tls.get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(|der| common_name(der.as_ref()))
                            .is_some_and(|cn| fp.allows(&cn))
                    });
                    let _ = tx
                        .send((
                            tls,
                            Peer {
                                addr: remote,
                                front_proxy: front,
                            },
                        ))
                        .await;
                });
            }
        });
        Ok(TlsListener { local, ready })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop ended (it never does while the process runs): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Peer> {
        Ok(Peer {
            addr: self.local,
            front_proxy: false,
        })
    }
}

/// The subject common name of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// The server's certificate chain and key: from `options`' files, or (neither given) a
/// self-signed certificate for `localhost`, `127.0.0.1` and this host's name, made now.
///
/// Errors: only one of the two files given, unreadable or invalid PEM.
fn certificate(
    options: &Options,
) -> anyhow::Result<(
    Vec<rustls_pki_types::CertificateDer<'static>>,
    rustls_pki_types::PrivateKeyDer<'static>,
)> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    match (&options.cert_file, &options.key_file) {
        (Some(cert_file), Some(key_file)) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
                .with_context(|| format!("--visibility-tls-cert-file {}", cert_file.display()))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("--visibility-tls-cert-file {}", cert_file.display()))?;
            anyhow::ensure!(
                !certs.is_empty(),
                "--visibility-tls-cert-file {} holds no certificate",
                cert_file.display()
            );
            let key = PrivateKeyDer::from_pem_file(key_file)
                .with_context(|| format!("--visibility-tls-key-file {}", key_file.display()))?;
            Ok((certs, key))
        }
        (None, None) => {
            let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
            if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
                names.push(host.trim().to_string());
            }
            let made = rcgen::generate_simple_self_signed(names)
                .context("making a self-signed certificate for the visibility API")?;
            let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
                .map_err(|e| anyhow::anyhow!("the self-signed certificate's key: {e}"))?;
            Ok((vec![made.cert.der().clone()], key))
        }
        _ => anyhow::bail!(
            "--visibility-tls-cert-file and --visibility-tls-key-file go together: give both, or neither for a self-signed certificate"
        ),
    }
}

/// The TLS settings: the server's certificate ([`certificate`]), and, with `front_proxy`,
/// client certificates of its CA accepted (not required: a bearer token needs none).
///
/// Errors: the certificate's, an invalid request-header CA, a key that does not match.
pub fn tls_config(
    options: &Options,
    front_proxy: Option<&FrontProxy>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let (certs, key) = certificate(options)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match front_proxy {
        Some(fp) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(fp.client_ca_pem.as_bytes()) {
                roots
                    .add(ca.context("the request-header CA of extension-apiserver-authentication")?)
                    .context("the request-header CA of extension-apiserver-authentication")?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .context("the front proxy's client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the visibility API's certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
