//! Connections: every BMC port's accepted connections, tagged with the BMC they reached, feed one
//! server; a connection dies with its BMC.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::state::FleetState;

/// Which BMC a connection reached; available to handlers as `ConnectInfo<BmcConn>`.
#[derive(Debug, Clone, Copy)]
pub struct BmcConn {
    /// Index of the BMC in the fleet.
    pub node: usize,
    /// The client's address.
    pub remote: SocketAddr,
}

impl Connected<IncomingStream<'_, FleetListener>> for BmcConn {
    fn connect_info(stream: IncomingStream<'_, FleetListener>) -> Self {
        *stream.remote_addr()
    }
}

/// Feeds connections accepted on every BMC port into one server.
#[derive(Debug)]
pub struct FleetListener {
    pub(crate) rx: mpsc::Receiver<(SimIo, BmcConn)>,
    pub(crate) local: SocketAddr,
}

impl Listener for FleetListener {
    type Io = SimIo;
    type Addr = BmcConn;

    async fn accept(&mut self) -> (SimIo, BmcConn) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // All accept loops ended (shutdown); graceful shutdown ends the server.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<BmcConn> {
        Ok(BmcConn {
            node: usize::MAX,
            remote: self.local,
        })
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection to one BMC that fails as soon as that BMC is silent (reset in progress, bricked), so
/// kept-alive connections die with the BMC like real ones do. Counted while open (see
/// [`crate::RunningFleet::connections`]).
pub struct SimIo {
    inner: Stream,
    state: Arc<FleetState>,
    node: usize,
}

impl SimIo {
    fn new(inner: Stream, state: Arc<FleetState>, node: usize) -> Self {
        state.connections.opened();
        Self { inner, state, node }
    }
}

impl Drop for SimIo {
    fn drop(&mut self) {
        self.state.connections.closed();
    }
}

impl std::fmt::Debug for SimIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimIo")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl SimIo {
    fn check(&self) -> io::Result<()> {
        let now = self.state.clock.now().timestamp_millis();
        match self.state.node(self.node) {
            Some(n) if n.is_down(now) => Err(io::Error::new(io::ErrorKind::ConnectionReset, "BMC is not answering")),
            _ => Ok(()),
        }
    }
}

impl AsyncRead for SimIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.check() {
            return Poll::Ready(Err(e));
        }
        match &mut self.inner {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for SimIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check() {
            return Poll::Ready(Err(e));
        }
        match &mut self.inner {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

pub(crate) async fn accept_loop(
    listener: TcpListener,
    index: usize,
    state: Arc<FleetState>,
    tx: mpsc::Sender<(SimIo, BmcConn)>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (stream, remote) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Usually EMFILE under load: back off instead of spinning.
                tracing::debug!(error = %e, node = index, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let now = state.clock.now().timestamp_millis();
        if state.node(index).is_some_and(|n| n.is_down(now)) {
            // A resetting or bricked BMC does not answer: close at once.
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let conn = BmcConn { node: index, remote };
        match &tls {
            None => {
                let io = SimIo::new(Stream::Plain(stream), state.clone(), index);
                if tx.send((io, conn)).await.is_err() {
                    return;
                }
            }
            Some(acceptor) => {
                let (acceptor, tx, state) = (acceptor.clone(), tx.clone(), state.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let io = SimIo::new(Stream::Tls(Box::new(tls)), state, index);
                            let _ = tx.send((io, conn)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, node = index, "TLS handshake failed"),
                        Err(_) => tracing::debug!(node = index, "TLS handshake timed out"),
                    }
                });
            }
        }
    }
}
