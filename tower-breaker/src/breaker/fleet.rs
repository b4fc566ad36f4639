//! The synchronisation of a breaker with its fleet through a shared
//! [`Store`]: reads, write-through of openings, elections and closes, each
//! in a spawned task beside the hot path.

use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::machine::Core;
use super::{nanos, ElectionWait, NANOS_PER_MS};
use crate::config::{BreakerConfig, StoreAlarm, WindowKind, DEFAULT_FLEET_WINDOW};
use crate::flush::Unflushed;
use crate::snapshot::Cause;
use crate::state::{Phase, Word, CLOSED, ELECTING, HALF_OPEN, OPEN};
use crate::store::StoreFailureMode;
use crate::store::{Decision, Election, FleetRule, ProbeToken, Report, Store, StoreError, Watcher};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering::*};
use crate::Mode;

/// A breaker's link to its shared store.
pub(super) struct StoreLink {
    pub(super) store: Arc<dyn Store>,
    pub(super) refresh_ns: u64,
    pub(super) next_refresh_ns: AtomicU64,
    pub(super) token: Mutex<Option<ProbeToken>>,
    /// The store is known to hold the current opening.
    pub(super) shared_open: AtomicBool,
    /// When the store started failing (nanoseconds since the breaker's
    /// base, plus one), or 0 while it works: the last store call failed
    /// unless 0 (cleared by the next one that works).
    pub(super) down_since: AtomicU64,
    /// The rate limit of the store alarm, shared with the other breakers
    /// built from the same fleet configuration.
    alarm: Arc<StoreAlarm>,
    pub(super) fail_closed: bool,
    /// The writes not yet made, in the order the breaker asked for them.
    writes: Mutex<Writes>,
    /// The fleet-wide window's rule, when the breaker shares its evidence.
    fleet: Option<FleetRule>,
    flush_ns: u64,
    next_flush_ns: AtomicU64,
    /// The totals (calls, failures, slow) already reported, and when (on
    /// the breaker's clock; 0: never).
    reported: Mutex<[u64; 4]>,
    /// The probe lease the elected prober asks for and renews, when the
    /// store renews leases (0: it does not; the lease is the whole probe
    /// wait).
    lease_ns: u64,
    /// How old the shared decision may be when a closed circuit admits a
    /// call through `poll_ready` (`u64::MAX`: any age).
    stale_ns: u64,
    /// When the newest sync that answered (a read, a report or a push,
    /// with or without an error) was asked, plus one; 0: never.
    synced_ns: AtomicU64,
    /// Woken when a sync answers.
    synced: tokio::sync::Notify,
    /// Held by a lease renewal while it runs, and by the close or re-open
    /// that ends a probe before it is sent: a probe that ends while its
    /// lease is being renewed is closed or re-opened with the renewal's
    /// token, not fenced by it.
    renewal: tokio::sync::Mutex<()>,
    /// A renewal that answered after the probe had ended (its token taken
    /// for the close or re-open): the token it renewed, and its successor.
    renewed: Mutex<Option<(ProbeToken, ProbeToken)>>,
    /// The store calls this breaker has started and that have not ended:
    /// its syncs and the task that drains its writes (not the heartbeat of
    /// a probe, which lasts as long as the probe).
    in_flight: AtomicUsize,
    /// Woken when `in_flight` drops to zero.
    idle: tokio::sync::Notify,
    /// This process's closes queued or being written: until they land, a
    /// read may still find the probe's lease or the opening they end.
    closing: Arc<AtomicUsize>,
    /// Reports that failed (applied or not, the breaker cannot tell).
    failed_reports: AtomicU64,
    /// The retry budget that shares the fleet's through this breaker,
    /// once a retry layer attached one.
    pub(super) budget: std::sync::OnceLock<super::retries::BudgetLink>,
    /// When the newest call was admitted (the breaker's clock, to the
    /// millisecond; 0: none yet): a report without failures in a row
    /// places its calls there.
    last_call_ns: AtomicU64,
    /// When the lease of another process's probe in flight ends, as last
    /// heard from the store (the breaker's clock; 0: no such probe known):
    /// what a caller refused meanwhile is told to wait for.
    probe_until_ns: AtomicU64,
}

/// The queue of a breaker's writes: one task at a time drains it, so the
/// store sees them in order (an opening after a close is never applied
/// before it).
#[derive(Default)]
struct Writes {
    queue: VecDeque<Write>,
    /// A task is draining the queue.
    draining: bool,
}

/// A write to the store.
enum Write {
    /// Write an opening through (as the re-open of the election `token`
    /// won, if any).
    Open {
        opened: Word,
        period: Duration,
        token: Option<ProbeToken>,
    },
    /// Elect the fleet's prober.
    Elect {
        electing: Word,
        period: Duration,
        lease: Duration,
    },
    /// Close after this process's probe succeeded.
    Close {
        token: ProbeToken,
        _on_its_way: Closing,
    },
}

/// A close of this process on its way to the store: counted in
/// [`StoreLink::closing`] until it is dropped (written, failed, or lost
/// with its task).
struct Closing(Arc<AtomicUsize>);

impl Closing {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, AcqRel);
        Self(Arc::clone(count))
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AcqRel);
    }
}

/// How many refresh intervals the store must have been failing before a
/// breaker whose election failed probes on its own (fail open): a single
/// slow answer (a busy store, a busy machine) must not let every process
/// of the fleet probe at once.
const DOWN_REFRESHES_BEFORE_LOCAL_PROBE: u64 = 2;

/// After how many renewals in a row (a third of the lease apart) that
/// found no probe in flight an elected prober gives the probe back: no
/// probe seen in flight for two thirds of a lease (1.3 s by default).
const IDLE_RENEWALS: u32 = 2;

/// How many reads a breaker tries, a refresh interval apart, when its
/// store's push connection is back after a disconnection.
const RESYNC_READS: u32 = 3;

/// The least interval between two `circuit_store_failed` warnings of the
/// breakers that share a fleet configuration.
const STORE_WARNING_INTERVAL_MS: u64 = 1_000;

// === impl StoreLink ===

impl StoreLink {
    /// The link of a breaker named `name` built with `config`, if it has a
    /// store.
    pub(super) fn for_config(config: &BreakerConfig, name: &str) -> Option<Self> {
        let link = config.fleet.as_ref().map(|fleet| StoreLink {
            store: Arc::clone(&fleet.store),
            refresh_ns: nanos(fleet.refresh_interval),
            next_refresh_ns: AtomicU64::new(0),
            token: Mutex::new(None),
            shared_open: AtomicBool::new(false),
            down_since: AtomicU64::new(0),
            alarm: Arc::clone(&fleet.alarm),
            writes: Mutex::new(Writes::default()),
            fleet: fleet.fleet_window.then(|| fleet_rule(config)),
            flush_ns: nanos(fleet.flush_interval).max(NANOS_PER_MS),
            next_flush_ns: AtomicU64::new(0),
            reported: Mutex::new([0; 4]),
            fail_closed: fleet.store_failure == StoreFailureMode::FailClosed,
            lease_ns: if fleet.store.renews_leases() {
                nanos(fleet.probe_lease).min(nanos(config.max_half_open_wait))
            } else {
                0
            },
            stale_ns: nanos(fleet.staleness()),
            synced_ns: AtomicU64::new(0),
            synced: tokio::sync::Notify::new(),
            renewal: tokio::sync::Mutex::new(()),
            renewed: Mutex::new(None),
            in_flight: AtomicUsize::new(0),
            closing: Arc::new(AtomicUsize::new(0)),
            idle: tokio::sync::Notify::new(),
            failed_reports: AtomicU64::new(0),
            budget: std::sync::OnceLock::new(),
            last_call_ns: AtomicU64::new(0),
            probe_until_ns: AtomicU64::new(0),
        });
        if let Some(link) = &link {
            if let Err(error) = link.store.check_name(name) {
                // Every store call would fail; say so once, loudly.
                tracing::error!(breaker = %name, error = %error, "circuit_store_invalid_name");
            }
            if tokio::runtime::Handle::try_current().is_err() {
                // Store calls run in spawned tasks: none can run here.
                tracing::error!(
                    breaker = %name,
                    "circuit_store_no_runtime: a breaker with a store built outside a tokio \
                     runtime cannot reach its store from threads without one"
                );
            }
        }
        link
    }

    /// A call admitted at `now`: remembered to the millisecond (at most
    /// one write a millisecond to the shared word).
    #[inline]
    pub(super) fn note_call(&self, now: u64) {
        if self.fleet.is_some() && now > self.last_call_ns.load(Relaxed) + NANOS_PER_MS {
            self.last_call_ns.store(now, Relaxed);
        }
    }

    /// Remembers whether the store said another process's probe is in
    /// flight, and until when its lease runs (`now` is when the answer
    /// came).
    pub(super) fn heard_of_probe(&self, decision: &Decision, now: u64) {
        let until = match decision {
            Decision::Probing { lease, .. } => now.saturating_add(super::nanos(*lease)).max(1),
            _ => 0,
        };
        self.probe_until_ns.store(until, Relaxed);
    }

    pub(super) fn forget_probe(&self) {
        self.probe_until_ns.store(0, Relaxed);
    }

    /// What a caller refused while the circuit is open until `until_ns` is
    /// told: the time left until then, or, while another process probes,
    /// until its lease ends as last heard (at least a refresh interval:
    /// this process hears of the probe's end no sooner).
    pub(super) fn open_retry_after(&self, until_ns: u64, now: u64) -> Duration {
        let left = until_ns.saturating_sub(now);
        let probe = match self.probe_until_ns.load(Relaxed) {
            0 => left,
            until => until.saturating_sub(now).max(self.refresh_ns),
        };
        Duration::from_nanos(left.min(probe))
    }

    /// Whether the breaker reports its outcomes to the fleet's window.
    pub(super) fn shares_evidence(&self) -> bool {
        self.fleet.is_some()
    }

    pub(super) fn take_token(&self) -> Option<ProbeToken> {
        self.token.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The token to close or re-open with, for a probe that ended holding
    /// `token`: once no renewal is in flight, the successor a renewal that
    /// answered after the probe ended gave `token`, else `token`.
    async fn after_renewal(&self, token: ProbeToken) -> ProbeToken {
        let _renewing = self.renewal.lock().await;
        let mut renewed = self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        match renewed.take() {
            Some((old, fresh)) if old == token => fresh,
            _ => token,
        }
    }

    /// Whether a call at `now` must read before it is admitted: the
    /// decision is older than the allowed staleness, and the store is not
    /// known to be failing.
    fn must_read_first(&self, now: u64) -> bool {
        let synced = self.synced_ns.load(Acquire);
        let age = if synced == 0 {
            u64::MAX
        } else {
            now.saturating_sub(synced - 1)
        };
        age >= self.stale_ns && self.stale_ns != u64::MAX && self.down_since.load(Relaxed) == 0
    }
}

/// When a store call was asked: the breaker's clock then, and how many
/// transitions it had made.
#[derive(Debug, Clone, Copy)]
pub(super) struct Asked {
    pub(super) ns: u64,
    transitions: u64,
    /// A close of this process was on its way to the store.
    closing: bool,
}

impl Asked {
    /// Whether the breaker has made a transition since: the answer may be
    /// older than its state, and is not adopted (the next read tells).
    fn before_a_transition(self, core: &Core) -> bool {
        core.transitions.load(Acquire) != self.transitions
    }
}

impl Core {
    /// Now, for a store call about to be asked.
    pub(super) fn asked(&self) -> Asked {
        Asked {
            transitions: self.transitions.load(Acquire),
            closing: self
                .store
                .as_ref()
                .is_some_and(|link| link.closing.load(Acquire) != 0),
            ns: self.now_ns(),
        }
    }
}

impl Watcher for Core {
    fn decided(self: Arc<Self>, decision: Decision) {
        let asked = self.asked();
        self.apply_read(&Ok(decision), asked);
    }

    fn resync(self: Arc<Self>) {
        // The read the next call would make, now: the pushes missed
        // meanwhile may have been the fleet's close. The store's command
        // connection may have gone down with the push connection and learn
        // it only from this read: a failed read is tried again, a refresh
        // interval apart.
        let _ = spawn(async move {
            let Some(link) = &self.store else { return };
            for attempt in 0..RESYNC_READS {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_nanos(link.refresh_ns)).await;
                }
                if self.read_and_adopt(link).await.is_ok() {
                    return;
                }
            }
        });
    }
}

impl Core {
    // --- the shared store ---

    /// Asks the store to push this circuit's decisions as they change (a
    /// store that cannot leaves the periodic read alone).
    pub(super) fn watch(self: &Arc<Self>) {
        if let Some(link) = &self.store {
            let weak: std::sync::Weak<Core> = Arc::downgrade(self);
            link.store.watch(&self.name, weak);
        }
    }

    /// The slow part of [`Breaker::poll_election`](super::Breaker::poll_election):
    /// when the open period is over, starts the election and waits until
    /// it ends (the task that runs it wakes this one, whatever the
    /// outcome, also when it is dropped).
    #[inline]
    pub(super) fn poll_start_election(
        self: &Arc<Self>,
        wait: &mut ElectionWait,
        cx: &mut Context<'_>,
        read_first: bool,
    ) -> Poll<()> {
        let w = Word(self.word.load(Acquire));
        let until_ms = match w.phase() {
            Phase::Open { until_ms } => until_ms,
            Phase::Closed { .. } if read_first => return self.poll_read_first(w, wait, cx),
            _ => return Poll::Ready(()),
        };
        if w.mode() != Mode::Automatic || tokio::runtime::Handle::try_current().is_err() {
            return Poll::Ready(());
        }
        let now = self.call_now_ns();
        if now < until_ms.saturating_mul(NANOS_PER_MS) {
            return Poll::Ready(());
        }
        // Registered before the election can end: its end wakes us.
        let core = Arc::clone(self);
        let mut future: Pin<Box<dyn Future<Output = ()> + Send + Sync>> = Box::pin(async move {
            let ended = core.elected.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            let Some(electing) = core.leave_open(w, now) else {
                return;
            };
            if Word(core.word.load(Acquire)) == electing {
                ended.await;
            }
        });
        match future.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(()),
            Poll::Pending => {
                wait.0 = Some(future);
                Poll::Pending
            }
        }
    }

    /// A closed circuit whose shared decision is older than the allowed
    /// staleness: waits until a read started now (or one in flight)
    /// answers, at most the election timeout, so the call is decided on
    /// what the fleet knows (see
    /// [`FleetConfig::max_staleness`](crate::FleetConfig::max_staleness)).
    fn poll_read_first(
        self: &Arc<Self>,
        w: Word,
        wait: &mut ElectionWait,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let Some(link) = &self.store else {
            return Poll::Ready(());
        };
        if link.stale_ns == u64::MAX || w.mode() != Mode::Automatic {
            return Poll::Ready(());
        }
        let now = self.call_now_ns();
        if !link.must_read_first(now) || tokio::runtime::Handle::try_current().is_err() {
            return Poll::Ready(());
        }
        let core = Arc::clone(self);
        let bound = Duration::from_nanos(self.s.election_ns().max(NANOS_PER_MS));
        let mut future: Pin<Box<dyn Future<Output = ()> + Send + Sync>> = Box::pin(async move {
            let Some(link) = &core.store else { return };
            // Registered before the read can answer: its answer wakes us.
            let answered = link.synced.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            if !link.must_read_first(core.now_ns()) {
                return;
            }
            // Starts the read, unless one is in flight (it then answers).
            core.maybe_refresh(link, now);
            let _ = tokio::time::timeout(bound, answered).await;
        });
        match future.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(()),
            Poll::Pending => {
                wait.0 = Some(future);
                Poll::Pending
            }
        }
    }

    pub(super) fn maybe_refresh(self: &Arc<Self>, link: &StoreLink, now: u64) {
        let next = link.next_refresh_ns.load(Relaxed);
        if now < next
            || link
                .next_refresh_ns
                .compare_exchange(next, now + link.refresh_ns.max(1), Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        self.sync(link, now);
    }

    /// Outcomes arrived with failures among them: report them to the fleet
    /// now, unless a report went less than the flush interval ago.
    pub(super) fn flush_failures(self: &Arc<Self>, now: u64) {
        let Some(link) = &self.store else { return };
        if link.fleet.is_none() {
            return;
        }
        let next = link.next_flush_ns.load(Relaxed);
        if now < next
            || link
                .next_flush_ns
                .compare_exchange(next, now + link.flush_ns, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        // The report stands for the periodic read too.
        link.next_refresh_ns
            .store(now + link.refresh_ns.max(1), Relaxed);
        self.sync(link, now);
    }

    /// The calls counted and not yet reported to the fleet (0 when the
    /// breaker does not share its evidence).
    fn unreported(&self, link: &StoreLink) -> u64 {
        if link.fleet.is_none() {
            return 0;
        }
        let reported = link.reported.lock().unwrap_or_else(|e| e.into_inner());
        self.totals().calls().saturating_sub(reported[0])
    }

    /// Whether [`flush`](Self::flush) has anything to do: outcomes to
    /// report, or store calls in flight.
    pub(crate) fn flush_pending(&self) -> bool {
        self.store
            .as_ref()
            .is_some_and(|link| link.in_flight.load(Acquire) > 0 || self.unreported(link) > 0)
    }

    /// Reports the outcomes counted and not yet reported, then waits until
    /// every store call of this breaker has ended (the report, the queued
    /// writes and what they lead to), at most until `deadline`. Makes no
    /// store call when nothing is pending.
    pub(crate) async fn flush(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
    ) -> Result<(), Unflushed> {
        let started = self.start_flush();
        self.finish_flush(started, deadline).await
    }

    /// The first half of a flush: starts the report of what is not
    /// reported, if anything is, and returns the failed reports so far.
    pub(crate) fn start_flush(self: &Arc<Self>) -> u64 {
        let Some(link) = &self.store else {
            return 0;
        };
        let failed_before = link.failed_reports.load(Acquire);
        if self.unreported(link) > 0 {
            let now = self.now_ns();
            // The report stands for the periodic read.
            link.next_refresh_ns
                .store(now + link.refresh_ns.max(1), Relaxed);
            self.sync(link, now);
        }
        failed_before
    }

    /// The second half of a flush: waits until no store call of this
    /// breaker runs, at most until `deadline`, and tells what is left.
    pub(crate) async fn finish_flush(
        self: &Arc<Self>,
        failed_before: u64,
        deadline: tokio::time::Instant,
    ) -> Result<(), Unflushed> {
        let Some(link) = &self.store else {
            return Ok(());
        };
        loop {
            // Registered before the count is read: the last call's end
            // wakes us.
            let idle = link.idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable();
            if link.in_flight.load(Acquire) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                break;
            }
        }
        let left = Unflushed {
            breakers: 1,
            unreported_calls: self.unreported(link),
            in_flight: link.in_flight.load(Acquire),
            failed_reports: link.failed_reports.load(Acquire) - failed_before,
        };
        if left.unreported_calls == 0 && left.in_flight == 0 && left.failed_reports == 0 {
            Ok(())
        } else {
            Err(left)
        }
    }

    /// Reports the outcomes counted since the last report, if there are
    /// any and the fleet shares its evidence, or else reads; and adopts
    /// what the store decided.
    fn sync(self: &Arc<Self>, link: &StoreLink, now: u64) {
        let report = link
            .fleet
            .and_then(|rule| self.take_report(link, rule, now));
        if report.is_some_and(|(r, _)| r.failures > 0) {
            // Only a report of failures holds the next one back: a healthy
            // report (the periodic one) must not delay the first failure
            // after it by a flush interval.
            link.next_flush_ns.fetch_max(now + link.flush_ns, Relaxed);
        }
        let this = Arc::clone(self);
        let spawned = spawn_tracked(self, async move {
            let core = &*this;
            let Some(link) = &core.store else { return };
            let asked = core.asked();
            let result = match report {
                Some((report, rule)) => {
                    // The thresholds of the breaker's configuration now
                    // (`Breaker::reconfigure` may have changed them); the
                    // fleet's `minimum_calls` is the configured one, not
                    // the local one clamped to a count window's size.
                    let s = core.s.get();
                    let minimum_calls = core
                        .current
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .minimum_calls;
                    let rule = FleetRule {
                        open_for: Duration::from_nanos(core.open_period(0)),
                        minimum_calls: u64::from(minimum_calls).max(1),
                        failure_rate_ppm: s.failure_ppm,
                        slow_rate_ppm: if s.slow_ns != 0 { s.slow_ppm } else { 0 },
                        ..rule
                    };
                    let result = link.store.report(&core.name, report, rule).await;
                    if result.is_err() {
                        link.failed_reports.fetch_add(1, Relaxed);
                    }
                    if matches!(&result, Err(e) if e.is_not_applied()) {
                        // Never counted: the next report carries them.
                        if let Some(budget) = link.budget.get() {
                            budget.not_applied(report.credit, report.returned);
                        }
                        let mut reported = link.reported.lock().unwrap_or_else(|e| e.into_inner());
                        let delta = [report.calls, report.failures, report.slow];
                        for (seen, sent) in reported.iter_mut().take(3).zip(delta) {
                            *seen = seen.saturating_sub(sent);
                        }
                    }
                    result
                }
                None => link.store.read(&core.name).await,
            };
            this.apply_read(&result, asked);
        });
        if !spawned {
            self.store_failed("read", &no_runtime());
        }
    }

    /// The report of a sync at `now` under the fleet's `rule`: the
    /// outcomes counted since the last report (none: `None`), which are
    /// then counted as reported.
    #[inline]
    fn take_report(
        &self,
        link: &StoreLink,
        rule: FleetRule,
        now: u64,
    ) -> Option<(Report, FleetRule)> {
        // The totals are read under the lock, so racing syncs see them
        // in order: each reports what the one before it did not, and
        // `reported` never moves back (which would report a share
        // twice).
        let mut reported = link.reported.lock().unwrap_or_else(|e| e.into_inner());
        let totals = self.totals();
        let now_totals = [totals.calls(), totals.failed, totals.slow];
        let mut delta = Report::new(
            now_totals[0].saturating_sub(reported[0]),
            now_totals[1].saturating_sub(reported[1]),
            now_totals[2].saturating_sub(reported[2]),
        );
        if rule.count_window > 0 && !delta.is_empty() {
            // The failures in a row at the end began about their share
            // of the time since the last report ago (and without them,
            // the last call was about one call's share ago): the
            // fleet's count window places the rest of the report
            // there, before them.
            let gen = Word(self.word.load(Acquire)).gen();
            let tail = if delta.failures > 0 {
                self.window.tail(gen, delta.failures)
            } else {
                0
            };
            let since = if reported[3] == 0 || reported[3] > now {
                link.refresh_ns
            } else {
                now - reported[3]
            };
            let last_call = link.last_call_ns.load(Relaxed);
            let span = if tail == 0 && last_call > 0 && last_call <= now {
                // No failures in a row: the calls are at least as old
                // as the newest one, and it is known. (Spread over the
                // time since the last report, a call of an instance
                // invoked every 30 s was placed 30 s back, behind the
                // other instances' newer failures: a fleet with a
                // quarter of its calls failing opened.)
                u128::from(now - last_call)
            } else {
                u128::from(since) * u128::from(tail.max(1)) / u128::from(delta.calls.max(1))
            };
            delta = delta.with_tail(
                tail,
                Duration::from_nanos(u64::try_from(span).unwrap_or(u64::MAX)),
            );
        }
        for (seen, now) in reported.iter_mut().zip(now_totals) {
            *seen = (*seen).max(now);
        }
        if delta.is_empty() {
            return None;
        }
        reported[3] = reported[3].max(now);
        // The retry credit rides on the report (requests come with
        // calls, so a report carries every request's share).
        let rule = match link.budget.get() {
            Some(budget) => {
                let (credit, returned) = budget.take_credit();
                delta = delta.with_credit(credit).with_returned(returned);
                rule.with_budget(budget.rule)
            }
            None => rule,
        };
        Some((delta, rule))
    }

    /// Reads the store's decision now and adopts it; returns the read.
    async fn read_and_adopt(self: &Arc<Self>, link: &StoreLink) -> Result<Decision, StoreError> {
        let asked = self.asked();
        let read = link.store.read(&self.name).await;
        self.apply_read(&read, asked);
        read
    }

    /// Adopts what a read of the store said, and wakes the calls that
    /// wait for a fresh decision.
    pub(super) fn apply_read(
        self: &Arc<Self>,
        result: &Result<Decision, StoreError>,
        asked: Asked,
    ) {
        self.adopt_read(result, asked);
        if let Some(link) = &self.store {
            link.synced_ns
                .fetch_max(asked.ns.saturating_add(1), Release);
            link.synced.notify_waiters();
        }
    }

    fn adopt_read(self: &Arc<Self>, result: &Result<Decision, StoreError>, asked: Asked) {
        if let (Ok(decision), Some(link)) = (result, &self.store) {
            link.heard_of_probe(decision, self.now_ns());
        }
        match result {
            Ok(Decision::Open { remaining }) => {
                self.store_ok();
                self.adopt_open(*remaining, asked);
            }
            Ok(Decision::Probing { remaining, lease }) => {
                self.store_ok();
                // Open here too, asking the fleet again once neither T nor
                // the lease holds it (a dead prober's lease lapses).
                self.adopt_open((*remaining).max(*lease), asked);
            }
            Ok(Decision::Closed) => {
                self.store_ok();
                // Never a re-publication of an opening the store did not
                // get: the close may be newer than it (a prober elsewhere
                // succeeded since), and writing it would re-open a fleet
                // that just recovered. An unshared local opening stays
                // local (and the fleet's window judges the failures it
                // reports); its election then finds the circuit closed.
                self.adopt_closed(asked);
            }
            Ok(Decision::Missing) => {
                self.store_ok();
                // Never a close: the record was lost (or never written).
                // An opening this process knows of stays, and is written
                // again.
                if let Some(link) = &self.store {
                    link.shared_open.store(false, Relaxed);
                }
                self.rewrite_open();
            }
            Ok(Decision::Expired) => {
                self.store_ok();
                // The fleet's circuit is open and its probe is due: take
                // part in the election rather than send everything.
                self.adopt_open(Duration::ZERO, asked);
                self.rewrite_open();
            }
            Err(e) => self.store_failed("read", e),
        }
    }

    /// The store does not hold this process's opening (the write-through
    /// failed while the store was down, or the store lost its data): write
    /// it again, so that sharing resumes by itself. Only on a read that
    /// finds no record, or an expired one: never over a close.
    pub(super) fn rewrite_open(self: &Arc<Self>) {
        let core = &**self;
        let Some(link) = &core.store else { return };
        let w = Word(core.word.load(Acquire));
        let now = core.now_ns();
        let deadline_ns = w.deadline_ms().saturating_mul(NANOS_PER_MS);
        // (An open word is an automatic one: `set_mode` closes the circuit,
        // and a manual mode never moves it.)
        if w.state() != OPEN || link.shared_open.load(Relaxed) || deadline_ns <= now {
            return;
        }
        self.store_open(w, Duration::from_nanos(deadline_ns - now), None);
    }

    /// closed -> open: another process opened the circuit; open here too,
    /// unless this process moved since it asked. Already open with the
    /// fleet's opening: open -> open until the fleet's T (the store's time
    /// wins; after a lost election, the winner's re-open ends the wait for
    /// its lease early).
    pub(super) fn adopt_open(self: &Arc<Self>, remaining: Duration, asked: Asked) {
        let core = &**self;
        let Some(link) = &core.store else { return };
        let from = Word(core.word.load(Acquire));
        // Asked while this process's close was on its way, the answer may
        // predate the close (the lease of the probe that closed, or the
        // opening it ended): adopting it would re-open a circuit that just
        // recovered. The first read after the close lands tells.
        if !from.is_automatic() || asked.before_a_transition(core) || asked.closing {
            return;
        }
        let now = core.now_ns();
        if from.state() == OPEN {
            let until = (now + nanos(remaining)) / NANOS_PER_MS;
            if link.shared_open.load(Relaxed) && until != from.deadline_ms() {
                let _ = core.cas(from, from.with_deadline(until));
            }
            return;
        }
        if from.state() != CLOSED {
            return;
        }
        // A zero `remaining` (an expired record) opens with the period
        // already over: the next call starts an election.
        let to = from.next(OPEN, (now + nanos(remaining)) / NANOS_PER_MS);
        // What this process had seen itself when the fleet's decision
        // arrived.
        let counts = core.window.counts(from.gen(), now);
        if core.cas(from, to).is_ok() {
            link.shared_open.store(true, Relaxed);
            core.streak.store(0, Relaxed);
            core.opened.fetch_add(1, Relaxed);
            self.after_transition(from, to, Cause::Store, counts, Some(remaining));
        }
    }

    /// open | electing -> closed: the store holds no opening any more (a
    /// prober elsewhere closed it); close here too, unless this process
    /// opened since it asked. half-open -> closed as well when this process
    /// is the fleet's elected prober: only another prober, elected after
    /// this one's lease lapsed (a frozen process, a slow probe), can have
    /// closed the record; probing on would be a second probe.
    pub(super) fn adopt_closed(self: &Arc<Self>, asked: Asked) {
        let core = &**self;
        let Some(link) = &core.store else { return };
        let from = Word(core.word.load(Acquire));
        if !from.is_automatic() || asked.before_a_transition(core) {
            return;
        }
        let elected_prober = from.state() == HALF_OPEN
            && link
                .token
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
        if !(elected_prober
            || link.shared_open.load(Relaxed) && matches!(from.state(), OPEN | ELECTING))
        {
            return;
        }
        if self.close_with(from, Cause::Store) && elected_prober {
            // The lease is over: nothing of it to close or re-open.
            link.take_token();
        }
    }

    /// Writes a local opening through to the store (as the re-open of the
    /// election `token` won, if any); the store's time wins if it already
    /// holds a later one.
    pub(super) fn store_open(
        self: &Arc<Self>,
        opened: Word,
        period: Duration,
        token: Option<ProbeToken>,
    ) {
        self.enqueue(Write::Open {
            opened,
            period,
            token,
        });
    }

    /// Asks the store who probes, fleet-wide: electing -> half-open (won),
    /// electing -> open (lost: until the winner's new T or the end of its
    /// lease), electing -> closed (the fleet closed meanwhile).
    pub(super) fn elect(self: &Arc<Self>, electing: Word) {
        let period =
            Duration::from_nanos(self.open_period(self.streak.load(Relaxed).saturating_add(1)));
        // The prober's lease covers its whole probe, by renewals on a
        // store that renews leases (short: a dead prober frees the fleet
        // soon), else at once: no second prober is elected while it may
        // still answer.
        let lease = match &self.store {
            Some(link) if link.lease_ns > 0 => Duration::from_nanos(link.lease_ns),
            _ => Duration::from_nanos(self.s.half_open_ns()),
        };
        self.enqueue(Write::Elect {
            electing,
            period,
            lease,
        });
    }

    pub(super) fn store_close(self: &Arc<Self>, link: &StoreLink) {
        if let Some(token) = link.take_token() {
            self.enqueue(Write::Close {
                token,
                _on_its_way: Closing::new(&link.closing),
            });
        }
    }

    /// Queues `write`, and starts a task to drain the queue unless one is
    /// at it.
    fn enqueue(self: &Arc<Self>, write: Write) {
        let Some(link) = &self.store else { return };
        {
            let mut writes = link.writes.lock().unwrap_or_else(|e| e.into_inner());
            writes.queue.push_back(write);
            if writes.draining {
                return;
            }
            writes.draining = true;
        }
        let this = Arc::clone(self);
        if !spawn_tracked(self, async move { this.drain_writes().await }) {
            let dropped = {
                let mut writes = link.writes.lock().unwrap_or_else(|e| e.into_inner());
                writes.draining = false;
                std::mem::take(&mut writes.queue)
            };
            for _ in dropped {
                self.store_failed("write", &no_runtime());
            }
        }
    }

    /// Makes the queued writes one after the other.
    async fn drain_writes(self: Arc<Self>) {
        let Some(link) = &self.store else { return };
        // Whatever ends this task (the queue is empty, the runtime shuts
        // down), the next write starts a new one.
        struct Draining<'a>(&'a Mutex<Writes>);
        impl Drop for Draining<'_> {
            fn drop(&mut self) {
                self.0.lock().unwrap_or_else(|e| e.into_inner()).draining = false;
            }
        }
        let _draining = Draining(&link.writes);
        loop {
            let next = {
                let mut writes = link.writes.lock().unwrap_or_else(|e| e.into_inner());
                match writes.queue.pop_front() {
                    Some(write) => write,
                    None => {
                        writes.draining = false;
                        return;
                    }
                }
            };
            match next {
                Write::Open {
                    opened,
                    period,
                    token,
                } => {
                    let token = match token {
                        Some(token) => Some(link.after_renewal(token).await),
                        None => None,
                    };
                    self.write_open(link, opened, period, token).await;
                }
                Write::Elect {
                    electing,
                    period,
                    lease,
                } => {
                    // The call waiting for this election learns that it
                    // ended, also when this task is dropped mid-way.
                    struct Ended<'a>(&'a tokio::sync::Notify);
                    impl Drop for Ended<'_> {
                        fn drop(&mut self) {
                            self.0.notify_waiters();
                        }
                    }
                    let _ended = Ended(&self.elected);
                    self.run_election(link, electing, period, lease).await;
                }
                Write::Close { token, _on_its_way } => {
                    let closed = link
                        .store
                        .close(&self.name, link.after_renewal(token).await)
                        .await;
                    // Landed or not: reads asked from now on are adopted.
                    drop(_on_its_way);
                    match closed {
                        Ok(true) => self.store_ok(),
                        Ok(false) => {
                            // Fenced: the fleet re-elected or re-opened after
                            // this probe's lease lapsed. Follow it now rather
                            // than at the next refresh.
                            self.store_ok();
                            let _ = self.read_and_adopt(link).await;
                        }
                        Err(e) => self.store_failed("close", &e),
                    }
                }
            }
        }
    }

    async fn write_open(
        self: &Arc<Self>,
        link: &StoreLink,
        opened: Word,
        period: Duration,
        token: Option<ProbeToken>,
    ) {
        let core = &**self;
        let result = match token {
            Some(token) => link.store.reopen(&core.name, token, period).await,
            None => link.store.try_open(&core.name, period).await,
        };
        match result {
            Ok(remaining) => {
                self.store_ok();
                if Word(core.word.load(Acquire)).gen() == opened.gen() {
                    link.shared_open.store(true, Relaxed);
                }
                // The store's time wins: a zero (a fenced re-open: the
                // fleet closed or re-elected since) ends this opening now,
                // and the next call asks the fleet.
                let now = core.now_ns();
                let until = (now + nanos(remaining)) / NANOS_PER_MS;
                if until != opened.deadline_ms() {
                    let _ = core.cas(opened, opened.with_deadline(until));
                }
            }
            Err(e) => self.store_failed(
                if token.is_some() {
                    "reopen"
                } else {
                    "try_open"
                },
                &e,
            ),
        }
    }

    async fn run_election(
        self: &Arc<Self>,
        link: &StoreLink,
        electing: Word,
        period: Duration,
        lease: Duration,
    ) {
        let core = &**self;
        if link
            .token
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            // An earlier election of this process was won after its
            // timeout: asking again would lose against this process's own
            // lease.
            self.probe_on_held_lease(core.now_ns());
            return;
        }
        // Not cut at the election timeout: an answer that comes later is
        // still used (a won election not used would hold the fleet for its
        // lease). The call waiting for it is told at the timeout.
        let deadline =
            core.base + Duration::from_nanos(electing.deadline_ms().saturating_mul(NANOS_PER_MS));
        let mut election = std::pin::pin!(link.store.try_acquire_probe(&core.name, period, lease));
        let mut timeout = std::pin::pin!(tokio::time::sleep_until(deadline));
        let mut told = false;
        let result = std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = election.as_mut().poll(cx) {
                return Poll::Ready(result);
            }
            if !told && timeout.as_mut().poll(cx).is_ready() {
                told = true;
                core.elected.notify_waiters();
            }
            Poll::Pending
        })
        .await;
        if result.is_ok() {
            self.store_ok();
        }
        let now = core.now_ns();
        match result {
            Ok(Election::Won(token)) => {
                *link.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
                // Grow from the fleet's re-opens, not only this process's.
                core.streak.fetch_max(token.reopens(), Relaxed);
                if self.half_open(electing, now, Cause::OpenPeriodOver) {
                    self.start_heartbeat();
                } else {
                    // Won after the election timeout, when the breaker had
                    // gone back to open for a refresh interval (or on to a
                    // later election): the fleet's lease is this
                    // process's, so probe now rather than hold every
                    // process for the lease.
                    self.probe_on_held_lease(now);
                }
            }
            Ok(Election::Lost { remaining } | Election::Probing { remaining, .. }) => {
                let lease = match result {
                    Ok(Election::Probing { lease, .. }) => {
                        link.probe_until_ns
                            .store(now.saturating_add(nanos(lease)).max(1), Relaxed);
                        lease
                    }
                    _ => {
                        link.probe_until_ns.store(0, Relaxed);
                        Duration::ZERO
                    }
                };
                let until = (now + nanos(remaining.max(lease))) / NANOS_PER_MS;
                let current = Word(core.word.load(Acquire));
                // Also after the timeout (open for a refresh interval):
                // the fleet's time wins.
                let from = if current.state() == OPEN {
                    current
                } else {
                    electing
                };
                let to = if from == electing {
                    electing.next(OPEN, until)
                } else {
                    from.with_deadline(until)
                };
                if from.is_automatic() && core.cas(from, to).is_ok() {
                    link.shared_open.store(true, Relaxed);
                }
            }
            Ok(Election::Closed) => {
                let current = Word(core.word.load(Acquire));
                let from = if current.state() == OPEN {
                    current
                } else {
                    electing
                };
                self.close_with(from, Cause::Store);
            }
            Err(e) => {
                self.store_failed("try_acquire_probe", &e);
                self.election_failed(electing, now);
            }
        }
    }

    /// open | electing -> half-open: this process holds the fleet's probe
    /// lease (a win that came after the election timeout).
    fn probe_on_held_lease(self: &Arc<Self>, now: u64) {
        let current = Word(self.word.load(Acquire));
        if matches!(current.state(), OPEN | ELECTING)
            && current.is_automatic()
            && self.half_open(current, now, Cause::OpenPeriodOver)
        {
            self.start_heartbeat();
        }
    }

    /// Renews the fleet's probe lease every third of it while this process
    /// is half-open as the elected prober (this half-open state, with its
    /// token), on a store that renews leases. Holds the breaker weakly: a
    /// breaker that is dropped stops renewing, as a dead process does.
    fn start_heartbeat(self: &Arc<Self>) {
        let Some(link) = &self.store else { return };
        let half_open = Word(self.word.load(Acquire));
        if link.lease_ns == 0 || half_open.state() != HALF_OPEN {
            return;
        }
        let lease = Duration::from_nanos(link.lease_ns);
        let every = Duration::from_nanos((link.lease_ns / 3).max(NANOS_PER_MS));
        let weak = Arc::downgrade(self);
        let spawned = spawn(async move {
            // Renewals in a row that found no probe in flight.
            let mut idle = 0;
            loop {
                tokio::time::sleep(every).await;
                let Some(core) = weak.upgrade() else { return };
                idle = if core.probes_held(half_open.gen()) == 0 {
                    idle + 1
                } else {
                    0
                };
                if idle >= IDLE_RENEWALS {
                    core.give_probe_back(half_open).await;
                    return;
                }
                if !core.heartbeat(half_open, lease).await {
                    return;
                }
            }
        });
        if !spawned {
            self.store_failed("renew_probe", &no_runtime());
        }
    }

    /// half-open -> open: this process won the fleet's probe and has had
    /// no probe in flight for a while (no call came, or the call that
    /// waited for the election was dropped). Renewing on would hold every
    /// process of the fleet for as long as this one stays quiet: the probe
    /// is given back ([`Store::release_probe`]), so that the next
    /// candidate anywhere wins at once, and this process asks the fleet
    /// again at its next call. On a store that cannot give it back, the
    /// lease lapses unrenewed and the fleet elects again after the
    /// election's T.
    async fn give_probe_back(self: &Arc<Self>, half_open: Word) {
        let Some(link) = &self.store else { return };
        let _renewing = link.renewal.lock().await;
        let current = Word(self.word.load(Acquire));
        if current.state() != HALF_OPEN
            || current.gen() != half_open.gen()
            || self.probes_held(current.gen()) > 0
        {
            return;
        }
        let now = self.now_ns();
        // Until this process's lease has surely lapsed, unless the store
        // takes the probe back sooner.
        let lapsed = (now + link.lease_ns) / NANOS_PER_MS;
        let to = current.next(OPEN, lapsed);
        if self.cas(current, to).is_err() {
            return;
        }
        link.shared_open.store(true, Relaxed);
        self.after_transition(
            current,
            to,
            Cause::ProbeGivenBack,
            Default::default(),
            Some(Duration::from_nanos(link.lease_ns)),
        );
        let Some(token) = link.take_token() else {
            return;
        };
        match link.store.release_probe(&self.name, token).await {
            Ok(true) => {
                self.store_ok();
                // The fleet's probe is due: the next call here takes part
                // in the election.
                let open = Word(self.word.load(Acquire));
                if open == to {
                    let _ = self.cas(open, open.with_deadline(self.now_ns() / NANOS_PER_MS));
                }
            }
            Ok(false) => self.store_ok(),
            Err(e) => self.store_failed("release_probe", &e),
        }
    }

    /// One renewal of the lease of the half-open state `half_open`.
    /// Returns whether to go on.
    async fn heartbeat(self: &Arc<Self>, half_open: Word, lease: Duration) -> bool {
        let Some(link) = &self.store else {
            return false;
        };
        // The close or re-open that ends the probe waits for this renewal.
        let _renewing = link.renewal.lock().await;
        // The same half-open state (a probe's admission moves its
        // deadline, not its generation).
        let current = Word(self.word.load(Acquire));
        if current.state() != HALF_OPEN || current.gen() != half_open.gen() {
            return false;
        }
        let Some(token) = *link.token.lock().unwrap_or_else(|e| e.into_inner()) else {
            return false;
        };
        match link.store.renew_probe(&self.name, token, lease).await {
            Ok(Some(fresh)) => {
                self.store_ok();
                let mut held = link.token.lock().unwrap_or_else(|e| e.into_inner());
                if *held == Some(token) {
                    *held = Some(fresh);
                } else if held.is_none() {
                    // The probe ended meanwhile: its close or re-open,
                    // waiting for this renewal, uses the fresh token.
                    *link.renewed.lock().unwrap_or_else(|e| e.into_inner()) = Some((token, fresh));
                }
                true
            }
            Ok(None) => {
                // Fenced: the lease lapsed (this process was frozen, or
                // could not reach the store) and the fleet elected another
                // prober since. Stop probing; follow the fleet.
                self.store_ok();
                {
                    let mut held = link.token.lock().unwrap_or_else(|e| e.into_inner());
                    if *held == Some(token) {
                        *held = None;
                    }
                }
                let read = link.store.read(&self.name).await;
                self.leave_lost_lease(half_open, &read);
                false
            }
            Err(e) => {
                // The lease may lapse: then another process probes, and
                // this one's close or re-open is fenced.
                self.store_failed("renew_probe", &e);
                true
            }
        }
    }

    /// half-open -> closed | open: this process's probe lease was taken
    /// over; the store said `read`.
    fn leave_lost_lease(self: &Arc<Self>, started: Word, read: &Result<Decision, StoreError>) {
        let half_open = Word(self.word.load(Acquire));
        if half_open.state() != HALF_OPEN || half_open.gen() != started.gen() {
            return;
        }
        let now = self.now_ns();
        let remaining = match read {
            Ok(Decision::Closed) => {
                self.close_with(half_open, Cause::Store);
                return;
            }
            Ok(Decision::Open { remaining }) => *remaining,
            Ok(d @ Decision::Probing { remaining, lease }) => {
                if let Some(link) = &self.store {
                    link.heard_of_probe(d, now);
                }
                (*remaining).max(*lease)
            }
            // Asks the fleet again at the next call.
            _ => Duration::ZERO,
        };
        let to = half_open.next(OPEN, (now + nanos(remaining)) / NANOS_PER_MS);
        if self.cas(half_open, to).is_ok() {
            if let Some(link) = &self.store {
                link.shared_open.store(!remaining.is_zero(), Relaxed);
            }
            self.after_transition(
                half_open,
                to,
                Cause::Store,
                Default::default(),
                Some(remaining),
            );
        }
    }

    /// The election failed or never answered: electing -> open for one
    /// more refresh interval, to ask again, or, failing open once the store
    /// has been failing for a while, electing -> half-open, probing
    /// locally.
    ///
    /// An election past the election timeout is still answered, and a
    /// late win is used ([`probe_on_held_lease`](Self::probe_on_held_lease)).
    /// One whose answer is lost (the store's own timeout cut it after the
    /// script ran) may have been won: nobody then probes until the
    /// fleet's new T has passed and that lease has lapsed unrenewed (the
    /// probe lease, 2 s by default, on a store that renews leases; the
    /// whole probe wait on one that does not), and the fleet never gains a
    /// second prober. Only a store failing for
    /// [`DOWN_REFRESHES_BEFORE_LOCAL_PROBE`] refresh intervals lets each
    /// process probe on its own.
    pub(super) fn election_failed(self: &Arc<Self>, electing: Word, now: u64) {
        let core = &**self;
        let Some(link) = &core.store else {
            self.half_open(electing, now, Cause::OpenPeriodOver);
            return;
        };
        let refresh = link.refresh_ns.max(NANOS_PER_MS);
        let since = link.down_since.load(Relaxed);
        let down_long =
            since != 0 && now + 1 >= since + DOWN_REFRESHES_BEFORE_LOCAL_PROBE * refresh;
        if link.fail_closed || !down_long {
            let until = (now + refresh) / NANOS_PER_MS;
            let _ = core.cas(electing, electing.next(OPEN, until));
        } else {
            self.half_open(electing, now, Cause::OpenPeriodOver);
        }
    }

    /// Whether fail-closed mode rejects the closed path now.
    #[inline]
    pub(super) fn store_blocks(&self) -> bool {
        self.store
            .as_ref()
            .is_some_and(|link| link.fail_closed && link.down_since.load(Relaxed) != 0)
    }

    /// A store call worked: the store is up.
    pub(super) fn store_ok(&self) {
        if let Some(link) = &self.store {
            if link.down_since.load(Relaxed) != 0
                && link.down_since.swap(0, Relaxed) != 0
                && link.alarm.recovered()
            {
                tracing::info!(breaker = %self.name, "circuit_store_recovered");
            }
        }
    }

    /// Keeps the local decision (or, failing closed, rejects until the
    /// store answers) and raises the alarm: a `circuit_store_failed`
    /// warning at the first failure after the store worked, then at most
    /// once per second for all the breakers built from one fleet
    /// configuration (a keyed registry's), saying how many failures it
    /// stands for (every one is counted in
    /// [`Totals::store_errors`](crate::snapshot::Totals::store_errors)).
    pub(super) fn store_failed(self: &Arc<Self>, operation: &'static str, error: &StoreError) {
        let core = &**self;
        core.store_errors.fetch_add(1, Relaxed);
        core.metrics.store_error();
        let Some(link) = &core.store else { return };
        let now = core.now_ns();
        let _ = link
            .down_since
            .compare_exchange(0, now + 1, Relaxed, Relaxed);
        let Some(failures) = link.alarm.failed(STORE_WARNING_INTERVAL_MS) else {
            return;
        };
        // The whole chain: the cause (a refused login, an untrusted
        // certificate) is usually in a source.
        let mut cause = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(e) = source {
            cause.push_str(": ");
            cause.push_str(&e.to_string());
            source = e.source();
        }
        tracing::warn!(
            breaker = %core.name,
            operation,
            error = %cause,
            failures,
            "circuit_store_failed"
        );
    }
}

/// Spawns `future` on the current tokio runtime; false without one (there
/// is then no store traffic, and the caller says so).
fn spawn<F>(future: F) -> bool
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(future);
            true
        }
        Err(_) => false,
    }
}

/// Spawns `future`, a store call of `core`'s, counted in its link's
/// `in_flight` until it ends or is dropped (also unrun, without a
/// runtime): [`Core::flush`] waits for it.
fn spawn_tracked<F>(core: &Arc<Core>, future: F) -> bool
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    /// One store call in flight.
    struct InFlight(Arc<Core>);
    impl Drop for InFlight {
        fn drop(&mut self) {
            if let Some(link) = &self.0.store {
                if link.in_flight.fetch_sub(1, AcqRel) == 1 {
                    link.idle.notify_waiters();
                }
            }
        }
    }
    if let Some(link) = &core.store {
        link.in_flight.fetch_add(1, AcqRel);
    }
    let guard = InFlight(Arc::clone(core));
    spawn(async move {
        let _in_flight = guard;
        future.await;
    })
}

/// The shape of the fleet's window from a breaker's configuration: its
/// time window (or the default fleet window, placed by a count window's
/// size). The thresholds are left empty: each report fills them in from
/// the breaker's settings at the time (see [`Core::sync`]), so that a
/// reconfigured breaker reports its new ones.
fn fleet_rule(config: &BreakerConfig) -> FleetRule {
    let (buckets, bucket, count_window) = match config.window {
        WindowKind::Time { buckets, bucket } => (buckets, bucket, 0),
        WindowKind::Count { size } => (
            (DEFAULT_FLEET_WINDOW.as_secs() as usize).max(1),
            Duration::from_secs(1),
            size as u64,
        ),
    };
    FleetRule {
        buckets: u32::try_from(buckets).unwrap_or(u32::MAX).max(1),
        bucket: bucket.max(Duration::from_millis(1)),
        minimum_calls: 0,
        failure_rate_ppm: 0,
        slow_rate_ppm: 0,
        open_for: Duration::ZERO,
        count_window,
        budget: None,
    }
}

fn no_runtime() -> StoreError {
    StoreError::new("no tokio runtime on this thread: the store cannot be reached from here")
}

#[cfg(all(test, tower_resilience_loom))]
mod loom_models;

// Not under loom: these use the atomics outside a model.
#[cfg(test)]
#[cfg(not(tower_resilience_loom))]
mod tests {
    use std::sync::{Arc, Mutex as StdMutex, Weak};
    use std::time::Duration;

    use tower_resilience_base::clock::CoarseClock;

    use super::nanos;
    use super::*;
    use crate::store::{MemoryStore, StoreFuture};
    use crate::{Breaker, FleetConfig, Outcome, State};

    const MS: u64 = NANOS_PER_MS;

    /// A [`MemoryStore`] that pushes nothing (it keeps the watcher for the
    /// test to call), counts and records what it is asked, and fails,
    /// delays or fences what the test says.
    #[derive(Default)]
    struct Scripted {
        inner: MemoryStore,
        reads: AtomicUsize,
        failing_reads: AtomicUsize,
        watcher: StdMutex<Option<Weak<dyn Watcher>>>,
        /// The lease each election asked for.
        leases: StdMutex<Vec<Duration>>,
        /// Openings never answer.
        hang_opens: std::sync::atomic::AtomicBool,
        /// How long an election takes to answer.
        election_delay: StdMutex<Duration>,
        /// Lease renewals asked for.
        renewals: AtomicUsize,
        /// Says it renews leases (it fails every renewal).
        renews: std::sync::atomic::AtomicBool,
        /// Takes a probe given back (else answers that it did not).
        takes_back: std::sync::atomic::AtomicBool,
        /// Renewals answer that the lease was taken over (else they fail).
        fences: std::sync::atomic::AtomicBool,
        /// Every report, with the rule it came with.
        reports: StdMutex<Vec<(Report, FleetRule)>>,
        /// The period of each opening written.
        periods: StdMutex<Vec<Duration>>,
    }

    impl Scripted {
        fn last(&self) -> (Report, FleetRule) {
            *self.reports.lock().unwrap().last().expect("a report")
        }

        /// Openings written (or on their way).
        fn opens(&self) -> usize {
            self.periods.lock().unwrap().len()
        }
    }

    impl std::fmt::Debug for Scripted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Scripted").finish_non_exhaustive()
        }
    }

    impl Store for Scripted {
        fn try_open<'a>(&'a self, name: &'a str, open_for: Duration) -> StoreFuture<'a, Duration> {
            self.periods.lock().unwrap().push(open_for);
            if self.hang_opens.load(SeqCst) {
                return Box::pin(std::future::pending());
            }
            self.inner.try_open(name, open_for)
        }
        fn try_acquire_probe<'a>(
            &'a self,
            name: &'a str,
            open_for: Duration,
            lease: Duration,
        ) -> StoreFuture<'a, Election> {
            self.leases.lock().unwrap().push(lease);
            let delay = *self.election_delay.lock().unwrap();
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                self.inner.try_acquire_probe(name, open_for, lease).await
            })
        }
        fn renew_probe<'a>(
            &'a self,
            _name: &'a str,
            _token: ProbeToken,
            _lease: Duration,
        ) -> StoreFuture<'a, Option<ProbeToken>> {
            self.renewals.fetch_add(1, SeqCst);
            if self.fences.load(SeqCst) {
                return Box::pin(async { Ok(None) });
            }
            Box::pin(async { Err(StoreError::new("no renewals here")) })
        }
        fn renews_leases(&self) -> bool {
            self.renews.load(SeqCst)
        }
        fn release_probe<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
            if self.takes_back.load(SeqCst) {
                self.inner.release_probe(name, token)
            } else {
                Box::pin(async { Ok(false) })
            }
        }
        fn close<'a>(&'a self, name: &'a str, token: ProbeToken) -> StoreFuture<'a, bool> {
            self.inner.close(name, token)
        }
        fn reopen<'a>(
            &'a self,
            name: &'a str,
            token: ProbeToken,
            open_for: Duration,
        ) -> StoreFuture<'a, Duration> {
            self.inner.reopen(name, token, open_for)
        }
        fn read<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Decision> {
            self.reads.fetch_add(1, SeqCst);
            let failing = self
                .failing_reads
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                return Box::pin(async { Err(StoreError::new("read failed")) });
            }
            self.inner.read(name)
        }
        fn watch(&self, _name: &str, watcher: Weak<dyn Watcher>) {
            *self.watcher.lock().unwrap() = Some(watcher);
        }
        fn report<'a>(
            &'a self,
            name: &'a str,
            report: Report,
            rule: FleetRule,
        ) -> StoreFuture<'a, Decision> {
            self.reports.lock().unwrap().push((report, rule));
            self.inner.report(name, report, rule)
        }
    }

    /// Lets the spawned store calls run (paused time does not move).
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn link(fleet_window: bool) -> StoreLink {
        let fleet = FleetConfig::new(Arc::new(MemoryStore::new())).fleet_window(fleet_window);
        StoreLink::for_config(&BreakerConfig::new().fleet(fleet), "link").expect("a store")
    }

    #[test]
    fn a_close_on_its_way_is_counted_until_it_is_dropped() {
        let count = Arc::new(AtomicUsize::new(0));
        let first = Closing::new(&count);
        let second = Closing::new(&count);
        assert_eq!(count.load(Acquire), 2);
        drop(first);
        assert_eq!(count.load(Acquire), 1);
        drop(second);
        assert_eq!(count.load(Acquire), 0);
    }

    #[tokio::test]
    async fn a_call_is_noted_at_most_once_a_millisecond_and_only_for_a_fleet_window() {
        let shared = link(true);
        assert!(shared.shares_evidence());
        shared.note_call(5 * MS);
        assert_eq!(shared.last_call_ns.load(Relaxed), 5 * MS);
        // Exactly a millisecond later: not yet.
        shared.note_call(6 * MS);
        assert_eq!(shared.last_call_ns.load(Relaxed), 5 * MS);
        shared.note_call(6 * MS + 1);
        assert_eq!(shared.last_call_ns.load(Relaxed), 6 * MS + 1);

        let own = link(false);
        assert!(!own.shares_evidence());
        own.note_call(5 * MS);
        assert_eq!(own.last_call_ns.load(Relaxed), 0, "no fleet window");
    }

    #[tokio::test]
    async fn a_probe_heard_of_sets_the_wait_until_it_is_forgotten() {
        let link = link(false);
        let probing = Decision::Probing {
            remaining: Duration::from_secs(30),
            lease: Duration::from_secs(2),
        };
        link.heard_of_probe(&probing, 0);
        // Open for 10 s more, another process's probe for 2 s more: 2 s.
        let until = 10_000 * MS;
        assert_eq!(link.open_retry_after(until, 0), Duration::from_secs(2));
        link.forget_probe();
        assert_eq!(link.open_retry_after(until, 0), Duration::from_secs(10));
        // A decision that is not a probe clears it too.
        link.heard_of_probe(&probing, 0);
        link.heard_of_probe(&Decision::Closed, 0);
        assert_eq!(link.open_retry_after(until, 0), Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_probe_ended_during_a_renewal_takes_the_renewals_token_only_if_it_renewed_its_own() {
        let link = link(false);
        let (old, fresh, other) = (ProbeToken::new(1), ProbeToken::new(2), ProbeToken::new(3));
        *link.renewed.lock().unwrap() = Some((old, fresh));
        assert_eq!(link.after_renewal(other).await, other);
        assert!(link.renewed.lock().unwrap().is_none(), "taken either way");
        *link.renewed.lock().unwrap() = Some((old, fresh));
        assert_eq!(link.after_renewal(old).await, fresh);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_asked_before_a_transition_is_known_as_such() {
        let breaker = Breaker::with_config(
            "asked",
            BreakerConfig::new()
                .count_window(1)
                .minimum_calls(1)
                .fleet(FleetConfig::new(Arc::new(MemoryStore::new()))),
        );
        let asked = breaker.core.asked();
        assert!(!asked.before_a_transition(&breaker.core));
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        assert_eq!(breaker.snapshot().state, State::Open);
        assert!(asked.before_a_transition(&breaker.core));
        assert!(!breaker.core.asked().before_a_transition(&breaker.core));
    }

    #[tokio::test(start_paused = true)]
    async fn a_resync_reads_at_once_and_tries_a_failed_read_again_a_refresh_interval_apart() {
        let store = Arc::new(Scripted::default());
        let refresh = Duration::from_secs(1);
        let breaker = Breaker::with_config(
            "shared",
            BreakerConfig::new().fleet(
                FleetConfig::new(Arc::clone(&store) as Arc<dyn Store>).refresh_interval(refresh),
            ),
        );
        // The fleet opened the circuit while this process heard nothing.
        store
            .inner
            .try_open("shared", Duration::from_secs(30))
            .await
            .unwrap();
        settle().await;
        store.reads.store(0, SeqCst);
        store.failing_reads.store(2, SeqCst);
        let watcher = store.watcher.lock().unwrap().clone().expect("watched");
        watcher.upgrade().expect("alive").resync();
        settle().await;
        assert_eq!(store.reads.load(SeqCst), 1, "the first read at once");
        assert_eq!(breaker.snapshot().state, State::Closed, "it failed");
        tokio::time::advance(refresh).await;
        settle().await;
        assert_eq!(store.reads.load(SeqCst), 2);
        assert_eq!(breaker.snapshot().state, State::Closed, "it failed too");
        tokio::time::advance(refresh).await;
        settle().await;
        assert_eq!(store.reads.load(SeqCst), 3);
        assert_eq!(breaker.snapshot().state, State::Open, "the third adopts it");
        tokio::time::advance(refresh * 5).await;
        settle().await;
        assert_eq!(store.reads.load(SeqCst), 3, "no read after one that worked");
    }

    /// A breaker of a one-call window (open 5 s, no jitter) whose fleet
    /// shares `store`, telling time by a clock that only the test moves
    /// (so that threads without a runtime read the same time).
    fn on_manual_clock(store: FleetConfig) -> (Breaker, &'static CoarseClock) {
        let clock = CoarseClock::manual();
        let mut config = BreakerConfig::new()
            .count_window(1)
            .minimum_calls(1)
            .open_period(Duration::from_secs(5))
            .jitter(0.0)
            .fleet(store);
        config.coarse_clock = Some(clock);
        (Breaker::with_config("manual", config), clock)
    }

    /// Polls `breaker`'s readiness once, with a waker that does nothing.
    fn ready_once(breaker: &Breaker) -> Poll<()> {
        let mut wait = ElectionWait::default();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        breaker.poll_election(&mut wait, &mut cx)
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_runtime_the_call_that_ends_an_open_period_does_not_wait_for_an_election() {
        let (breaker, clock) = on_manual_clock(FleetConfig::new(Arc::new(MemoryStore::new())));
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        assert_eq!(breaker.snapshot().state, State::Open);
        clock.advance(Duration::from_secs(6));
        let on_a_plain_thread = breaker.clone();
        let polled = std::thread::spawn(move || ready_once(&on_a_plain_thread))
            .join()
            .expect("no panic");
        assert!(polled.is_ready(), "no runtime to run an election on");
        assert_eq!(breaker.snapshot().state, State::Open, "none started");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_runtime_a_stale_decision_does_not_wait_for_a_read() {
        let (breaker, _clock) = on_manual_clock(
            FleetConfig::new(Arc::new(MemoryStore::new())).max_staleness(Duration::from_millis(1)),
        );
        assert_eq!(breaker.snapshot().state, State::Closed);
        let on_a_plain_thread = breaker.clone();
        let polled = std::thread::spawn(move || ready_once(&on_a_plain_thread))
            .join()
            .expect("no panic");
        assert!(polled.is_ready(), "no runtime to read on");
    }

    #[tokio::test(start_paused = true)]
    async fn a_circuit_in_metrics_only_mode_waits_for_no_read_and_no_election() {
        let store = Arc::new(Scripted::default());
        let (breaker, clock) = on_manual_clock(
            FleetConfig::new(Arc::clone(&store) as Arc<dyn Store>)
                .max_staleness(Duration::from_millis(1)),
        );
        breaker.set_mode(Mode::MetricsOnly);
        settle().await;
        let reads = store.reads.load(SeqCst);
        // Closed, the decision never read: an automatic breaker would read
        // it first.
        assert!(ready_once(&breaker).is_ready());
        settle().await;
        assert_eq!(store.reads.load(SeqCst), reads, "no read first");
        // Open, its period over: an automatic breaker would elect.
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        assert_eq!(breaker.snapshot().state, State::Open, "it still judges");
        clock.advance(Duration::from_secs(6));
        assert!(ready_once(&breaker).is_ready());
        assert_eq!(breaker.snapshot().state, State::Open, "no election");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_is_pending_with_calls_unreported_or_store_calls_in_flight() {
        let breaker = Breaker::with_config(
            "pending",
            BreakerConfig::new().fleet(
                FleetConfig::new(Arc::new(MemoryStore::new()))
                    .fleet_window(true)
                    .refresh_interval(Duration::from_secs(1)),
            ),
        );
        let core = &breaker.core;
        let link = core.store.as_ref().unwrap();
        settle().await;
        assert!(!core.flush_pending(), "nothing counted, nothing running");
        // A call counted, nothing running.
        let permit = breaker.try_acquire().unwrap();
        settle().await; // the read its admission started
        permit.record(Outcome::Success);
        assert_eq!(link.in_flight.load(Acquire), 0);
        assert_eq!(core.unreported(link), 1);
        assert!(core.flush_pending(), "a call to report");
        breaker.flush().await.unwrap();
        assert!(!core.flush_pending());
        // Nothing to report, a read running.
        core.maybe_refresh(link, core.now_ns() + 10 * NANOS_PER_MS * 1000);
        assert!(link.in_flight.load(Acquire) > 0);
        assert_eq!(core.unreported(link), 0);
        assert!(core.flush_pending(), "a store call in flight");
        settle().await;
        assert!(!core.flush_pending());
    }

    fn recorded(
        config: BreakerConfig,
        fleet: impl Fn(FleetConfig) -> FleetConfig,
    ) -> (Breaker, Arc<Scripted>) {
        let store = Arc::new(Scripted::default());
        let fleet =
            fleet(FleetConfig::new(Arc::clone(&store) as Arc<dyn Store>).fleet_window(true));
        (
            Breaker::with_config("recorded", config.jitter(0.0).fleet(fleet)),
            store,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_carries_the_thresholds_of_the_configuration_now() {
        // Without slow-call detection, no slow rule for the fleet.
        let (plain, plain_store) = recorded(BreakerConfig::new(), |f| f);
        plain.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        assert_eq!(plain_store.last().1.slow_rate_ppm, 0);

        let (breaker, store) = recorded(
            BreakerConfig::new()
                .count_window(100)
                .minimum_calls(50)
                .open_period(Duration::from_secs(5))
                .slow_calls(Duration::from_secs(1), 0.5),
            |f| f,
        );
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        let thresholds = |(report, rule): (Report, FleetRule)| {
            assert_eq!((report.calls, report.failures), (1, 1));
            (
                rule.open_for.as_secs(),
                rule.minimum_calls,
                rule.failure_rate_ppm,
                rule.slow_rate_ppm,
            )
        };
        assert_eq!(thresholds(store.last()), (5, 50, 500_000, 500_000));
        let _ = breaker.reconfigure(
            breaker
                .config()
                .minimum_calls(60)
                .open_period(Duration::from_secs(7))
                .max_open_period(Duration::from_secs(70))
                .failure_rate(0.3)
                .slow_calls(Duration::from_secs(1), 0.4),
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        assert_eq!(thresholds(store.last()), (7, 60, 300_000, 400_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_of_failures_made_by_a_refresh_holds_the_next_flush_back() {
        let flush = Duration::from_secs(1);
        let (breaker, store) = recorded(
            BreakerConfig::new().count_window(100).minimum_calls(100),
            |f| {
                f.flush_interval(flush)
                    .refresh_interval(Duration::from_millis(100))
            },
        );
        let link = breaker.core.store.as_ref().unwrap();
        breaker.try_acquire().unwrap().record(Outcome::Failure); // flushed at once
        settle().await;
        assert_eq!(link.next_flush_ns.load(Relaxed), nanos(flush));
        tokio::time::advance(Duration::from_millis(10)).await;
        breaker.try_acquire().unwrap().record(Outcome::Failure); // held back
        settle().await;
        assert_eq!(store.reports.lock().unwrap().len(), 1);
        tokio::time::advance(Duration::from_millis(190)).await;
        // The periodic read is due: it reports the failure held back.
        let permit = breaker.try_acquire().unwrap();
        settle().await;
        assert_eq!(store.last().0.failures, 1);
        assert_eq!(
            link.next_flush_ns.load(Relaxed),
            nanos(Duration::from_millis(200) + flush)
        );
        // A healthy report does not hold the next flush back.
        permit.record(Outcome::Success);
        tokio::time::advance(Duration::from_millis(1_100)).await;
        drop(breaker.try_acquire().unwrap());
        settle().await;
        assert_eq!(store.last().0.failures, 0);
        assert_eq!(
            link.next_flush_ns.load(Relaxed),
            nanos(Duration::from_millis(200) + flush)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_places_its_calls_before_the_failures_in_a_row_or_at_the_newest_call() {
        let (breaker, store) = recorded(
            BreakerConfig::new().count_window(100).minimum_calls(100),
            |f| {
                f.flush_interval(Duration::from_secs(1))
                    .refresh_interval(Duration::from_secs(1))
            },
        );
        let ms = Duration::from_millis;
        tokio::time::advance(ms(10)).await;
        for outcome in [Outcome::Success, Outcome::Success, Outcome::Failure] {
            breaker.try_acquire().unwrap().record(outcome);
        }
        settle().await;
        // The first report: one failure in a row, its share of a refresh
        // interval (no report before it to measure from).
        let (first, _) = store.last();
        assert_eq!((first.calls, first.failures, first.tail), (3, 1, 1));
        assert_eq!(first.tail_span, Duration::from_nanos(1_000_000_000 / 3));

        tokio::time::advance(ms(500)).await;
        breaker.try_acquire().unwrap().record(Outcome::Success);
        tokio::time::advance(ms(590)).await;
        // The periodic read is due (at 1.01 s): a report without failures
        // places its call at the newest admitted, 590 ms ago.
        drop(breaker.try_acquire().unwrap());
        settle().await;
        let (second, _) = store.last();
        assert_eq!((second.calls, second.failures, second.tail), (1, 0, 0));
        assert_eq!(second.tail_span, ms(590));

        tokio::time::advance(ms(1_100)).await;
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        // One failure in a row, all of the time since the last report.
        let (third, _) = store.last();
        assert_eq!((third.calls, third.failures, third.tail), (1, 1, 1));
        assert_eq!(third.tail_span, ms(1_100));

        // Held back by the flush interval, then flushed by hand 300 ms
        // after the last report: two failures in a row of three calls
        // began two thirds of that ago.
        tokio::time::advance(ms(100)).await;
        breaker.try_acquire().unwrap().record(Outcome::Success);
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        tokio::time::advance(ms(200)).await;
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        breaker.flush().await.unwrap();
        let (fourth, _) = store.last();
        assert_eq!((fourth.calls, fourth.failures, fourth.tail), (3, 2, 2));
        assert_eq!(fourth.tail_span, ms(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_time_windows_report_places_nothing() {
        let (breaker, store) = recorded(
            BreakerConfig::new()
                .time_window(10, Duration::from_secs(1))
                .minimum_calls(100),
            |f| f,
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        breaker.try_acquire().unwrap().record(Outcome::Success);
        let failing = breaker.try_acquire().unwrap();
        settle().await;
        // Its failure counted (and reported) 100 ms after the newest call.
        tokio::time::advance(Duration::from_millis(100)).await;
        failing.record(Outcome::Failure);
        settle().await;
        let (report, rule) = store.last();
        assert_eq!(rule.count_window, 0);
        assert_eq!((report.calls, report.failures), (2, 1));
        assert_eq!((report.tail, report.tail_span), (0, Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_right_after_another_places_its_failures_now() {
        let (breaker, store) = recorded(
            BreakerConfig::new().count_window(100).minimum_calls(100),
            |f| {
                f.flush_interval(Duration::from_secs(1))
                    .refresh_interval(Duration::from_secs(1))
            },
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        // A second failure at the same instant, held back by the flush
        // interval, then flushed by hand: no time since the last report.
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        breaker.flush().await.unwrap();
        let reports = store.reports.lock().unwrap().clone();
        assert_eq!(reports.len(), 2);
        let (second, _) = reports[1];
        assert_eq!((second.calls, second.failures, second.tail), (1, 1, 1));
        assert_eq!(second.tail_span, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_newest_call_known_a_report_places_its_calls_by_their_share() {
        let (breaker, store) = recorded(
            BreakerConfig::new().count_window(100).minimum_calls(100),
            |f| f.refresh_interval(Duration::from_secs(1)),
        );
        // Calls in the breaker's first millisecond are not noted.
        breaker.try_acquire().unwrap().record(Outcome::Success);
        breaker.try_acquire().unwrap().record(Outcome::Success);
        assert_eq!(
            breaker
                .core
                .store
                .as_ref()
                .unwrap()
                .last_call_ns
                .load(Relaxed),
            0
        );
        breaker.flush().await.unwrap();
        let (report, _) = store.last();
        assert_eq!((report.calls, report.tail), (2, 0));
        assert_eq!(report.tail_span, Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_running_automatic_opening_the_store_lacks_is_written_again() {
        let config = || {
            BreakerConfig::new()
                .count_window(1)
                .minimum_calls(1)
                .open_period(Duration::from_secs(5))
                .ramp_up(Duration::from_secs(10))
        };
        let (breaker, store) = recorded(config(), |f| f);
        let (core, link) = (&breaker.core, breaker.core.store.as_ref().unwrap());
        let rewrite = || async {
            core.rewrite_open();
            settle().await;
            store.opens()
        };
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        // Written through (once more if the read its admission started
        // found no record before the write landed).
        let written = store.opens();
        assert!(written >= 1);
        assert!(link.shared_open.load(Relaxed));
        assert_eq!(rewrite().await, written, "the store holds it");
        tokio::time::advance(Duration::from_secs(2)).await;
        link.shared_open.store(false, Relaxed);
        assert_eq!(
            rewrite().await,
            written + 1,
            "the store lost it: written again"
        );
        assert!(link.shared_open.load(Relaxed));
        assert_eq!(
            store.periods.lock().unwrap().last(),
            Some(&Duration::from_secs(3)),
            "for what is left of its period"
        );
        tokio::time::advance(Duration::from_secs(4)).await;
        link.shared_open.store(false, Relaxed);
        assert_eq!(rewrite().await, written + 1, "its period is over");

        // Closed again (the election won, the probe good), ramping up: the
        // word's deadline is the ramp's end, in the future.
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        breaker
            .try_acquire()
            .expect("the probe")
            .record(Outcome::Success);
        settle().await;
        assert_eq!(breaker.snapshot().state, State::Closed);
        let written = store.opens();
        link.shared_open.store(false, Relaxed);
        assert_eq!(rewrite().await, written, "closed: nothing to write");

        // Why an open word is always automatic: a manual mode closes the
        // circuit, and it stays closed under that mode.
        breaker.set_mode(Mode::ForcedOpen);
        assert_eq!(Word(breaker.core.word.load(Acquire)).state(), CLOSED);
    }

    /// A breaker named "adopt" of a one-call window (open 5 s, no jitter)
    /// on `store`.
    fn one_call(store: Arc<dyn Store>) -> Breaker {
        one_call_with(store, |f| f)
    }

    /// [`one_call`] with `fleet` applied to its fleet configuration.
    fn one_call_with(
        store: Arc<dyn Store>,
        fleet: impl FnOnce(FleetConfig) -> FleetConfig,
    ) -> Breaker {
        Breaker::with_config(
            "adopt",
            BreakerConfig::new()
                .count_window(1)
                .minimum_calls(1)
                .open_period(Duration::from_secs(5))
                .jitter(0.0)
                .fleet(fleet(FleetConfig::new(store))),
        )
    }

    fn deadline_ms(breaker: &Breaker) -> u64 {
        Word(breaker.core.word.load(Acquire)).deadline_ms()
    }

    #[tokio::test(start_paused = true)]
    async fn the_fleets_opening_is_adopted_until_its_end_unless_asked_before_a_transition() {
        let breaker = one_call(Arc::new(Scripted::default()));
        let core = &breaker.core;
        tokio::time::advance(Duration::from_millis(1_500)).await;
        let asked = core.asked();
        core.transitions.fetch_add(1, AcqRel); // a transition since
        core.adopt_open(Duration::from_secs(30), asked);
        assert_eq!(breaker.snapshot().state, State::Closed, "asked before it");
        core.adopt_open(Duration::from_secs(30), core.asked());
        assert_eq!(breaker.snapshot().state, State::Open);
        assert_eq!(deadline_ms(&breaker), 31_500, "until the fleet's end");
        assert!(core.store.as_ref().unwrap().shared_open.load(Relaxed));
    }

    #[tokio::test(start_paused = true)]
    async fn an_opening_of_its_own_the_store_does_not_hold_keeps_its_end() {
        let breaker = one_call(Arc::new(Scripted::default()));
        let core = &breaker.core;
        let link = core.store.as_ref().unwrap();
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        assert_eq!(deadline_ms(&breaker), 5_000);
        link.shared_open.store(false, Relaxed);
        core.adopt_open(Duration::from_secs(30), core.asked());
        assert_eq!(deadline_ms(&breaker), 5_000, "not the fleet's opening");
        link.shared_open.store(true, Relaxed);
        core.adopt_open(Duration::from_secs(30), core.asked());
        assert_eq!(deadline_ms(&breaker), 30_000, "the fleet's: its end wins");
    }

    #[tokio::test(start_paused = true)]
    async fn the_fleets_close_is_not_adopted_when_asked_before_a_transition() {
        let breaker = one_call(Arc::new(Scripted::default()));
        let core = &breaker.core;
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        assert!(core.store.as_ref().unwrap().shared_open.load(Relaxed));
        let asked = core.asked();
        core.transitions.fetch_add(1, AcqRel); // a transition since
        core.adopt_closed(asked);
        assert_eq!(breaker.snapshot().state, State::Open, "asked before it");
        core.adopt_closed(core.asked());
        assert_eq!(breaker.snapshot().state, State::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn the_fleets_close_ends_only_a_shared_opening_or_the_elected_probers_probing() {
        let breaker = one_call(Arc::new(Scripted::default()));
        let core = &breaker.core;
        let link = core.store.as_ref().unwrap();
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        // An opening of its own the store does not hold stays, with or
        // without a token of an earlier election.
        link.shared_open.store(false, Relaxed);
        core.adopt_closed(core.asked());
        assert_eq!(breaker.snapshot().state, State::Open);
        *link.token.lock().unwrap() = Some(ProbeToken::new(1));
        core.adopt_closed(core.asked());
        assert_eq!(breaker.snapshot().state, State::Open);
        link.take_token();
        link.shared_open.store(true, Relaxed);

        // Half-open as the fleet's elected prober.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        assert_eq!(breaker.snapshot().state, State::HalfOpen);
        let token = link.take_token().expect("elected");
        // Without the token (not the fleet's prober), a close read leaves
        // the probing alone.
        core.adopt_closed(core.asked());
        assert_eq!(breaker.snapshot().state, State::HalfOpen);
        *link.token.lock().unwrap() = Some(token);
        core.adopt_closed(core.asked());
        assert_eq!(breaker.snapshot().state, State::Closed);
        assert!(link.take_token().is_none(), "the lease is over");
    }

    #[tokio::test(start_paused = true)]
    async fn the_fleets_close_of_a_shared_opening_leaves_a_token_to_the_write_that_holds_it() {
        let breaker = one_call(Arc::new(Scripted::default()));
        let core = &breaker.core;
        let link = core.store.as_ref().unwrap();
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        assert!(link.shared_open.load(Relaxed));
        // Not the elected prober's: only an election's winner gives its
        // token back when the fleet closes.
        *link.token.lock().unwrap() = Some(ProbeToken::new(1));
        core.adopt_closed(core.asked());
        assert_eq!(breaker.snapshot().state, State::Closed);
        assert_eq!(link.take_token(), Some(ProbeToken::new(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_renews_no_lease_is_asked_for_one_of_the_whole_probe() {
        let store = Arc::new(Scripted::default());
        let breaker = Breaker::with_config(
            "lease",
            BreakerConfig::new()
                .count_window(1)
                .minimum_calls(1)
                .open_period(Duration::from_secs(5))
                .jitter(0.0)
                .max_half_open_wait(Duration::from_secs(7))
                .fleet(
                    FleetConfig::new(Arc::clone(&store) as Arc<dyn Store>)
                        .probe_lease(Duration::from_secs(2)),
                ),
        );
        assert_eq!(breaker.core.store.as_ref().unwrap().lease_ns, 0);
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        assert_eq!(*store.leases.lock().unwrap(), [Duration::from_secs(7)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_stores_later_end_of_an_opening_wins() {
        let store = Arc::new(Scripted::default());
        // Another process opened the circuit for 30 s.
        store
            .inner
            .try_open("adopt", Duration::from_secs(30))
            .await
            .unwrap();
        let breaker = one_call(Arc::clone(&store) as Arc<dyn Store>);
        tokio::time::advance(Duration::from_millis(1_000)).await;
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        assert_eq!(deadline_ms(&breaker), 6_000, "its own 5 s");
        settle().await;
        assert_eq!(deadline_ms(&breaker), 30_000, "the fleet's, from the store");
        assert!(breaker
            .core
            .store
            .as_ref()
            .unwrap()
            .shared_open
            .load(Relaxed));
    }

    #[test]
    fn a_write_task_dropped_with_its_runtime_lets_the_next_write_start_a_new_one() {
        let store = Arc::new(Scripted::default());
        store.hang_opens.store(true, SeqCst);
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let breaker = first.block_on(async {
            let breaker = one_call(Arc::clone(&store) as Arc<dyn Store>);
            breaker.try_acquire().unwrap().record(Outcome::Failure);
            settle().await;
            breaker
        });
        assert_eq!(store.opens(), 1, "its write hangs");
        // The runtime goes, and the task draining the writes with it.
        drop(first);
        store.hang_opens.store(false, SeqCst);
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        second.block_on(async {
            breaker.core.rewrite_open();
            settle().await;
        });
        assert!(store.opens() >= 2, "a new task wrote it");
        assert!(breaker
            .core
            .store
            .as_ref()
            .unwrap()
            .shared_open
            .load(Relaxed));
    }

    /// `breaker` (a [`one_call`] breaker) opened by a failure at the
    /// current time, and its period over: the next call elects.
    async fn open_and_wait(breaker: &Breaker) {
        breaker.try_acquire().unwrap().record(Outcome::Failure);
        settle().await;
        tokio::time::advance(Duration::from_secs(5)).await;
    }

    /// Another process wins the election of `name` on `store` (asking for
    /// a 10 s period and a 3 s lease): its token.
    async fn another_wins(store: &MemoryStore, name: &str) -> ProbeToken {
        match store
            .try_acquire_probe(name, Duration::from_secs(10), Duration::from_secs(3))
            .await
            .unwrap()
        {
            Election::Won(token) => token,
            other => panic!("the other process should win, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_election_keeps_the_circuit_open_until_the_winners_end() {
        let store = Arc::new(Scripted::default());
        let breaker = one_call(Arc::clone(&store) as Arc<dyn Store>);
        open_and_wait(&breaker).await;
        another_wins(&store.inner, "adopt").await;
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        assert_eq!(breaker.snapshot().state, State::Open, "lost");
        // Until the winner's T (10 s from now) or its lease (3 s).
        let until = deadline_ms(&breaker);
        assert!((8_000..=15_000).contains(&until), "{until}");
    }

    /// A [`one_call`] breaker whose elections time out after 500 ms,
    /// reading every second.
    fn late(store: &Arc<Scripted>) -> Breaker {
        one_call_with(Arc::clone(store) as Arc<dyn Store>, |f| {
            f.election_timeout(Duration::from_millis(500))
                .refresh_interval(Duration::from_secs(1))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_election_answered_after_its_timeout_still_sets_the_end() {
        let store = Arc::new(Scripted::default());
        *store.election_delay.lock().unwrap() = Duration::from_secs(2);
        let breaker = late(&store);
        open_and_wait(&breaker).await;
        another_wins(&store.inner, "adopt").await;
        // Reads fail: only the election's answer tells the fleet's time.
        store.failing_reads.store(usize::MAX, SeqCst);
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        tokio::time::advance(Duration::from_millis(600)).await;
        // The timeout passed: open for a refresh interval.
        assert!(breaker.try_acquire().is_err());
        assert_eq!(breaker.snapshot().state, State::Open);
        assert_eq!(deadline_ms(&breaker), 6_600);
        tokio::time::advance(Duration::from_millis(1_400)).await;
        settle().await;
        // The answer (at 7 s): the winner's time wins.
        let until = deadline_ms(&breaker);
        assert!(until >= 10_000, "{until}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_answered_after_the_elections_timeout_closes() {
        let store = Arc::new(Scripted::default());
        *store.election_delay.lock().unwrap() = Duration::from_secs(2);
        let breaker = late(&store);
        open_and_wait(&breaker).await;
        // Reads fail: only the election's answer tells of the close.
        store.failing_reads.store(usize::MAX, SeqCst);
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(breaker.try_acquire().is_err());
        assert_eq!(breaker.snapshot().state, State::Open, "timed out");
        // Meanwhile another process probed and closed the circuit.
        let token = another_wins(&store.inner, "adopt").await;
        assert!(store.inner.close("adopt", token).await.unwrap());
        tokio::time::advance(Duration::from_millis(1_400)).await;
        settle().await;
        assert_eq!(breaker.snapshot().state, State::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn an_elected_prober_on_a_store_without_renewals_keeps_its_probe() {
        let store = Arc::new(Scripted::default());
        let breaker = one_call(Arc::clone(&store) as Arc<dyn Store>);
        open_and_wait(&breaker).await;
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        assert_eq!(breaker.snapshot().state, State::HalfOpen, "won");
        // No heartbeat: nothing renewed, nothing given back while no call
        // comes (the lease is the whole probe wait).
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
        assert_eq!(store.renewals.load(SeqCst), 0);
        assert_eq!(breaker.snapshot().state, State::HalfOpen);
    }

    #[tokio::test(start_paused = true)]
    async fn an_elected_probers_heartbeat_starts_without_a_store_error() {
        let breaker = one_call(Arc::new(MemoryStore::new()));
        open_and_wait(&breaker).await;
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        assert_eq!(breaker.snapshot().state, State::HalfOpen, "won");
        assert_eq!(breaker.snapshot().totals.store_errors, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_is_given_back_only_by_the_half_open_period_that_won_it() {
        let (breaker, half_open) = won(Arc::new(MemoryStore::new())).await;
        let earlier = earlier(half_open);
        breaker.core.give_probe_back(earlier).await;
        assert_eq!(breaker.snapshot().state, State::HalfOpen, "not its own");
        breaker.core.give_probe_back(half_open).await;
        assert_eq!(breaker.snapshot().state, State::Open, "given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_in_flight_is_not_given_back_and_a_probe_given_back_is_due_at_once() {
        // A store that takes the probe back and pushes nothing: only the
        // breaker's own move makes the probe due.
        let store = Arc::new(Scripted::default());
        store.renews.store(true, SeqCst);
        store.takes_back.store(true, SeqCst);
        let breaker = one_call(Arc::clone(&store) as Arc<dyn Store>);
        open_and_wait(&breaker).await;
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        let half_open = Word(breaker.core.word.load(Acquire));
        let probe = breaker.try_acquire().expect("the probe");
        breaker.core.give_probe_back(half_open).await;
        assert_eq!(
            breaker.snapshot().state,
            State::HalfOpen,
            "a probe in flight"
        );
        drop(probe);
        tokio::time::advance(Duration::from_millis(250)).await;
        breaker.core.give_probe_back(half_open).await;
        assert_eq!(breaker.snapshot().state, State::Open);
        // The store took it back: the fleet's probe is due now.
        assert_eq!(deadline_ms(&breaker), 5_250);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_the_store_does_not_take_back_is_due_when_its_lease_has_lapsed() {
        let store = Arc::new(Scripted::default());
        store.renews.store(true, SeqCst);
        let breaker = one_call_with(Arc::clone(&store) as Arc<dyn Store>, |f| {
            f.probe_lease(Duration::from_secs(3))
        });
        open_and_wait(&breaker).await;
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        let half_open = Word(breaker.core.word.load(Acquire));
        assert_eq!(half_open.state(), HALF_OPEN);
        tokio::time::advance(Duration::from_millis(250)).await;
        breaker.core.give_probe_back(half_open).await;
        assert_eq!(breaker.snapshot().state, State::Open);
        assert_eq!(deadline_ms(&breaker), 5_250 + 3_000);
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_half_open_period_that_won_the_probe_renews_its_lease() {
        let store = Arc::new(Scripted::default());
        store.renews.store(true, SeqCst);
        let (breaker, half_open) = won(Arc::clone(&store) as Arc<dyn Store>).await;
        let earlier = earlier(half_open);
        let lease = Duration::from_secs(3);
        assert!(!breaker.core.heartbeat(earlier, lease).await);
        assert_eq!(store.renewals.load(SeqCst), 0, "not its lease");
        let _ = breaker.core.heartbeat(half_open, lease).await;
        assert_eq!(store.renewals.load(SeqCst), 1);
    }

    /// A [`one_call`] breaker on `store` that won the fleet's election at
    /// 5 s: half-open, and its half-open word.
    async fn won(store: Arc<dyn Store>) -> (Breaker, Word) {
        let breaker = one_call(store);
        open_and_wait(&breaker).await;
        assert!(breaker.try_acquire().is_err(), "electing");
        settle().await;
        let half_open = Word(breaker.core.word.load(Acquire));
        assert_eq!(half_open.state(), HALF_OPEN, "won");
        (breaker, half_open)
    }

    /// A half-open word of the generation before `half_open`'s.
    fn earlier(half_open: Word) -> Word {
        Word::new(
            HALF_OPEN,
            half_open.mode(),
            half_open.gen().wrapping_sub(1),
            0,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_follows_what_the_store_says() {
        let secs = Duration::from_secs;
        // Closed: closed here too.
        let (breaker, half_open) = won(Arc::new(Scripted::default())).await;
        breaker
            .core
            .leave_lost_lease(half_open, &Ok(Decision::Closed));
        assert_eq!(breaker.snapshot().state, State::Closed);

        // Open: until the fleet's end, shared.
        let (breaker, half_open) = won(Arc::new(Scripted::default())).await;
        let link = breaker.core.store.as_ref().unwrap();
        link.shared_open.store(false, Relaxed);
        let open = Decision::Open { remaining: secs(8) };
        breaker.core.leave_lost_lease(half_open, &Ok(open));
        assert_eq!(breaker.snapshot().state, State::Open);
        assert_eq!(deadline_ms(&breaker), 13_000);
        assert!(link.shared_open.load(Relaxed));

        // Another process probes: until its lease or T, whichever is later,
        // and callers are told to wait for its lease.
        let (breaker, half_open) = won(Arc::new(Scripted::default())).await;
        let probing = Decision::Probing {
            remaining: secs(4),
            lease: secs(6),
        };
        breaker.core.leave_lost_lease(half_open, &Ok(probing));
        assert_eq!(deadline_ms(&breaker), 11_000);
        let link = breaker.core.store.as_ref().unwrap();
        assert_eq!(link.open_retry_after(20_000 * MS, 5_000 * MS), secs(6));

        // A failed read: open with the period over, not shared; the next
        // call asks the fleet.
        let (breaker, half_open) = won(Arc::new(Scripted::default())).await;
        breaker
            .core
            .leave_lost_lease(half_open, &Err(StoreError::new("read failed")));
        assert_eq!(breaker.snapshot().state, State::Open);
        assert_eq!(deadline_ms(&breaker), 5_000);
        assert!(!breaker
            .core
            .store
            .as_ref()
            .unwrap()
            .shared_open
            .load(Relaxed));

        // Told of a half-open period of its own that has ended: nothing.
        let (breaker, half_open) = won(Arc::new(Scripted::default())).await;
        let earlier = earlier(half_open);
        breaker
            .core
            .leave_lost_lease(earlier, &Ok(Decision::Closed));
        assert_eq!(breaker.snapshot().state, State::HalfOpen);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_fenced_by_the_store_drops_the_token_and_follows_the_fleet() {
        let store = Arc::new(Scripted::default());
        store.renews.store(true, SeqCst);
        store.fences.store(true, SeqCst);
        let (breaker, half_open) = won(Arc::clone(&store) as Arc<dyn Store>).await;
        let link = breaker.core.store.as_ref().unwrap();
        assert!(link.token.lock().unwrap().is_some());
        assert!(
            !breaker
                .core
                .heartbeat(half_open, Duration::from_secs(3))
                .await
        );
        assert!(
            link.token.lock().unwrap().is_none(),
            "not its lease any more"
        );
        assert_ne!(
            breaker.snapshot().state,
            State::HalfOpen,
            "it stopped probing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_election_probes_locally_once_the_store_has_been_down_two_refreshes() {
        let store = Arc::new(Scripted::default());
        *store.election_delay.lock().unwrap() = Duration::from_secs(60);
        let refresh = 100 * MS;
        let breaker = one_call_with(Arc::clone(&store) as Arc<dyn Store>, |f| {
            f.refresh_interval(Duration::from_nanos(refresh))
        });
        open_and_wait(&breaker).await;
        assert!(breaker.try_acquire().is_err(), "electing");
        let (core, link) = (&breaker.core, breaker.core.store.as_ref().unwrap());
        let electing = Word(core.word.load(Acquire));
        assert_eq!(electing.state(), ELECTING);
        // The store failing since 1 s (stored plus one).
        let since = 1_000 * MS;
        link.down_since.store(since + 1, Relaxed);
        let short_of = since + 2 * refresh - 1;
        core.election_failed(electing, short_of);
        assert_eq!(breaker.snapshot().state, State::Open, "not long enough");
        assert_eq!(deadline_ms(&breaker), (short_of + refresh) / MS);
        core.word.store(electing.0, Release);
        core.election_failed(electing, since + 2 * refresh);
        assert_eq!(breaker.snapshot().state, State::HalfOpen, "two refreshes");
    }
}
