//! A listener's connections: each admitted within the caps (`connections`) and served by hyper
//! on a task of its own, over TLS where the listener has it (`--tls-cert`, `--tls-key`), or
//! answered 503. A trusted proxy's request (`--trusted-proxy`) is the client's it forwards
//! for: its address in the caps, the log and the handlers.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tower::ServiceExt;

use crate::connections::Connections;
use crate::http;
use crate::log::log;
use crate::refusal_log;
use crate::routes::{self, Side};
use crate::server::Server;

/// The most a request head may take, and its most header lines.
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;
/// How long the listener waits after a failed accept before it tries again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// How long a refused TLS client has to finish its handshake and be told 503.
const REFUSAL_HANDSHAKE: Duration = Duration::from_secs(1);

/// The TLS a listener speaks: its certificate chain and key, read from PEM files.
#[derive(Clone)]
pub struct Tls(TlsAcceptor);

impl Tls {
    /// The chain in `certificate` (the server's certificate first) and the key in `key`.
    pub fn load(certificate: &Path, key: &Path) -> Result<Self, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(certificate)
            .and_then(Iterator::collect)
            .map_err(|err| format!("--tls-cert {}: {err}", certificate.display()))?;
        if chain.is_empty() {
            return Err(format!(
                "--tls-cert {}: no certificate in it",
                certificate.display()
            ));
        }
        let private_key =
            PrivateKeyDer::from_pem_file(key).map_err(|err| format!("--tls-key {}: {err}", key.display()))?;
        // rustls's provider is ring, the one its features name (Cargo.toml).
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, private_key)
            .map_err(|err| format!("--tls-cert and --tls-key: {err}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self(TlsAcceptor::from(Arc::new(config))))
    }
}

/// Takes connections on `listener` while `connections`' caps allow, each served on a task of
/// its own: its TLS handshake (with `tls`) and then its request head each within
/// `--idle-timeout`, or it is closed unanswered. Past a cap a connection is answered 503 before
/// its request is read.
pub async fn accept(
    server: Arc<Server>,
    listener: TcpListener,
    connections: Arc<Connections>,
    side: Side,
    tls: Option<Tls>,
) {
    let router = routes::router(server.clone(), side);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors, say: a pause, not a loop that spins on the error.
                log!("cannot accept a connection: {err}");
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        let Ok(local) = stream.local_addr() else { continue };
        let proxy = server.trusted_proxies.trusts(peer.ip());
        let admitted = match connections.admit(peer.ip(), proxy) {
            Ok(admitted) => admitted,
            Err(why) => {
                refusal_log::refused(503, || format!("refused {peer}: {why}"));
                server.metrics.refused(503);
                tokio::spawn(refuse(stream, tls.clone(), why));
                continue;
            }
        };
        let connection = routes::Connection {
            peer,
            local,
            admitted: Arc::new(admitted),
        };
        let router = router.clone();
        let idle_timeout = server.idle_timeout;
        let tls = tls.clone();
        let proxied = proxy.then(|| server.clone());
        tokio::spawn(async move {
            let served = match tls {
                None => serve(stream, router, connection, proxied, idle_timeout).await,
                Some(Tls(acceptor)) => {
                    match tokio::time::timeout(idle_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => serve(stream, router, connection, proxied, idle_timeout).await,
                        Ok(Err(err)) => Err(format!("TLS handshake failed: {err}")),
                        Err(_) => Err(format!("no TLS handshake in {idle_timeout:?}, closed")),
                    }
                }
            };
            if let Err(why) = served {
                log!("{peer}: {why}");
            }
        });
    }
}

/// One request on `io` (each connection is counted against the caps), routed by `router`;
/// `proxied`: the connection is a trusted proxy's, and its request names the client.
async fn serve<I>(
    io: I,
    router: axum::Router,
    connection: routes::Connection,
    proxied: Option<Arc<Server>>,
    idle_timeout: Duration,
) -> Result<(), String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let (router, mut connection, proxied) = (router.clone(), connection.clone(), proxied.clone());
        async move {
            if let Some(server) = proxied {
                match forwarded_client(&server, &connection, request.headers()) {
                    Ok(client) => connection.peer = client,
                    Err((status, why)) => {
                        let peer = connection.peer;
                        refusal_log::refused(status, || format!("refused {peer}: {status} {why}"));
                        server.metrics.refused(status);
                        return Ok(http::respond(status, "text/plain", format!("{why}\n")));
                    }
                }
            }
            request.extensions_mut().insert(connection);
            router.oneshot(request.map(axum::body::Body::new)).await
        }
    });
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(idle_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await
        .map_err(|err| match err.is_timeout() {
            true => format!("sent no request in {idle_timeout:?}, closed"),
            false => err.to_string(),
        })
}

/// The client a trusted proxy's request comes for (`X-Forwarded-For`), counted against its
/// cap; its port is the proxy's to know, and is 0 here. Else the status to answer, and why.
fn forwarded_client(
    server: &Server,
    connection: &routes::Connection,
    headers: &hyper::HeaderMap,
) -> Result<SocketAddr, (u16, String)> {
    let forwarded = headers
        .get_all("x-forwarded-for")
        .iter()
        .map(|value| {
            value
                .to_str()
                .map_err(|_| "X-Forwarded-For is not ASCII".to_owned())
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|why| (400, why))?;
    let client = server
        .trusted_proxies
        .client(connection.peer.ip(), forwarded)
        .map_err(|why| (400, why))?;
    connection
        .admitted
        .forwarded_for(client)
        .map_err(|why| (503, why))?;
    Ok(SocketAddr::new(client, 0))
}

/// A connection past the caps, answered 503 without waiting for its request (over TLS once
/// the handshake is done, if it is done soon).
async fn refuse(stream: tokio::net::TcpStream, tls: Option<Tls>, why: String) {
    let body = format!("{why}\n");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    match tls {
        None => {
            let mut stream = stream;
            let _ = tokio::time::timeout(http::SHORT_WRITE, stream.write_all(response.as_bytes())).await;
        }
        Some(Tls(acceptor)) => {
            let _ = tokio::time::timeout(REFUSAL_HANDSHAKE, async {
                let mut stream = acceptor.accept(stream).await?;
                stream.write_all(response.as_bytes()).await?;
                stream.shutdown().await
            })
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate and its key in PEM files in `folder`.
    fn certificate(folder: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let certified = rcgen::generate_simple_self_signed(vec!["tts.example.org".into()]).unwrap();
        let (certificate, key) = (
            folder.join(format!("{name}.pem")),
            folder.join(format!("{name}.key")),
        );
        std::fs::write(&certificate, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        (certificate, key)
    }

    fn refusal(certificate: &Path, key: &Path) -> String {
        Tls::load(certificate, key).err().expect("loaded")
    }

    #[test]
    fn a_certificate_and_its_key_load_and_what_does_not_fit_is_named() {
        let folder = tempfile::tempdir().unwrap();
        let (certificate, key) = certificate(folder.path(), "one");
        assert!(Tls::load(&certificate, &key).is_ok());

        let missing = folder.path().join("missing.key");
        let why = refusal(&certificate, &missing);
        assert!(
            why.starts_with(&format!("--tls-key {}: ", missing.display())),
            "{why}"
        );
        // The key given as the certificate: PEM, but no certificate in it.
        let why = refusal(&key, &key);
        assert_eq!(why, format!("--tls-cert {}: no certificate in it", key.display()));
        // Another certificate's key.
        let (_, other_key) = self::certificate(folder.path(), "other");
        let why = refusal(&certificate, &other_key);
        assert!(why.starts_with("--tls-cert and --tls-key: "), "{why}");
    }
}
