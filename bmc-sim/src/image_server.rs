//! An HTTP server for firmware images: what a BMC's `SimpleUpdate` pulls its `ImageURI` from.
//!
//! Real deployments serve images from an artifact store; the simulated world (`waveguard simulate`,
//! `demo`, `bench`) and every test that flashes bmc-sim need one on loopback. This is the one copy: a
//! store of files by path, served read-only with `GET`, to which files can be added while it runs (a
//! release registered mid-run needs its image). It aborts when dropped, so a failing test leaves
//! nothing listening.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use tokio::task::JoinHandle;

type Files = Arc<RwLock<BTreeMap<String, Vec<u8>>>>;

/// A running image server on loopback; see the [module docs](self).
#[derive(Debug)]
pub struct ImageServer {
    addr: SocketAddr,
    files: Files,
    task: JoinHandle<()>,
}

impl ImageServer {
    /// Binds `127.0.0.1:0` and serves `files` (path without the leading `/` -> bytes).
    pub async fn start(files: impl IntoIterator<Item = (String, Vec<u8>)>) -> std::io::Result<ImageServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        Self::serve(listener, files)
    }

    /// Serves `files` on a bound `listener` (tests and commands bind port 0).
    pub fn serve(
        listener: tokio::net::TcpListener,
        files: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> std::io::Result<ImageServer> {
        let addr = listener.local_addr()?;
        let files: Files = Arc::new(RwLock::new(files.into_iter().collect()));
        let app = Router::new().route("/{*path}", get(file)).with_state(files.clone());
        let task = tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                tracing::error!(error = %err, "image server stopped");
            }
        });
        Ok(ImageServer { addr, files, task })
    }

    /// Adds (or replaces) the file at `path` and returns its URL.
    pub fn insert(&self, path: &str, bytes: Vec<u8>) -> String {
        let path = path.trim_start_matches('/');
        self.files
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(path.to_owned(), bytes);
        self.url(path)
    }

    /// The URL of `path` on this server (whether or not it is there).
    pub fn url(&self, path: &str) -> String {
        format!("{}/{}", self.base_url(), path.trim_start_matches('/'))
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ImageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn file(State(files): State<Files>, Path(path): Path<String>) -> (StatusCode, Vec<u8>) {
    let found = files.read().unwrap_or_else(PoisonError::into_inner).get(&path).cloned();
    match found {
        Some(bytes) => (StatusCode::OK, bytes),
        None => (StatusCode::NOT_FOUND, Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::ImageServer;

    #[tokio::test]
    async fn serves_files_added_before_and_after_start_and_404s_the_rest() {
        let server = ImageServer::start([("images/a.fw".to_owned(), b"a".to_vec())])
            .await
            .unwrap();
        let late = server.insert("/images/b.fw", b"b".to_vec());
        assert_eq!(late, format!("{}/images/b.fw", server.base_url()));
        let http = reqwest::Client::new();
        for (path, status, body) in [
            ("images/a.fw", 200, "a"),
            ("images/b.fw", 200, "b"),
            ("images/c.fw", 404, ""),
        ] {
            let response = http.get(server.url(path)).send().await.unwrap();
            assert_eq!(response.status().as_u16(), status, "{path}");
            assert_eq!(response.text().await.unwrap(), body, "{path}");
        }
    }
}
