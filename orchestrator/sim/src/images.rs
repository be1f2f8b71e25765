//! The loopback HTTP server the simulated BMCs pull firmware images from.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::get;
use tokio::task::JoinHandle;

/// Images served to the BMCs, by file name; the demo adds releases later.
pub(crate) type ImageStore = Arc<RwLock<BTreeMap<String, Vec<u8>>>>;

/// Serves `images` at `{base}/{file}` on a loopback port; returns the base
/// URL and the server's task.
pub(crate) async fn serve_images(images: ImageStore) -> std::io::Result<(String, JoinHandle<()>)> {
    async fn image(State(images): State<ImageStore>, UrlPath(name): UrlPath<String>) -> (StatusCode, Vec<u8>) {
        let found = images.read().unwrap_or_else(|p| p.into_inner()).get(&name).cloned();
        match found {
            Some(bytes) => (StatusCode::OK, bytes),
            None => (StatusCode::NOT_FOUND, Vec::new()),
        }
    }
    let app = Router::new().route("/images/{name}", get(image)).with_state(images);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "image server stopped");
        }
    });
    Ok((format!("http://{addr}/images"), task))
}
