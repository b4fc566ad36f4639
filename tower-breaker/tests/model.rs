//! Model-based property test: random sequences of outcomes, durations and
//! clock advances drive the breaker and a simple reference model; their
//! states, window counts and admissions agree at every step.

mod support;

use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;
use support::*;
use tower_breaker::{Breaker, Outcome, State};

const OPEN_MS: u64 = 1000;
const MAX_OPEN_MS: u64 = 8000;
const WAIT_MS: u64 = 3000;
const SLOW_MS: u64 = 50;

#[derive(Debug, Clone)]
enum Op {
    Call(Outcome, u64),
    Advance(u64),
}

#[derive(Debug, Clone)]
struct Params {
    window: usize,
    minimum: u32,
    failure_ppm: u64,
    slow_ppm: u64,
    successes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ModelState {
    Closed,
    Open { until: u64 },
    HalfOpen { deadline: u64, successes: u32 },
}

/// The reference: plain data, one step at a time.
#[derive(Debug)]
struct Model {
    p: Params,
    now: u64,
    state: ModelState,
    window: VecDeque<u8>, // 0 ok, 1 failure, 2 slow
    streak: u32,
}

impl Model {
    fn period(&self, streak: u32) -> u64 {
        (OPEN_MS << streak.min(20)).min(MAX_OPEN_MS)
    }

    fn open(&mut self, streak: u32) {
        self.streak = streak;
        self.state = ModelState::Open {
            until: self.now + self.period(streak),
        };
    }

    /// Returns whether the call was admitted.
    fn call(&mut self, outcome: Outcome, elapsed: u64) -> bool {
        let probe = loop {
            match self.state {
                ModelState::Closed => break false,
                ModelState::Open { until } if self.now < until => return false,
                ModelState::Open { .. } => {
                    self.state = ModelState::HalfOpen {
                        deadline: self.now + WAIT_MS,
                        successes: 0,
                    }
                }
                ModelState::HalfOpen { deadline, .. } if self.now >= deadline => {
                    self.open(self.streak + 1)
                }
                ModelState::HalfOpen { .. } => break true,
            }
        };
        let code = match outcome {
            Outcome::Ignored => return true,
            Outcome::Failure => 1,
            Outcome::Success if elapsed >= SLOW_MS => 2,
            Outcome::Success => 0,
        };
        if probe {
            let ModelState::HalfOpen {
                deadline,
                successes,
            } = self.state
            else {
                unreachable!()
            };
            if code == 0 {
                if successes + 1 >= self.p.successes {
                    self.state = ModelState::Closed;
                    self.window.clear();
                    self.streak = 0;
                } else {
                    self.state = ModelState::HalfOpen {
                        deadline,
                        successes: successes + 1,
                    };
                }
            } else {
                self.open(self.streak + 1);
            }
            return true;
        }
        self.window.push_back(code);
        if self.window.len() > self.p.window {
            self.window.pop_front();
        }
        if code != 0 {
            let (calls, failures, slow) = self.counts();
            let minimum = (self.p.minimum as u64).min(self.p.window as u64);
            if calls >= minimum
                && (failures * 1_000_000 >= self.p.failure_ppm * calls
                    || slow * 1_000_000 >= self.p.slow_ppm * calls)
            {
                self.open(0);
            }
        }
        true
    }

    fn counts(&self) -> (u64, u64, u64) {
        let f = self.window.iter().filter(|&&c| c == 1).count() as u64;
        let s = self.window.iter().filter(|&&c| c == 2).count() as u64;
        (self.window.len() as u64, f, s)
    }

    fn public_state(&self) -> State {
        match self.state {
            ModelState::Closed => State::Closed,
            ModelState::Open { .. } => State::Open,
            ModelState::HalfOpen { .. } => State::HalfOpen,
        }
    }
}

fn params() -> impl Strategy<Value = Params> {
    (1usize..8, 1u32..10, 1u64..=4, 1u64..=4, 1u32..=3).prop_map(
        |(window, minimum, f, s, successes)| Params {
            window,
            minimum,
            failure_ppm: f * 250_000,
            slow_ppm: s * 250_000,
            successes,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop_oneof![
            3 => Just(Outcome::Success),
            3 => Just(Outcome::Failure),
            1 => Just(Outcome::Ignored),
        ], prop_oneof![3 => Just(1u64), 1 => 40u64..80]).prop_map(|(o, e)| Op::Call(o, e)),
        1 => prop_oneof![Just(1u64), 1u64..1000, 999u64..=1001, 2999u64..=3001, Just(8000u64)]
            .prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn breaker_agrees_with_the_reference_model(
        p in params(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let breaker = Breaker::with_config(
                "model",
                config()
                    .count_window(p.window)
                    .minimum_calls(p.minimum)
                    .failure_rate(p.failure_ppm as f64 / 1e6)
                    .slow_calls(Duration::from_millis(SLOW_MS), p.slow_ppm as f64 / 1e6)
                    .open_period(Duration::from_millis(OPEN_MS))
                    .max_open_period(Duration::from_millis(MAX_OPEN_MS))
                    .max_half_open_wait(Duration::from_millis(WAIT_MS))
                    .successes_to_close(p.successes),
            );
            let mut model = Model {
                p: p.clone(),
                now: 0,
                state: ModelState::Closed,
                window: VecDeque::new(),
                streak: 0,
            };
            for (step, op) in ops.iter().enumerate() {
                match *op {
                    Op::Advance(ms) => {
                        tokio::time::advance(Duration::from_millis(ms)).await;
                        model.now += ms;
                    }
                    Op::Call(outcome, elapsed) => {
                        let admitted = match breaker.try_acquire() {
                            Ok(permit) => {
                                permit.record_with_elapsed(outcome, Duration::from_millis(elapsed));
                                true
                            }
                            Err(_) => false,
                        };
                        let expected = model.call(outcome, elapsed);
                        prop_assert_eq!(admitted, expected, "admission at step {}: {:?}", step, op);
                    }
                }
                let s = breaker.snapshot();
                prop_assert_eq!(s.state, model.public_state(), "state at step {}: {:?}", step, model);
                let (calls, failures, slow) = model.counts();
                prop_assert_eq!(
                    (s.window.calls, s.window.failures, s.window.slow),
                    (calls, failures, slow),
                    "window at step {}", step
                );
            }
            Ok(())
        })?;
    }
}
