//! The simulation in the workspace's test run: a few seeds (unoptimised,
//! so few: `scripts/sim` runs a thousand, CI three hundred), a replay, and
//! two stacks built wrong on purpose that the checks must catch.

use std::time::Duration;

use resilience_sim::scenario::{Phase, Sabotage, Scenario};
use resilience_sim::{run, run_scenario};

#[test]
fn the_first_seeds_keep_every_promise() {
    for seed in 0..4 {
        let report = run(seed);
        println!("{report}");
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.calls, Scenario::from_seed(seed).calls);
    }
}

/// Seed 22 is all HTTP.
#[test]
fn a_seed_replays_exactly() {
    assert_eq!(Scenario::from_seed(22).grpc_share, 0.0);
    let (a, b) = (run(22), run(22));
    assert_eq!(a.to_string(), b.to_string());
    assert!(a.attempts > 0);
}

/// Seeds 68 and 298 are all gRPC, and the server's circuit opens in both:
/// with its jitter drawn from the process's random source, each ended in
/// one of two ways (about one run in three for 68, one in two for 298).
#[test]
fn a_grpc_seed_replays_exactly() {
    for seed in [68, 298] {
        assert_eq!(Scenario::from_seed(seed).grpc_share, 1.0);
        let first = run(seed).to_string();
        for _ in 0..2 {
            assert_eq!(run(seed).to_string(), first, "seed {seed}");
        }
    }
}

#[test]
fn a_stack_whose_deadline_is_late_is_caught() {
    // A dependency that stalls its bodies from the first second on: every
    // call it answers runs into the deadline until the circuit opens.
    let mut scenario = Scenario::from_seed(5);
    scenario.phases = vec![
        (Duration::ZERO, Phase::Healthy),
        (Duration::from_secs(1), Phase::Stalling),
    ];
    let honest = run_scenario(scenario.clone());
    assert!(honest.violations.is_empty(), "{honest}");
    assert!(honest.deadline_exceeded > 0, "{honest}");
    scenario.sabotage = Some(Sabotage::LateDeadline);
    let report = run_scenario(scenario);
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.0.contains("past its deadline")),
        "{report}"
    );
}

#[test]
fn a_breaker_that_lets_out_an_extra_probe_is_caught() {
    // Calls close together and a dependency that fails for long: the
    // circuit goes half-open with callers waiting, and each of them tries
    // to be a probe.
    let caught = (0..40).map(Scenario::from_seed).any(|mut scenario| {
        scenario.sabotage = Some(Sabotage::ExtraProbe);
        run_scenario(scenario)
            .violations
            .iter()
            .any(|v| v.0.contains("probes in flight at once"))
    });
    assert!(caught, "no seed of 40 noticed an extra probe");
}
