//! Log output: text or JSON lines on stderr, filtered like `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber.
pub fn init(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    // sqlx logs every statement at info; that is noise for operators.
    let filter = EnvFilter::try_new(format!("{filter},sqlx=warn,sea_orm=warn"))
        .map_err(|err| anyhow::anyhow!("invalid log filter {filter:?}: {err}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
    installed.map_err(|err| anyhow::anyhow!("cannot install the logger: {err}"))
}
