//! The controller at the scale of the reference appliance's specification: 4,096 scenarios
//! over 8 levels, 40,000 filters over 1,024 address lists of 64,000 entries in all.
//!
//! - `load`: checking the tree and compiling the filters (what a start or a reload costs);
//! - `classify`: one new session, matched or not;
//! - `turn`: one `next` + `sent`, with flows busy across the whole tree, and with 100,000
//!   flows in one scenario.

#![allow(clippy::unwrap_used)] // a benchmark: its own fixed inputs

use criterion::{BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;
use wsx_shaper::{
    AddressList, Classifier, FilterSpec, PortKind, PortRange, Rate, ScenarioSpec, SessionKey,
    Shaper, Tree,
};

const SCENARIOS: usize = 4096;
const FILTERS: usize = 40_000;
const LISTS: usize = 1024;
const ENTRIES: usize = 64_000;

/// 4,096 scenarios, three children per node, eight levels deep; every fourth has a small
/// minimum, every third a maximum, priorities vary.
fn scenarios() -> Vec<ScenarioSpec> {
    let mut specs: Vec<ScenarioSpec> = Vec::with_capacity(SCENARIOS);
    let mut level: Vec<Option<usize>> = vec![None];
    while specs.len() < SCENARIOS {
        let mut next = Vec::new();
        for &parent in &level {
            for _ in 0..3 {
                let i = specs.len();
                if i == SCENARIOS {
                    break;
                }
                specs.push(ScenarioSpec {
                    name: format!("s{i}"),
                    parent: parent.map(|p| format!("s{p}")),
                    min_rate: (i % 4 == 0).then(|| Rate::from_bits_per_second(10_000).unwrap()),
                    max_rate: (i % 3 == 0).then(|| Rate::mbit(50 + (i % 50) as u64)),
                    priority: (i % 8) as u8,
                    ..ScenarioSpec::default()
                });
                next.push(Some(i));
            }
        }
        level = next;
    }
    // Minimums of a node's children must fit its own: clear the parents' minimums.
    let parents: std::collections::HashSet<String> =
        specs.iter().filter_map(|s| s.parent.clone()).collect();
    for s in &mut specs {
        if parents.contains(&s.name) {
            s.min_rate = None;
        }
    }
    specs
}

fn leaves(tree: &Tree) -> Vec<String> {
    tree.scenarios()
        .filter(|s| tree.leaf(&s.name).is_ok())
        .map(|s| s.name.clone())
        .collect()
}

fn lists(rng: &mut fastrand::Rng) -> Vec<AddressList> {
    (0..LISTS)
        .map(|l| AddressList {
            name: format!("l{l}"),
            prefixes: (0..ENTRIES / LISTS)
                .map(|_| {
                    let ip = Ipv4Addr::from(rng.u32(..));
                    IpNet::new(IpAddr::V4(ip), 24).unwrap().trunc()
                })
                .collect(),
        })
        .collect()
}

fn filters(rng: &mut fastrand::Rng, leaves: &[String]) -> Vec<FilterSpec> {
    (0..FILTERS)
        .map(|i| {
            let scenario = leaves[i % leaves.len()].clone();
            match i % 4 {
                // Servers by address and port.
                0 | 1 => FilterSpec {
                    scenario,
                    destination: vec![
                        IpNet::new(IpAddr::V4(Ipv4Addr::from(rng.u32(..))), 32).unwrap(),
                    ],
                    destination_ports: vec![PortRange {
                        first: 445,
                        last: 445,
                    }],
                    ..FilterSpec::default()
                },
                // Branches by list.
                2 => FilterSpec {
                    scenario,
                    source_lists: vec![format!("l{}", rng.usize(..LISTS))],
                    dscp: vec![rng.u8(0..64)],
                    ..FilterSpec::default()
                },
                // Services by port range.
                _ => {
                    let first = rng.u16(1024..60000);
                    FilterSpec {
                        scenario,
                        destination_ports: vec![PortRange {
                            first,
                            last: first + 10,
                        }],
                        ..FilterSpec::default()
                    }
                }
            }
        })
        .collect()
}

#[allow(clippy::disallowed_methods)] // one real instant; virtual time from there
fn epoch() -> Instant {
    Instant::now()
}

fn bench(c: &mut Criterion) {
    let mut rng = fastrand::Rng::with_seed(17);
    let specs = scenarios();
    let tree = Tree::build(Rate::mbit(1000), specs.clone()).unwrap();
    let leaf_names = leaves(&tree);
    let lists = lists(&mut rng);
    let filters = filters(&mut rng, &leaf_names);

    let mut group = c.benchmark_group("load");
    group.sample_size(10);
    group.bench_function("4096-scenarios-40000-filters", |b| {
        b.iter(|| {
            let tree = Tree::build(Rate::mbit(1000), specs.clone()).unwrap();
            Classifier::build(&tree, &lists, &filters).unwrap()
        })
    });
    group.finish();

    let classifier = Classifier::build(&tree, &lists, &filters).unwrap();
    let sessions: Vec<(SocketAddr, SocketAddr)> = (0..4096)
        .map(|i| {
            let source = match i % 2 {
                0 => lists[rng.usize(..LISTS)].prefixes[0].addr(),
                _ => IpAddr::V4(Ipv4Addr::from(rng.u32(..))),
            };
            let destination = match i % 3 {
                0 => filters[rng.usize(..FILTERS / 4) * 4].destination[0].addr(),
                _ => IpAddr::V4(Ipv4Addr::from(rng.u32(..))),
            };
            (
                SocketAddr::new(source, rng.u16(1024..)),
                SocketAddr::new(destination, [445, 80, rng.u16(1024..)][i % 3]),
            )
        })
        .collect();
    let mut group = c.benchmark_group("classify");
    group.bench_function("40000-filters", |b| {
        let mut i = 0;
        b.iter(|| {
            let (source, destination) = sessions[i % sessions.len()];
            i += 1;
            classifier.classify(black_box(&SessionKey {
                source,
                destination,
                dscp: Some(0),
                interface: None,
                peer: None,
            }))
        })
    });
    group.finish();

    let mut group = c.benchmark_group("turn");
    for (name, flows, spread) in [
        ("4096-scenarios-10000-flows", 10_000, true),
        ("one-scenario-100000-flows", 100_000, false),
    ] {
        let now = epoch();
        let mut shaper = Shaper::new(tree.clone(), now);
        let port = shaper.add_port(PortKind::Driven);
        for i in 0..flows {
            let leaf = if spread {
                &leaf_names[i % leaf_names.len()]
            } else {
                &leaf_names[0]
            };
            let flow = shaper.open(tree.leaf(leaf).unwrap(), port);
            shaper.push(flow, now);
        }
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            let mut t = now;
            // One turn as a driver takes it: when may the next leave, which flow, report.
            b.iter(|| {
                t = shaper.poll_timeout(t, port).unwrap_or(t);
                let grant = shaper
                    .next(t, port)
                    .expect("a turn when the shaper said so");
                shaper.sent(grant.flow, grant.max_bytes, true, t);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
