//! TLS trust against a real HTTPS server on loopback, with a throwaway CA made by rcgen: the
//! configured CA bundle is trusted, nothing else is, and the lab opt-out really is explicit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use orchestrator_bmc::{Bmc, BmcEndpoint, BmcError, Credentials, HttpClients, RedfishBmc, RetryPolicy, TlsTrust};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            // A client that rejects our certificate aborts the handshake; keep serving the others.
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// Writes a CA PEM to a temp dir and serves a service root over HTTPS with a leaf signed by it.
async fn https_server() -> (SocketAddr, tempfile::TempDir) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();

    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
        )
        .unwrap();
    let listener = TlsListener {
        tcp: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        acceptor: TlsAcceptor::from(Arc::new(config)),
    };
    let addr = axum::serve::Listener::local_addr(&listener).unwrap();
    let app = Router::new().route("/redfish/v1", get(|| async { r#"{"RedfishVersion":"1.15.0"}"# }));
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, dir)
}

fn endpoint(addr: SocketAddr, tls: TlsTrust) -> BmcEndpoint {
    BmcEndpoint::new(
        format!("https://{addr}").parse().unwrap(),
        Credentials::new("root", "pw"),
    )
    .with_tls(tls)
    .with_retry(RetryPolicy {
        max_retries: 0,
        deadline: Duration::from_secs(5),
        ..RetryPolicy::default()
    })
}

#[tokio::test]
async fn configured_ca_is_trusted_and_nothing_else() {
    let (addr, dir) = https_server().await;
    let clients = HttpClients::new();

    let trusted = endpoint(
        addr,
        TlsTrust::CaBundle {
            path: dir.path().join("ca.pem"),
        },
    );
    let info = RedfishBmc::new(&trusted, &clients).unwrap().probe().await.unwrap();
    assert_eq!(info.redfish_version, "1.15.0");

    // The system store does not know our private CA.
    let err = RedfishBmc::new(&endpoint(addr, TlsTrust::System), &clients)
        .unwrap()
        .probe()
        .await
        .unwrap_err();
    assert!(matches!(err, BmcError::CertificateRejected { .. }), "{err:?}");
    assert!(
        !err.is_transient(),
        "a bad certificate does not fix itself; retrying only hides it"
    );

    // Another CA's bundle must not validate this server either.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = CertificateParams::new(Vec::<String>::new()).unwrap();
    other.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let other = CertifiedIssuer::self_signed(other, KeyPair::generate().unwrap()).unwrap();
    std::fs::write(other_dir.path().join("ca.pem"), other.pem()).unwrap();
    let wrong = endpoint(
        addr,
        TlsTrust::CaBundle {
            path: other_dir.path().join("ca.pem"),
        },
    );
    let err = RedfishBmc::new(&wrong, &clients).unwrap().probe().await.unwrap_err();
    assert!(matches!(err, BmcError::CertificateRejected { .. }), "{err:?}");

    // The explicit lab opt-out connects anyway.
    let lab = endpoint(
        addr,
        TlsTrust::InsecureSkipVerify {
            reason: "test rack".into(),
        },
    );
    assert!(RedfishBmc::new(&lab, &clients).unwrap().probe().await.is_ok());
}

#[tokio::test]
async fn a_bundle_without_certificates_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty.pem"), "not a pem\n").unwrap();
    let ep = endpoint(
        "127.0.0.1:1".parse().unwrap(),
        TlsTrust::CaBundle {
            path: dir.path().join("empty.pem"),
        },
    );
    let err = RedfishBmc::new(&ep, &HttpClients::new()).unwrap_err();
    assert_eq!(err.kind(), "config", "{err:?}");
}
