//! The shaper's behaviour in virtual time, with late wake-ups and exact byte logs: the
//! cases of the bandwidth controller's benchmark, run on the core alone.

mod sim;

use sim::{Demand, MS, SECOND, Sim, jain, scenario};
use wsx_shaper::{GRANT, Rate, ScenarioSpec};

const END: u64 = u64::MAX;

fn capped(name: &str, max: Rate) -> ScenarioSpec {
    ScenarioSpec {
        max_rate: Some(max),
        ..scenario(name, None)
    }
}

/// One scenario at its maximum with four greedy flows: within 0.5 % in every 1 s window
/// from 2 s on and 0.1 % over the run, though every wake-up is up to 2 ms late.
#[test]
fn a_maximum_holds_in_every_second_despite_late_wake_ups() {
    for mbit in [1, 20, 200] {
        let max = Rate::mbit(mbit);
        let mut sim = Sim::new(Rate::mbit(1000), vec![capped("bulk", max)], 2 * MS, mbit);
        for _ in 0..4 {
            sim.source("bulk", Demand::Greedy, 0, END);
        }
        let seconds = 10;
        sim.run(seconds * SECOND);
        let all = sim.all();
        let target = max.bits_per_second() as f64;
        for s in 2..seconds {
            let rate = sim.rate(&all, s * SECOND, (s + 1) * SECOND);
            let error = (rate - target).abs() / target;
            assert!(
                error < 0.005,
                "{mbit} Mbit/s, second {s}: {rate} ({error:.4})"
            );
        }
        let rate = sim.rate(&all, 0, seconds * SECOND);
        let error = (rate - target).abs() / target;
        assert!(
            error < 0.001,
            "{mbit} Mbit/s over the run: {rate} ({error:.5})"
        );
    }
}

/// Woken on time, no millisecond carries more than the rate's millisecond and two packets.
#[test]
fn sends_are_smooth_to_the_millisecond() {
    for mbit in [1, 20, 200] {
        let max = Rate::mbit(mbit);
        let mut sim = Sim::new(Rate::mbit(1000), vec![capped("bulk", max)], 0, 1);
        for _ in 0..4 {
            sim.source("bulk", Demand::Greedy, 0, END);
        }
        sim.run(2 * SECOND);
        let peak = sim.peak(&sim.all(), MS, 0);
        let bound = max.bytes_per_second() / 1000 + 2 * 1448;
        assert!(
            peak <= bound,
            "{mbit} Mbit/s: {peak} bytes in 1 ms, bound {bound}"
        );
    }
}

/// A (min 30, priority 4), B (min 60, priority 4) and C (priority 0) on 100 Mbit/s: the
/// minimums hold, C takes the rest; when B stops its share goes to the others at once.
#[test]
fn minimums_first_then_the_excess_by_priority() {
    let with = |name: &str, min: Option<u64>, priority| ScenarioSpec {
        min_rate: min.map(Rate::mbit),
        priority,
        ..scenario(name, None)
    };
    let scenarios = vec![
        with("a", Some(30), 4),
        with("b", Some(60), 4),
        with("c", None, 0),
    ];
    let mut sim = Sim::new(Rate::mbit(100), scenarios, 2 * MS, 7);
    let a = sim.source("a", Demand::Greedy, 0, END);
    // (A has no maximum: it is never held at one.)
    let b = sim.source("b", Demand::Greedy, 0, 5 * SECOND);
    let c = sim.source("c", Demand::Greedy, 0, END);
    sim.run(10 * SECOND);
    let mbit = |which: &[usize], from: u64, to: u64| sim.rate(which, from, to) / 1e6;
    for s in 1..5 {
        let (from, to) = (s * SECOND, (s + 1) * SECOND);
        assert!(
            mbit(&[a], from, to) >= 30.0 * 0.99,
            "a: {}",
            mbit(&[a], from, to)
        );
        assert!(
            mbit(&[b], from, to) >= 60.0 * 0.99,
            "b: {}",
            mbit(&[b], from, to)
        );
        let c_rate = mbit(&[c], from, to);
        assert!((c_rate - 10.0).abs() < 0.5, "c: {c_rate}");
        let root = mbit(&[a, b, c], from, to);
        assert!(root >= 99.0, "the root is used: {root}");
    }
    // B stops at 5 s: within 100 ms its 60 Mbit/s go to C (priority 0), A keeps its 30.
    let (from, to) = (5 * SECOND + 100 * MS, 6 * SECOND);
    assert!(
        (mbit(&[c], from, to) - 70.0).abs() < 0.7,
        "c: {}",
        mbit(&[c], from, to)
    );
    assert!(
        (mbit(&[a], from, to) - 30.0).abs() < 0.3,
        "a: {}",
        mbit(&[a], from, to)
    );
    let root = mbit(&[a, c], 5 * SECOND, 5 * SECOND + 100 * MS);
    assert!(root >= 99.0, "the root stays used while B leaves: {root}");
}

/// A 1 KB request every 10 ms at priority 0 under greedy load at priority 7 waits at most a
/// turn or two of the root's rate.
#[test]
fn a_high_priority_probe_passes_greedy_load() {
    let with = |name: &str, priority| ScenarioSpec {
        priority,
        ..scenario(name, None)
    };
    let mut sim = Sim::new(
        Rate::mbit(100),
        vec![with("probe", 0), with("bulk", 7)],
        0,
        3,
    );
    for _ in 0..4 {
        sim.source("bulk", Demand::Greedy, 0, END);
    }
    let probe = sim.source(
        "probe",
        Demand::Periodic {
            bytes: 1024,
            every: 10 * MS,
        },
        5 * MS,
        END,
    );
    sim.run(10 * SECOND);
    let mut delays = sim.sources[probe].delays.clone();
    delays.sort_unstable();
    let p99 = delays[delays.len() * 99 / 100];
    // One grant ahead of it at 100 Mbit/s is 232 µs.
    let turn = GRANT as u64 * 8 * SECOND / 100_000_000;
    assert!(delays.len() > 990, "{} probes", delays.len());
    assert!(p99 <= turn, "p99 {p99} ns, a turn is {turn} ns");
}

/// Ten greedy flows and one limited by its application to 1 Mbit/s in one scenario: the
/// greedy ones share equally in every second, the limited one keeps its rate.
#[test]
fn flows_of_a_scenario_share_equally() {
    let mut sim = Sim::new(Rate::mbit(100), vec![scenario("office", None)], 2 * MS, 11);
    let greedy: Vec<usize> = (0..10)
        .map(|_| sim.source("office", Demand::Greedy, 0, END))
        .collect();
    // 1 Mbit/s: 1,000 bytes every 8 ms.
    let limited = sim.source(
        "office",
        Demand::Periodic {
            bytes: 1000,
            every: 8 * MS,
        },
        0,
        END,
    );
    sim.run(10 * SECOND);
    let rates = |from: u64, to: u64| -> Vec<f64> {
        greedy.iter().map(|&g| sim.rate(&[g], from, to)).collect()
    };
    assert!(jain(&rates(0, 10 * SECOND)) >= 0.99);
    for s in 0..10 {
        let index = jain(&rates(s * SECOND, (s + 1) * SECOND));
        assert!(index >= 0.98, "second {s}: {index}");
    }
    let kept = sim.rate(&[limited], SECOND, 10 * SECOND);
    assert!((kept - 1e6).abs() < 1e4, "the limited flow: {kept}");
    // And the greedy ones take all the rest.
    let total = sim.rate(&sim.all(), SECOND, 10 * SECOND);
    assert!(total >= 99e6, "{total}");
}

/// A hundred thousand greedy flows in one scenario at 10 Gbit/s (the appliance's scale):
/// over two seconds every flow gets the same bytes give or take two turns, and the scenario
/// stays at its rate in each half second.
#[test]
fn a_hundred_thousand_flows_stay_fair_and_bounded() {
    let mut top = scenario("all", None);
    top.max_rate = Some(Rate::MAX);
    let mut sim = Sim::new(Rate::MAX, vec![top], 2 * MS, 17);
    let flows: Vec<usize> = (0..100_000)
        .map(|_| sim.source("all", Demand::Greedy, 0, END))
        .collect();
    sim.run(2 * SECOND);
    let sent: Vec<u64> = flows.iter().map(|&f| sim.sources[f].sent()).collect();
    let mean = sent.iter().sum::<u64>() as f64 / sent.len() as f64;
    let (least, most) = (
        *sent.iter().min().unwrap_or(&0),
        *sent.iter().max().unwrap_or(&0),
    );
    assert!(
        most - least <= 2 * GRANT as u64,
        "least {least}, most {most}, mean {mean:.0}"
    );
    let target = Rate::MAX.bits_per_second() as f64;
    for half in 0..4u64 {
        let rate = sim.rate(&flows, half * SECOND / 2, (half + 1) * SECOND / 2);
        let error = (rate - target).abs() / target;
        assert!(error < 0.005, "half-second {half}: {rate} ({error:.4})");
    }
}

/// Scenarios nested eight deep: maximums at every level hold for the whole subtree, and
/// equal priorities share the excess equally at each level.
#[test]
fn maximums_hold_at_every_level_of_a_deep_tree() {
    let mut scenarios = Vec::new();
    let mut parent: Option<String> = None;
    for level in 0..8u64 {
        let name = format!("l{level}");
        scenarios.push(ScenarioSpec {
            max_rate: Some(Rate::mbit(80 - 5 * level)),
            ..scenario(&name, parent.as_deref())
        });
        // A sibling at each level below the top, uncapped, sharing its parent equally.
        if let Some(p) = &parent {
            scenarios.push(scenario(&format!("s{level}"), Some(p)));
        }
        parent = Some(name);
    }
    let mut sim = Sim::new(Rate::mbit(100), scenarios, MS, 5);
    let deepest = sim.source("l7", Demand::Greedy, 0, END);
    let siblings: Vec<usize> = (1..8)
        .map(|l| sim.source(&format!("s{l}"), Demand::Greedy, 0, END))
        .collect();
    sim.run(5 * SECOND);
    let mbit = |which: &[usize]| sim.rate(which, SECOND, 5 * SECOND) / 1e6;
    // l0 holds everything at 80 Mbit/s; at each level the sibling and the deeper chain
    // share their parent's rate equally: s1 gets 40, s2 20 ... (each below its caps).
    let total = mbit(&sim.all());
    assert!((total - 80.0).abs() < 0.1, "{total}");
    let expected = [40.0, 20.0, 10.0, 5.0, 2.5, 1.25, 0.625];
    for (i, &s) in siblings.iter().enumerate() {
        let got = mbit(&[s]);
        assert!(
            (got - expected[i]).abs() < expected[i] * 0.01,
            "s{}: {got}",
            i + 1
        );
    }
    let got = mbit(&[deepest]);
    assert!((got - 0.625).abs() < 0.01, "l7: {got}");
}
