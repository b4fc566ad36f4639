//! Pushes: the scripts publish each opening and close on the circuit's key,
//! and one subscriber task per store, on its own pub/sub connection,
//! hands them to the breakers that watch that key.
//!
//! Pub/sub is fire-and-forget: a message published while the subscriber
//! is disconnected is lost, and Redis cuts off a subscriber that falls too
//! far behind. So a push only shortens how late a breaker learns; the
//! breaker's periodic read stays the bound.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_core::Stream;
use redis::aio::{PubSub, PubSubSink};
use redis::{Msg, RedisResult};

use tower_breaker::store::{Decision, Watcher};

/// Opens a pub/sub connection to the server that publishes (for a
/// sentinel set, the current primary; for a cluster, any node: messages
/// are broadcast).
pub(super) type Dial =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = RedisResult<PubSub>> + Send>> + Send + Sync>;

/// The subscriber of one store.
pub(super) struct Push {
    dial: Dial,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The watchers of each key (channel).
    watchers: HashMap<String, Vec<Weak<dyn Watcher>>>,
    /// The subscription side of the live connection, if there is one.
    sink: Option<PubSubSink>,
    /// The subscriber task runs.
    running: bool,
}

// === impl Push ===

impl Push {
    pub(super) fn new(dial: Dial) -> Self {
        Self {
            dial,
            state: Mutex::new(State::default()),
        }
    }

    /// Pushes the decisions published on `key` to `watcher` from now on
    /// (best effort: without a runtime, or while the connection is down,
    /// nothing is pushed and the breaker's reads do the work).
    pub(super) fn watch(self: &Arc<Self>, key: String, watcher: Weak<dyn Watcher>) {
        let (first, sink, start) = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let list = state.watchers.entry(key.clone()).or_default();
            list.retain(|w| w.strong_count() > 0);
            let first = list.is_empty();
            list.push(watcher);
            let start = !state.running && tokio::runtime::Handle::try_current().is_ok();
            if start {
                state.running = true;
            }
            (first, state.sink.clone(), start)
        };
        if start {
            let this = Arc::downgrade(self);
            tokio::spawn(run(this, Arc::clone(&self.dial)));
        } else if first {
            if let Some(mut sink) = sink {
                // A new channel on the live connection; the task subscribes
                // to every key again after a reconnection.
                tokio::spawn(async move {
                    let _ = sink.subscribe(&key).await;
                });
            }
        }
    }

    /// Hands a published message to the watchers of its channel.
    fn dispatch(&self, msg: &Msg) {
        let Ok(payload) = msg.get_payload::<String>() else {
            return;
        };
        let decision = match payload.split_once(':') {
            Some(("o", ms)) => match ms.parse::<u64>() {
                Ok(ms) => Decision::Open {
                    remaining: Duration::from_millis(ms),
                },
                Err(_) => return,
            },
            None if payload == "c" => Decision::Closed,
            _ => return,
        };
        let alive: Vec<Arc<dyn Watcher>> = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let Some(list) = state.watchers.get_mut(msg.get_channel_name()) else {
                return;
            };
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for watcher in alive {
            watcher.decided(decision);
        }
    }
}

/// The subscriber: connects (with backoff), subscribes to every watched
/// key, hands messages over, and starts again when the connection drops;
/// ends when the store is gone.
async fn run(push: Weak<Push>, dial: Dial) {
    let mut delay = Duration::from_millis(50);
    loop {
        let connected = dial().await;
        let Some(this) = push.upgrade() else { return };
        let (mut sink, stream) = match connected {
            Ok(pubsub) => pubsub.split(),
            Err(error) => {
                tracing::debug!(error = %error, "circuit_store_push_unavailable");
                drop(this);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let keys: Vec<String> = {
            let mut state = this.state.lock().unwrap_or_else(|e| e.into_inner());
            state.sink = Some(sink.clone());
            state.watchers.keys().cloned().collect()
        };
        drop(this);
        if !keys.is_empty() && sink.subscribe(&keys).await.is_err() {
            continue;
        }
        delay = Duration::from_millis(50);
        let mut stream = Box::pin(stream);
        while let Some(msg) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
            let Some(this) = push.upgrade() else { return };
            this.dispatch(&msg);
        }
        // Disconnected: messages published meanwhile are lost; the reads
        // cover them.
        if let Some(this) = push.upgrade() {
            this.state.lock().unwrap_or_else(|e| e.into_inner()).sink = None;
        }
        tokio::time::sleep(delay).await;
    }
}
