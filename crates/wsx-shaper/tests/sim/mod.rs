//! A deterministic simulation of a shaper in virtual time: sources that are greedy, limited
//! by their application to a rate, or that stop; a port that asks for turns whenever the
//! shaper says one may be due, woken up late by a seeded random 0 to `lateness`; and an exact
//! log of every byte sent.

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};
use wsx_shaper::{FlowId, PortId, PortKind, Rate, ScenarioId, ScenarioSpec, Shaper, Tree};

pub const SECOND: u64 = 1_000_000_000;
pub const MS: u64 = 1_000_000;

/// What a source's application offers.
#[derive(Debug, Clone, Copy)]
pub enum Demand {
    /// Always something to send.
    Greedy,
    /// `bytes` every `every` ns (an application-limited flow, or a request/response probe).
    Periodic { bytes: u64, every: u64 },
}

#[derive(Debug)]
pub struct Source {
    pub flow: FlowId,
    pub scenario: ScenarioId,
    demand: Demand,
    start: u64,
    stop: u64,
    /// Bytes offered and not yet sent (periodic sources).
    pending: u64,
    next_arrival: u64,
    /// Arrival times of the periodic writes not yet fully sent, with their end offsets.
    writes: std::collections::VecDeque<(u64, u64)>,
    offered: u64,
    sent: u64,
    /// For periodic sources: how long each write waited until its last byte left.
    pub delays: Vec<u64>,
}

impl Source {
    /// Bytes sent.
    pub fn sent(&self) -> u64 {
        self.sent
    }
}

/// One turn, as sent.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub at: u64,
    pub source: usize,
    pub bytes: u64,
}

#[derive(Debug)]
pub struct Sim {
    pub shaper: Shaper,
    epoch: Instant,
    pub now: u64,
    port: PortId,
    rng: fastrand::Rng,
    lateness: u64,
    pub sources: Vec<Source>,
    pub log: Vec<Record>,
    by_flow: std::collections::HashMap<FlowId, usize>,
}

impl Sim {
    /// A shaper over `scenarios` under `wan`, served by one pumped port woken up late by up
    /// to `lateness` ns.
    pub fn new(wan: Rate, scenarios: Vec<ScenarioSpec>, lateness: u64, seed: u64) -> Self {
        let tree = Tree::build(wan, scenarios).expect("a valid tree");
        Self::with_tree(tree, lateness, seed)
    }

    pub fn with_tree(tree: Tree, lateness: u64, seed: u64) -> Self {
        let epoch = epoch();
        let mut shaper = Shaper::new(tree, epoch);
        let port = shaper.add_port(PortKind::Pumped);
        Self {
            shaper,
            epoch,
            now: 0,
            port,
            rng: fastrand::Rng::with_seed(seed),
            lateness,
            sources: Vec::new(),
            log: Vec::new(),
            by_flow: std::collections::HashMap::new(),
        }
    }

    pub fn leaf(&self, name: &str) -> ScenarioId {
        self.shaper.tree().leaf(name).expect("a leaf scenario")
    }

    /// A source in leaf `name`, offering from `start` until `stop` (ns).
    pub fn source(&mut self, name: &str, demand: Demand, start: u64, stop: u64) -> usize {
        let scenario = self.leaf(name);
        let flow = self.shaper.open(scenario, self.port);
        self.by_flow.insert(flow, self.sources.len());
        self.sources.push(Source {
            flow,
            scenario,
            demand,
            start,
            stop,
            pending: 0,
            next_arrival: start,
            writes: Default::default(),
            offered: 0,
            sent: 0,
            delays: Vec::new(),
        });
        self.sources.len() - 1
    }

    fn at(&self, t: u64) -> Instant {
        self.epoch + Duration::from_nanos(t)
    }

    /// Runs until `end` (ns).
    pub fn run(&mut self, end: u64) {
        while self.now < end {
            self.arrivals();
            self.serve();
            let wake = self
                .shaper
                .poll_timeout(self.at(self.now), self.port)
                .map(|t| t.duration_since(self.epoch).as_nanos() as u64)
                .map(|t| t.max(self.now + 1) + self.rng.u64(0..=self.lateness));
            let event = self.next_event();
            self.now = wake.unwrap_or(u64::MAX).min(event).min(end);
        }
    }

    /// Sources starting, stopping and writing at `now`.
    fn arrivals(&mut self) {
        let now = self.now;
        let at = self.at(now);
        for s in &mut self.sources {
            if now >= s.stop {
                if s.next_arrival != u64::MAX {
                    s.next_arrival = u64::MAX;
                    self.shaper.remove(s.flow);
                }
                continue;
            }
            if now < s.next_arrival {
                continue;
            }
            match s.demand {
                Demand::Greedy => {
                    s.next_arrival = s.stop;
                    self.shaper.push(s.flow, at);
                }
                Demand::Periodic { bytes, every } => {
                    s.pending += bytes;
                    s.offered += bytes;
                    s.writes.push_back((now, s.offered));
                    s.next_arrival += every;
                    self.shaper.push(s.flow, at);
                }
            }
        }
    }

    fn next_event(&self) -> u64 {
        self.sources
            .iter()
            .map(|s| {
                s.next_arrival.min(if s.next_arrival == u64::MAX {
                    u64::MAX
                } else {
                    s.stop
                })
            })
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Every turn the shaper allows at `now`.
    fn serve(&mut self) {
        let at = self.at(self.now);
        while let Some(grant) = self.shaper.next(at, self.port) {
            let i = self.by_flow[&grant.flow];
            let s = &mut self.sources[i];
            let (bytes, more) = match s.demand {
                Demand::Greedy => (grant.max_bytes as u64, true),
                Demand::Periodic { .. } => {
                    let n = s.pending.min(grant.max_bytes as u64);
                    s.pending -= n;
                    (n, s.pending > 0)
                }
            };
            s.sent += bytes;
            while let Some(&(arrived, end)) = s.writes.front() {
                if s.sent < end {
                    break;
                }
                s.delays.push(self.now - arrived);
                s.writes.pop_front();
            }
            self.shaper.sent(grant.flow, bytes as usize, more, at);
            self.log.push(Record {
                at: self.now,
                source: i,
                bytes,
            });
        }
    }

    /// Bytes sent by the sources `which` in [from, to).
    pub fn bytes(&self, which: &[usize], from: u64, to: u64) -> u64 {
        self.log
            .iter()
            .filter(|r| r.at >= from && r.at < to && which.contains(&r.source))
            .map(|r| r.bytes)
            .sum()
    }

    /// Bits per second of `which` over [from, to).
    pub fn rate(&self, which: &[usize], from: u64, to: u64) -> f64 {
        self.bytes(which, from, to) as f64 * 8.0 * SECOND as f64 / (to - from) as f64
    }

    /// The most bytes `which` sent in any window of `window` ns starting at a send.
    pub fn peak(&self, which: &[usize], window: u64, from: u64) -> u64 {
        let sends: Vec<&Record> = self
            .log
            .iter()
            .filter(|r| r.at >= from && which.contains(&r.source))
            .collect();
        let mut best = 0;
        let mut sum = 0;
        let mut tail = 0;
        for head in 0..sends.len() {
            sum += sends[head].bytes;
            while sends[head].at - sends[tail].at >= window {
                sum -= sends[tail].bytes;
                tail += 1;
            }
            best = best.max(sum);
        }
        best
    }

    pub fn all(&self) -> Vec<usize> {
        (0..self.sources.len()).collect()
    }
}

/// One real instant to count virtual time from; the simulation never reads the clock again.
#[allow(clippy::disallowed_methods)]
fn epoch() -> Instant {
    Instant::now()
}

/// Jain's fairness index of `xs`.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    sum * sum / (xs.len() as f64 * squares)
}

/// A scenario under `parent` (or the root).
pub fn scenario(name: &str, parent: Option<&str>) -> ScenarioSpec {
    ScenarioSpec {
        name: name.into(),
        parent: parent.map(Into::into),
        ..ScenarioSpec::default()
    }
}
