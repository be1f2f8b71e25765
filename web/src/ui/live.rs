//! Live rollout pages over one server-sent-events stream per browser.
//!
//! A browser speaks HTTP/1.1 to a cleartext demo or proxy and keeps at most
//! six connections per host; a stream per tab would hold one each, so the
//! seventh tab would never load. The page's script therefore shares one
//! stream between all the browser's tabs (a `SharedWorker`, or a leader tab
//! over `BroadcastChannel`), and this module serves that one stream for any
//! set of rollouts:
//!
//! - `GET /events?rollouts=1,2` opens it. Its first event, `hello`, names the
//!   stream; then each `rollout` event carries, for one rollout, only the
//!   parts of the page that changed since this stream last sent them: the
//!   live part's fragments (elements marked `data-fragment`, keyed by their
//!   `id`: the state card, each wave, the scheduler table), or the whole live
//!   part when its shape changed (a wave appeared), and `nodes: true` when a
//!   step changed, so each tab fetches its own page of the node table under
//!   its own filters (`GET /rollouts/{id}/nodes`) rather than the stream
//!   re-sending every step.
//! - `GET /events/{stream}/watch?rollouts=1,2,5` replaces the set the stream
//!   watches, so a tab opening or closing changes it without a new connection.
//!   It is a read of the caller's own stream (nothing stored changes), so a
//!   viewer may call it, and only the user who opened the stream can.
//!
//! Fragments are rendered for the stream's user (their buttons, their CSRF
//! token): tabs share a stream only within one session (the script keys it
//! by the session's CSRF token).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use orchestrator_db::execution::StepRevision;
use orchestrator_types::{RolloutId, WaveId};
use serde::Deserialize;
use serde_json::json;

use super::{UiError, render_string, rollout};
use crate::AppState;
use crate::auth::Principal;

/// How often a stream re-reads the rollouts it watches.
const LIVE_POLL: Duration = Duration::from_secs(1);
/// Rollouts one stream may watch: a browser with more live tabs than this
/// is not a person reading them.
pub(crate) const MAX_WATCHED: usize = 32;

/// The open streams, so a tab can change what its browser's stream watches.
#[derive(Default)]
pub(crate) struct LiveStreams {
    streams: Mutex<HashMap<String, Watcher>>,
}

struct Watcher {
    /// Who opened the stream: only they may change what it watches.
    owner: String,
    rollouts: tokio::sync::watch::Sender<BTreeSet<RolloutId>>,
}

impl LiveStreams {
    fn open(self: &Arc<Self>, owner: &str, rollouts: BTreeSet<RolloutId>) -> (StreamGuard, Receiver) {
        let id = crate::auth::new_secret();
        let (sender, receiver) = tokio::sync::watch::channel(rollouts);
        self.lock().insert(
            id.clone(),
            Watcher {
                owner: owner.to_owned(),
                rollouts: sender,
            },
        );
        (
            StreamGuard {
                streams: Arc::clone(self),
                id,
            },
            receiver,
        )
    }

    /// Replaces the set `stream` watches; `false` when it is not open or
    /// not `owner`'s.
    fn watch(&self, stream: &str, owner: &str, rollouts: BTreeSet<RolloutId>) -> bool {
        match self.lock().get(stream) {
            Some(watcher) if watcher.owner == owner => {
                watcher.rollouts.send_replace(rollouts);
                true
            }
            _ => false,
        }
    }

    /// Streams open now.
    pub(crate) fn open_count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watcher>> {
        // A panic while holding the lock leaves a map that is still whole.
        self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::fmt::Debug for LiveStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Stream ids name a browser's stream: not shown.
        f.debug_struct("LiveStreams").field("open", &self.open_count()).finish()
    }
}

type Receiver = tokio::sync::watch::Receiver<BTreeSet<RolloutId>>;

/// Forgets its stream when the response ends (the browser went away).
struct StreamGuard {
    streams: Arc<LiveStreams>,
    id: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.streams.lock().remove(&self.id);
    }
}

/// `?rollouts=1,2,3`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RolloutsQuery {
    #[serde(default)]
    rollouts: String,
}

impl RolloutsQuery {
    fn parse(&self) -> Result<BTreeSet<RolloutId>, UiError> {
        let ids = self
            .rollouts
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<i64>().map(RolloutId).map_err(|_| {
                    UiError::new(
                        StatusCode::BAD_REQUEST,
                        format!("rollouts must be rollout ids separated by commas, not {s:?}"),
                    )
                })
            })
            .collect::<Result<BTreeSet<_>, _>>()?;
        if ids.len() > MAX_WATCHED {
            return Err(UiError::new(
                StatusCode::BAD_REQUEST,
                format!("at most {MAX_WATCHED} rollouts per stream"),
            ));
        }
        Ok(ids)
    }
}

/// What a stream last sent for one rollout, so it sends only changes.
#[derive(Default)]
struct Sent {
    /// Fragment ids in page order, and a hash of each one's HTML.
    fragments: Vec<(String, u64)>,
    steps: Option<StepRevision>,
    /// What each approval's next wave takes out of service (see
    /// [`rollout::live_context`]).
    capacity: Option<HashMap<WaveId, String>>,
}

struct StreamState {
    app: AppState,
    me: Principal,
    watched: Receiver,
    sent: HashMap<RolloutId, Sent>,
    _guard: StreamGuard,
}

/// `GET /events?rollouts=…`: the browser's one live stream.
pub(crate) async fn events(
    State(app): State<AppState>,
    Extension(me): Extension<Principal>,
    Query(query): Query<RolloutsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, UiError> {
    let rollouts = query.parse()?;
    let (guard, watched) = app.live.open(&me.user.username, rollouts);
    let hello = Event::default()
        .event("hello")
        .data(json!({ "stream": guard.id }).to_string());
    let state = StreamState {
        app,
        me,
        watched,
        sent: HashMap::new(),
        _guard: guard,
    };
    let updates = futures::stream::unfold(state, |mut state| async move {
        loop {
            let events = changes(&mut state).await;
            if !events.is_empty() {
                return Some((futures::stream::iter(events), state));
            }
            // Wait for the next poll, or sooner for a change of the watched
            // set, so a tab that just subscribed is caught up at once.
            let _ = tokio::time::timeout(LIVE_POLL, state.watched.changed()).await;
        }
    })
    .flatten();
    let stream = futures::stream::once(async move { Ok(hello) }).chain(updates);
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// One poll: an event per watched rollout that changed since last sent.
async fn changes(state: &mut StreamState) -> Vec<Result<Event, Infallible>> {
    let watched = state.watched.borrow_and_update().clone();
    state.sent.retain(|id, _| watched.contains(id));
    let mut events = Vec::new();
    for id in watched {
        let sent = state.sent.entry(id).or_default();
        match rollout_change(&state.app, &state.me, id, sent).await {
            Ok(Some(change)) => events.push(Ok(Event::default().event("rollout").data(change.to_string()))),
            Ok(None) => {}
            // An unknown rollout, or a read that failed this time: the next
            // poll tries again; the tab keeps what it shows.
            Err(err) => tracing::debug!(rollout = %id, error = ?err, "live update skipped"),
        }
    }
    events
}

/// What changed in one rollout, as the `rollout` event's JSON; `None` when
/// nothing did.
async fn rollout_change(
    app: &AppState,
    me: &Principal,
    id: RolloutId,
    sent: &mut Sent,
) -> Result<Option<serde_json::Value>, UiError> {
    let (ctx, _) = rollout::live_context(app, me, id, &mut sent.capacity).await?;
    let steps = app.db.step_revision(id).await?;
    let html = render_string("rollout_live.html", ctx)
        .ok_or_else(|| UiError::new(StatusCode::INTERNAL_SERVER_ERROR, "live part not rendered"))?;
    let nodes = sent.steps.as_ref() != Some(&steps);
    sent.steps = Some(steps);
    let cut = fragments(&html);
    let now: Vec<(String, u64)> = cut.iter().map(|(id, part)| (id.clone(), fingerprint(part))).collect();
    let same_shape = !cut.is_empty()
        && now.len() == sent.fragments.len()
        && now.iter().zip(&sent.fragments).all(|(a, b)| a.0 == b.0);
    let mut changed = serde_json::Map::new();
    let mut full = None;
    if same_shape {
        for ((id, part), (_, hash)) in cut.into_iter().zip(&now) {
            let before = sent.fragments.iter().find(|(i, _)| *i == id).map(|(_, h)| *h);
            if before != Some(*hash) {
                changed.insert(id, serde_json::Value::String(part));
            }
        }
    } else if sent.fragments != now || now.is_empty() {
        full = Some(html);
    }
    sent.fragments = now;
    if changed.is_empty() && full.is_none() && !nodes {
        return Ok(None);
    }
    Ok(Some(
        json!({ "rollout": id.0, "fragments": changed, "full": full, "nodes": nodes }),
    ))
}

fn fingerprint(html: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    html.hash(&mut hasher);
    hasher.finish()
}

/// The elements of `html` whose start tag carries `data-fragment`, each
/// with its `id`, outermost only, in order. The live templates are ours and
/// well formed (every text and attribute escaped), so matching an element's
/// start and end tags by name is enough; anything unexpected gives no
/// fragments, and the stream sends the whole live part instead.
pub(crate) fn fragments(html: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = html[from..].find(" data-fragment") {
        let attribute = from + found;
        let Some(open) = html[..attribute].rfind('<') else {
            return Vec::new();
        };
        let Some(tag_end) = html[attribute..].find('>').map(|i| attribute + i + 1) else {
            return Vec::new();
        };
        let start_tag = &html[open..tag_end];
        let name: String = start_tag[1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let (Some(id), Some(end)) = (attribute_value(start_tag, "id"), element_end(html, tag_end, &name)) else {
            return Vec::new();
        };
        out.push((id, html[open..end].to_owned()));
        from = end;
    }
    out
}

fn attribute_value(start_tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let at = start_tag.find(&key)? + key.len();
    let len = start_tag[at..].find('"')?;
    Some(start_tag[at..at + len].to_owned()).filter(|v| !v.is_empty())
}

/// Where the element named `name` whose start tag ends at `from` ends.
fn element_end(html: &str, from: usize, name: &str) -> Option<usize> {
    if name.is_empty() {
        return None;
    }
    let opens = |rest: &str, prefix: &str| {
        rest.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix(name))
            .and_then(|r| r.chars().next())
            .is_some_and(|c| c == '>' || c == '/' || c.is_ascii_whitespace())
    };
    let mut depth = 1usize;
    let mut at = from;
    while let Some(found) = html[at..].find('<') {
        let tag = at + found;
        let rest = &html[tag..];
        if opens(rest, "</") {
            depth -= 1;
            let close = tag + rest.find('>')? + 1;
            if depth == 0 {
                return Some(close);
            }
            at = close;
        } else {
            if opens(rest, "<") {
                depth += 1;
            }
            at = tag + 1;
        }
    }
    None
}

/// `GET /events/{stream}/watch?rollouts=…`: what the stream watches from now.
pub(crate) async fn watch(
    State(app): State<AppState>,
    Extension(me): Extension<Principal>,
    Path(stream): Path<String>,
    Query(query): Query<RolloutsQuery>,
) -> Result<impl IntoResponse, UiError> {
    let rollouts = query.parse()?;
    if app.live.watch(&stream, &me.user.username, rollouts) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(UiError::new(StatusCode::NOT_FOUND, "no such live stream (it ended)"))
    }
}

#[cfg(test)]
mod tests {
    use super::fragments;

    #[test]
    fn fragments_are_the_marked_elements_with_their_ids() {
        let html = r#"<section class="card" id="live-head" data-fragment><p>State <b>running</b></p></section>
<section class="card"><ol id="waves">
<li class="wave" id="wave-1" data-fragment><ol><li>nested</li></ol><p>a</p></li>
<li class="wave" id="wave-2" data-state="baking" data-fragment><p>b</p></li>
</ol></section>"#;
        let cut = fragments(html);
        let ids: Vec<&str> = cut.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["live-head", "wave-1", "wave-2"]);
        assert_eq!(
            cut[1].1,
            r#"<li class="wave" id="wave-1" data-fragment><ol><li>nested</li></ol><p>a</p></li>"#
        );
        assert!(cut[0].1.ends_with("</section>"), "{}", cut[0].1);
        assert_eq!(
            cut[2].1,
            r#"<li class="wave" id="wave-2" data-state="baking" data-fragment><p>b</p></li>"#
        );
    }

    #[test]
    fn a_malformed_part_gives_no_fragments() {
        for html in [
            r#"<li id="wave-1" data-fragment><p>never closed</p>"#,
            r#"<li data-fragment>no id</li>"#,
            r#"data-fragment without a tag"#,
        ] {
            assert!(fragments(html).is_empty(), "{html}");
        }
        assert!(fragments("<p>nothing marked</p>").is_empty());
    }

    #[test]
    fn a_tag_whose_name_starts_like_the_fragment_s_is_not_counted() {
        let html = r#"<li id="w" data-fragment><link rel="x"><lix></lix></li><li>after</li>"#;
        assert_eq!(
            fragments(html),
            [(
                "w".to_owned(),
                r#"<li id="w" data-fragment><link rel="x"><lix></lix></li>"#.to_owned()
            )]
        );
    }
}
