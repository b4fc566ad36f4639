//! Pushes: the scripts publish each opening and close on the circuit's key,
//! and one subscriber task per store, on its own pub/sub connection,
//! hands them to the breakers that watch that key.
//!
//! Pub/sub is fire-and-forget: a message published while the subscriber
//! is disconnected is lost, and Redis cuts off a subscriber that falls too
//! far behind. So a push only shortens how late a breaker learns; the
//! breaker's periodic read stays the bound. A breaker that makes no call
//! makes no periodic read either: when the subscriber connects again after
//! a disconnection, every watcher is told to read again
//! ([`Watcher::resync`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
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
    /// Calls of `watch` since the last sweep of dead watchers.
    watches: usize,
}

/// The first and the longest wait between two connection attempts of the
/// subscriber, doubling in between.
const FIRST_DELAY: Duration = Duration::from_millis(50);
const MAX_DELAY: Duration = Duration::from_secs(2);

/// The longest wait for the pub/sub connection, its SUBSCRIBE and its
/// liveness PING.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a quiet pub/sub connection is checked with a PING.
const PING_INTERVAL: Duration = Duration::from_secs(5);

/// Every this many calls of `watch`, the keys whose breakers are all gone
/// are forgotten and unsubscribed (keyed breakers come and go).
const SWEEP_EVERY: usize = 64;

// === impl State ===

impl State {
    /// Every [`SWEEP_EVERY`] calls, forgets the keys whose watchers are all
    /// gone; returns them, to unsubscribe.
    fn sweep(&mut self) -> Vec<String> {
        self.watches += 1;
        if self.watches < SWEEP_EVERY {
            return Vec::new();
        }
        self.watches = 0;
        let mut gone = Vec::new();
        self.watchers.retain(|key, list| {
            list.retain(|w| w.strong_count() > 0);
            if list.is_empty() {
                gone.push(key.clone());
                false
            } else {
                true
            }
        });
        gone
    }
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
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run a subscriber on: the reads do the work.
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.watchers.entry(key).or_default().push(watcher);
            return;
        };
        let (first, sink, start, gone) = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let gone = state.sweep();
            let list = state.watchers.entry(key.clone()).or_default();
            list.retain(|w| w.strong_count() > 0);
            let first = list.is_empty();
            list.push(watcher);
            let start = !state.running;
            state.running = true;
            (first, state.sink.clone(), start, gone)
        };
        if start {
            let this = Arc::downgrade(self);
            runtime.spawn(run(this, Arc::clone(&self.dial)));
        } else if let Some(mut sink) = sink.filter(|_| first || !gone.is_empty()) {
            // A new channel on the live connection, channels nobody watches
            // any more off it; after a reconnection the task subscribes to
            // every watched key again.
            runtime.spawn(async move {
                if !gone.is_empty() {
                    let _ = tokio::time::timeout(SUBSCRIBE_TIMEOUT, sink.unsubscribe(&gone)).await;
                }
                if first {
                    let _ = tokio::time::timeout(SUBSCRIBE_TIMEOUT, sink.subscribe(&key)).await;
                }
            });
        }
    }

    /// The number of keys watched (for the tests of the sweep).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .watchers
            .len()
    }

    /// Tells every live watcher that messages may have been missed.
    fn resync(&self) {
        let alive: Vec<Arc<dyn Watcher>> = {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state
                .watchers
                .values()
                .flatten()
                .filter_map(Weak::upgrade)
                .collect()
        };
        for watcher in alive {
            watcher.resync();
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
    let mut delay = FIRST_DELAY;
    // Whether this streak of failures was already reported at warn level.
    let mut warned = false;
    // Whether a connection subscribed before: the next one may have
    // missed messages in between.
    let mut subscribed_before = false;
    loop {
        let connected = match tokio::time::timeout(SUBSCRIBE_TIMEOUT, dial()).await {
            Ok(connected) => connected.map_err(|e| e.to_string()),
            Err(_) => Err(String::from("the pub/sub connection timed out")),
        };
        let Some(this) = push.upgrade() else { return };
        let (mut sink, stream) = match connected {
            Ok(pubsub) => pubsub.split(),
            Err(error) => {
                tracing::debug!(error = %error, "circuit_store_push_unavailable");
                drop(this);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
                continue;
            }
        };
        let keys: Vec<String> = {
            let mut state = this.state.lock().unwrap_or_else(|e| e.into_inner());
            state.sink = Some(sink.clone());
            state.watchers.keys().cloned().collect()
        };
        drop(this);
        if !keys.is_empty() {
            let refused = match tokio::time::timeout(SUBSCRIBE_TIMEOUT, sink.subscribe(&keys)).await
            {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some(error.to_string()),
                Err(_) => Some(String::from("SUBSCRIBE timed out")),
            };
            if let Some(error) = refused {
                // Refused (an ACL without channel rights, say): never a
                // tight loop of reconnections against the shared server.
                if let Some(this) = push.upgrade() {
                    this.state.lock().unwrap_or_else(|e| e.into_inner()).sink = None;
                }
                if warned {
                    tracing::debug!(error = %error, "circuit_store_push_refused");
                } else {
                    warned = true;
                    let hint = if error.contains("NOPERM") {
                        "the Redis user may not SUBSCRIBE to the store's channels: grant them \
                         (`&<prefix>*` in its ACL); the breakers' periodic reads still work"
                    } else {
                        "the breakers' periodic reads still work; pushes resume when it is accepted"
                    };
                    tracing::warn!(error = %error, hint, "circuit_store_push_refused");
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
                continue;
            }
        }
        delay = FIRST_DELAY;
        warned = false;
        if std::mem::replace(&mut subscribed_before, true) {
            // Back after a disconnection: what was published meanwhile is
            // lost, and a quiet breaker would keep an old decision until
            // its next call. Each watcher reads again.
            let Some(this) = push.upgrade() else { return };
            this.resync();
        }
        let mut stream = Box::pin(stream);
        let mut tick = Box::pin(tokio::time::sleep(PING_INTERVAL));
        loop {
            // The next message, or `None` when it is time to check that
            // the connection is alive: one that dies without a FIN or RST
            // (a partition, a failover behind a load balancer) would
            // otherwise be waited on until the kernel gives up.
            let event = std::future::poll_fn(|cx| {
                if let Poll::Ready(msg) = stream.as_mut().poll_next(cx) {
                    return Poll::Ready(Some(msg));
                }
                tick.as_mut().poll(cx).map(|()| None)
            })
            .await;
            match event {
                Some(Some(msg)) => {
                    let Some(this) = push.upgrade() else { return };
                    this.dispatch(&msg);
                }
                Some(None) => break,
                None => {
                    tick.as_mut()
                        .reset(tokio::time::Instant::now() + PING_INTERVAL);
                    let ping = sink.ping::<redis::Value>();
                    if !matches!(
                        tokio::time::timeout(SUBSCRIBE_TIMEOUT, ping).await,
                        Ok(Ok(_))
                    ) {
                        tracing::debug!("circuit_store_push_silent");
                        break;
                    }
                }
            }
        }
        // Disconnected: messages published meanwhile are lost; the reads
        // cover them.
        if let Some(this) = push.upgrade() {
            this.state.lock().unwrap_or_else(|e| e.into_inner()).sink = None;
        }
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nobody;

    impl Watcher for Nobody {
        fn decided(self: Arc<Self>, _: Decision) {}
    }

    fn never_connects() -> Dial {
        Arc::new(|| {
            Box::pin(async {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "no server in this test",
                )))
            })
        })
    }

    #[test]
    fn watching_without_a_runtime_neither_panics_nor_spawns() {
        let push = Arc::new(Push::new(never_connects()));
        let watcher: Arc<dyn Watcher> = Arc::new(Nobody);
        push.watch("k".into(), Arc::downgrade(&watcher));
        push.watch("k".into(), Arc::downgrade(&watcher));
        assert_eq!(push.keys(), 1);
        assert!(!push.state.lock().unwrap().running);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn keys_whose_breakers_are_gone_are_forgotten() {
        let push = Arc::new(Push::new(never_connects()));
        let kept: Arc<dyn Watcher> = Arc::new(Nobody);
        push.watch("kept".into(), Arc::downgrade(&kept));
        for i in 0..(4 * SWEEP_EVERY) {
            let gone: Arc<dyn Watcher> = Arc::new(Nobody);
            push.watch(format!("key-{i}"), Arc::downgrade(&gone));
        }
        assert!(
            push.keys() <= SWEEP_EVERY + 1,
            "{} keys kept for one live breaker",
            push.keys()
        );
        assert!(push.state.lock().unwrap().watchers.contains_key("kept"));
    }
}
