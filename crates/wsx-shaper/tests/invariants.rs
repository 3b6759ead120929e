//! Properties that hold for any tree, any mix of sources and any wake-up lateness: no
//! scenario above its maximum over any window, every minimum met while its scenario is
//! busy, flows of a scenario served equally, every byte counted once.

mod sim;

use proptest::prelude::*;
use sim::{Demand, MS, SECOND, Sim};
use wsx_shaper::{CATCH_UP, GRANT, Rate, ScenarioSpec, Tree};

const RUN: u64 = 3 * SECOND;

#[derive(Debug, Clone)]
struct Case {
    scenarios: Vec<ScenarioSpec>,
    /// Parent index of each scenario (None: the root).
    parents: Vec<Option<usize>>,
    /// (scenario, demand, start, stop) per source.
    sources: Vec<(usize, Demand, u64, u64)>,
    lateness: u64,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let scenario = (
        any::<prop::sample::Index>(),
        prop::option::weighted(0.4, 1u64..=30),
        prop::option::weighted(0.5, 5u64..=80),
        0u8..8,
    );
    (
        prop::collection::vec(scenario, 1..7),
        prop::collection::vec(
            (
                any::<prop::sample::Index>(),
                prop::option::weighted(0.3, (100u64..5000, 1u64..50)),
                0u64..2000,
                prop::option::weighted(0.5, 300u64..3000),
            ),
            1..9,
        ),
        0u64..=2,
        any::<u64>(),
    )
        .prop_map(|(specs, sources, lateness, seed)| {
            let mut scenarios = Vec::new();
            let mut parents = Vec::new();
            for (i, (parent, min, max, priority)) in specs.into_iter().enumerate() {
                // A parent among the earlier scenarios, or the root; at most 3 levels.
                let parent = (i > 0 && parent.index(3) > 0).then(|| parent.index(i));
                let parent = parent.filter(|&p| depth(&parents, p) < 3);
                scenarios.push(ScenarioSpec {
                    name: format!("s{i}"),
                    parent: parent.map(|p| format!("s{p}")),
                    min_rate: min.map(Rate::mbit),
                    max_rate: max.map(|m| Rate::mbit(m.max(min.unwrap_or(0)))),
                    priority,
                    ..ScenarioSpec::default()
                });
                parents.push(parent);
            }
            let leaves: Vec<usize> = (0..scenarios.len())
                .filter(|&i| !parents.contains(&Some(i)))
                .collect();
            let sources = sources
                .into_iter()
                .map(|(leaf, periodic, start, length)| {
                    let demand = match periodic {
                        None => Demand::Greedy,
                        Some((bytes, every)) => Demand::Periodic {
                            bytes,
                            every: every * MS,
                        },
                    };
                    let start = start * MS;
                    let stop = length.map_or(u64::MAX, |l| start + l * MS);
                    (leaves[leaf.index(leaves.len())], demand, start, stop)
                })
                .collect();
            Case {
                scenarios,
                parents,
                sources,
                lateness: lateness * MS,
                seed,
            }
        })
}

fn depth(parents: &[Option<usize>], mut i: usize) -> usize {
    let mut d = 1;
    while let Some(p) = parents[i] {
        d += 1;
        i = p;
    }
    d
}

/// The sources whose leaf is `scenario` or below it.
fn subtree(case: &Case, scenario: usize) -> Vec<usize> {
    let under = |mut i: usize| loop {
        if i == scenario {
            return true;
        }
        match case.parents[i] {
            Some(p) => i = p,
            None => return false,
        }
    };
    (0..case.sources.len())
        .filter(|&s| under(case.sources[s].0))
        .collect()
}

/// The leaves at or below `scenario`.
fn leaves_under(case: &Case, scenario: usize) -> Vec<usize> {
    let children: Vec<usize> = (0..case.scenarios.len())
        .filter(|&c| case.parents[c] == Some(scenario))
        .collect();
    if children.is_empty() {
        return vec![scenario];
    }
    children
        .into_iter()
        .flat_map(|c| leaves_under(case, c))
        .collect()
}

/// The most `scenario`'s subtree may send: its maximum, and its children's added up.
fn capacity(case: &Case, scenario: usize) -> Rate {
    let children: Vec<usize> = (0..case.scenarios.len())
        .filter(|&c| case.parents[c] == Some(scenario))
        .collect();
    let own = case.scenarios[scenario].max_rate.unwrap_or(Rate::MAX);
    if children.is_empty() {
        return own;
    }
    let below: u64 = children
        .iter()
        .map(|&c| capacity(case, c).bits_per_second())
        .sum();
    own.min(Rate::from_bits_per_second(below.min(Rate::MAX.bits_per_second())).unwrap_or(Rate::MAX))
}

fn run(case: &Case) -> Option<Sim> {
    let tree = Tree::build(Rate::mbit(100), case.scenarios.clone()).ok()?;
    let mut sim = Sim::with_tree(tree, case.lateness, case.seed);
    for &(scenario, demand, start, stop) in &case.sources {
        sim.source(&format!("s{scenario}"), demand, start, stop);
    }
    sim.run(RUN);
    Some(sim)
}

/// The most bytes `which` sent in any window of `window` ns.
fn most_in_window(sim: &Sim, which: &[usize], window: u64) -> u64 {
    sim.peak(which, window, 0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn never_above_a_maximum_over_any_window(case in case()) {
        let Some(sim) = run(&case) else { return Ok(()) };
        let mut capped: Vec<(Vec<usize>, Rate)> = case
            .scenarios
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.max_rate.map(|m| (subtree(&case, i), m)))
            .collect();
        capped.push((sim.all(), Rate::mbit(100)));
        for (which, max) in capped {
            let per_ns = max.bytes_per_second() as f64 / SECOND as f64;
            for window in [MS, 10 * MS, 100 * MS, SECOND] {
                let most = most_in_window(&sim, &which, window);
                let bound = per_ns * (window + CATCH_UP.as_nanos() as u64) as f64 + GRANT as f64;
                prop_assert!(most as f64 <= bound, "{most} > {bound} in {window} ns at {max}");
            }
        }
    }

    #[test]
    fn minimums_are_met_while_busy(case in case()) {
        let Some(sim) = run(&case) else { return Ok(()) };
        for (i, spec) in case.scenarios.iter().enumerate() {
            let Some(min) = spec.min_rate else { continue };
            let which = subtree(&case, i);
            // What the subtree can take at most: its maximums, added up over children.
            let min = min.min(capacity(&case, i));
            // Windows in which a greedy source ran throughout in every leaf below.
            let window = 200 * MS;
            let mut from = 0;
            while from + window <= RUN {
                let running = |s: usize| {
                    let (_, demand, start, stop) = case.sources[s];
                    matches!(demand, Demand::Greedy) && start <= from && stop >= from + window
                };
                let busy = leaves_under(&case, i)
                    .iter()
                    .all(|&leaf| which.iter().any(|&s| case.sources[s].0 == leaf && running(s)));
                if busy {
                    let got = sim.bytes(&which, from, from + window);
                    let owed = min.bytes_per_second() * window / SECOND;
                    let slack = min.bytes_per_second() * 5 * MS / SECOND + 4 * GRANT as u64;
                    prop_assert!(got + slack >= owed, "s{i}: {got} of {owed} in [{from}, +{window})");
                }
                from += window / 2;
            }
        }
    }

    #[test]
    fn greedy_flows_of_a_scenario_share_equally(case in case()) {
        let Some(sim) = run(&case) else { return Ok(()) };
        for leaf in 0..case.scenarios.len() {
            let flows: Vec<usize> = (0..case.sources.len())
                .filter(|&s| case.sources[s].0 == leaf)
                .collect();
            // Only leaves whose sources are all greedy and all running through the window.
            let (from, to) = (2 * SECOND, RUN);
            let steady = flows.len() >= 2 && flows.iter().all(|&s| {
                let (_, demand, start, stop) = case.sources[s];
                matches!(demand, Demand::Greedy) && start <= from && stop >= to
            });
            if !steady {
                continue;
            }
            let bytes: Vec<u64> = flows.iter().map(|&s| sim.bytes(&[s], from, to)).collect();
            let (least, most) = (bytes.iter().min().unwrap(), bytes.iter().max().unwrap());
            prop_assert!(most - least <= 2 * GRANT as u64, "s{leaf}: {bytes:?}");
        }
    }

    #[test]
    fn every_byte_is_counted_once(case in case()) {
        let Some(sim) = run(&case) else { return Ok(()) };
        // Each scenario's count is its subtree's log, and the sum of its children's.
        for i in 0..case.scenarios.len() {
            let logged = sim.bytes(&subtree(&case, i), 0, u64::MAX);
            let counted = sim.shaper.stats(i).unwrap().bytes;
            prop_assert_eq!(counted, logged, "s{}", i);
            let children: u64 = (0..case.scenarios.len())
                .filter(|&c| case.parents[c] == Some(i))
                .map(|c| sim.shaper.stats(c).unwrap().bytes)
                .sum();
            let leaf = !case.parents.contains(&Some(i));
            prop_assert!(leaf || children == counted, "s{i}: {counted} against {children}");
        }
        let sent: u64 = sim.sources.iter().map(|s| s.sent()).sum();
        prop_assert_eq!(sim.shaper.total().bytes, sent);
        // And nothing is left counted as busy once every source has stopped.
        prop_assert!(sim.shaper.total().flows == case.sources.len() as u64);
    }
}
