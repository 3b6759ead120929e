//! The gateway's bandwidth controller: the [`wsx_shaper`] core, driven from two places.
//!
//! ```text
//!  new session ─> classify (filters) ─> scenario + mode
//!     accelerate ─> tunnel stream ── flow on the tunnel's port ─┐
//!     aggregate/fixed ─> direct relay ─ flow on the direct port ─┤   one Shaper
//!     discard ─> reset, counted                                  │   (Mutex)
//!  tunnel transmit ─> TunnelScheduler::next ─> Shaper::next(port)┤─ grant for a stream: sent now
//!                                                                │─ grant for a relay: handed on
//!  pump task (timerfd) at Shaper::poll_timeout ─> Shaper::next ──┘─ grant for a relay: credit,
//!                                                                    its writer woken
//!  relay writer (WAN side of a direct session) ─> bytes only against credit
//! ```
//!
//! - A tunnel's streams are served by the tunnel's own transmit (its congestion controller
//!   decides when it can send; the shaper decides which stream and how much), so the
//!   accelerated subtree never goes faster than the tunnel can.
//! - A direct session's WAN-bound direction writes to its server socket only against
//!   credit granted by the shaper; a writer without credit leaves its relay buffer full, the
//!   relay stops reading from the client, and the client's TCP window closes. The grants
//!   come from a pump task woken by a timerfd at the shaper's next departure (tokio's timer
//!   rounds to milliseconds: 25 KB at 200 Mbit/s), or from a tunnel's transmit when a relay
//!   comes first by the rules.
//! - A reload rebuilds the tree in place ([`Shaper::reconfigure`]): every live flow keeps
//!   its id and moves to the scenario of the same name (or `default`), so sessions go on.
//! - Locks: the shaper's mutex is taken inside a tunnel connection's lock (from the
//!   scheduler) and alone elsewhere; nothing holding it takes a connection's lock.

use crate::relay::Side;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use wsx_shaper::{
    AddressList, Arrival, Classifier, FilterError, FilterSpec, FlowId, Grant, Mode, PortId,
    PortKind, Rate, ScenarioId, ScenarioSpec, ScenarioStats, SessionKey, Shaper, Tree, TreeError,
};
use wsx_tunnel::driver::Tunnel;
use wsx_tunnel::{RoundRobin, Scheduler, StreamId, Turn};

/// A scenario's buffer when its configuration sets none: what its sessions may hold in the
/// gateway, written by their clients and not yet sent. A session's relay tops its share up
/// from its own buffer once the share has drained to half, and reads its client meanwhile
/// (a LAN round trip), so half of it only has to outlast that; more is queueing delay.
pub const DEFAULT_BUFFER: u64 = 256 * 1024;

/// Each flow may hold at least this much, however many share its scenario's buffer: one
/// relay buffer's worth, so that a flow never waits on its own buffer (the relay, woken
/// with 32 KiB of it left, writes what it holds at once).
pub const MIN_FLOW_BUFFER: u64 = 64 * 1024;

/// The scenario unmatched sessions belong to: an implicit leaf under the root at the
/// lowest priority, unless the configuration defines a scenario of this name.
pub const DEFAULT_SCENARIO: &str = "default";

/// The bandwidth controller's configuration: the WAN rate, the scenario tree, the filters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShapingConfig {
    pub wan_rate: Rate,
    pub scenarios: Vec<ScenarioSpec>,
    pub lists: Vec<AddressList>,
    pub filters: Vec<FilterSpec>,
}

/// Why a shaping configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapingError {
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// The `default` scenario is not an accelerate leaf.
    #[error(
        "scenario {index} (\"default\") takes the sessions no filter matches: it must be a leaf in accelerate mode"
    )]
    Default { index: usize },
}

impl ShapingConfig {
    pub fn new(wan_rate: Rate) -> Self {
        Self {
            wan_rate,
            scenarios: Vec::new(),
            lists: Vec::new(),
            filters: Vec::new(),
        }
    }

    /// The checked tree (with the implicit `default` scenario added when none is defined)
    /// and the compiled filters.
    pub fn build(&self) -> Result<(Tree, Classifier, ScenarioId), ShapingError> {
        let mut scenarios = self.scenarios.clone();
        let defined = scenarios.iter().position(|s| s.name == DEFAULT_SCENARIO);
        if defined.is_none() {
            scenarios.push(ScenarioSpec {
                name: DEFAULT_SCENARIO.into(),
                priority: 7,
                ..ScenarioSpec::default()
            });
        }
        let tree = Tree::build(self.wan_rate, scenarios)?;
        let default = tree.leaf(DEFAULT_SCENARIO).ok();
        let default = match default {
            Some(id) if tree.spec(id).mode == Mode::Accelerate => id,
            _ => {
                return Err(ShapingError::Default {
                    index: defined.unwrap_or(0),
                });
            }
        };
        let classifier = Classifier::build(&tree, &self.lists, &self.filters)?;
        Ok((tree, classifier, default))
    }
}

/// The bandwidth controller as the API shows it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ShaperStatus {
    pub wan_rate: Rate,
    /// Bytes sent by every shaped flow.
    pub bytes: u64,
    /// Bits per second, over the time since the previous reading at least a second old.
    pub rate: f64,
    pub flows: u64,
    pub scenarios: Vec<ScenarioStatus>,
    /// The filters, in the configuration's order.
    pub filters: Vec<FilterStatus>,
    /// Sessions no filter matched (they went to `default`).
    pub unmatched: u64,
}

/// A filter and the sessions it matched.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FilterStatus {
    pub scenario: String,
    /// What it matches, as `field=value,...` pairs.
    pub matches: String,
    pub sessions: u64,
}

/// One scenario's settings and counters.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScenarioStatus {
    /// As configured.
    pub spec: ScenarioSpec,
    /// Bytes its flows sent (an interior scenario's: its subtree's).
    pub bytes: u64,
    pub flows: u64,
    /// Flows with something to send now.
    pub backlogged: u64,
    /// Bits per second, as [`ShaperStatus::rate`].
    pub rate: f64,
    /// How long its maximum held it back.
    pub held_at_max: Duration,
    /// Whether it gets its minimum (1 % tolerance); `None` without a minimum or while idle.
    pub min_met: Option<bool>,
    /// Sessions it refused (discard scenarios).
    pub discarded: u64,
}

/// What classification decided for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Class {
    pub(crate) scenario: ScenarioId,
    pub(crate) mode: Mode,
    /// The DSCP to mark what the gateway sends for it.
    pub(crate) dscp: Option<u8>,
}

/// The running controller; see the module documentation.
#[derive(Debug)]
pub(crate) struct Shaping {
    state: Mutex<State>,
    /// Wakes the pump: a relay has something to send.
    pump: Notify,
}

#[derive(Debug)]
struct State {
    shaper: Shaper,
    classifier: Classifier,
    default: ScenarioId,
    direct: PortId,
    tunnels: Vec<(Tunnel, PortId)>,
    /// Who carries out each flow's turns.
    flows: HashMap<FlowId, Owner>,
    /// Tunnel streams with a flow, by port.
    streams: HashMap<(PortId, StreamId), FlowId>,
    /// Sessions refused by discard scenarios, by scenario index.
    discarded: Vec<u64>,
    /// The filters as configured, and the sessions each matched; those none matched.
    filters: Vec<FilterSpec>,
    matched: Vec<u64>,
    unmatched: u64,
    /// Byte counts (the root's, then each scenario's) at earlier readings, for rates.
    readings: VecDeque<(Instant, Vec<u64>)>,
    /// Streams whose flow opened or closed since their tunnel's scheduler last looked:
    /// it moves them between the shaper and its fallback.
    moves: HashMap<PortId, Vec<(StreamId, Move)>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// The stream has a flow now (it was queued for its OPEN before it had one).
    ToShaper,
    /// Its flow ended while the stream may still have bytes to send (its FIN, a
    /// retransmission).
    ToFallback,
}

#[derive(Debug)]
enum Owner {
    Stream { port: PortId, id: StreamId },
    Relay(Relay),
}

/// A direct relay's account with the shaper.
#[derive(Debug, Default)]
struct Relay {
    /// Bytes its writer offered and has not been granted yet.
    offered: usize,
    /// Bytes granted and not yet written.
    credit: usize,
    waker: Option<Waker>,
}

impl Shaping {
    pub(crate) fn new(config: &ShapingConfig, now: Instant) -> Result<Arc<Self>, ShapingError> {
        let (tree, classifier, default) = config.build()?;
        let discarded = vec![0; tree.scenarios().count()];
        let mut shaper = Shaper::new(tree, now);
        let direct = shaper.add_port(PortKind::Pumped);
        Ok(Arc::new(Self {
            state: Mutex::new(State {
                shaper,
                classifier,
                default,
                direct,
                tunnels: Vec::new(),
                flows: HashMap::new(),
                streams: HashMap::new(),
                filters: config.filters.clone(),
                matched: vec![0; config.filters.len()],
                unmatched: 0,
                discarded,
                readings: VecDeque::new(),
                moves: HashMap::new(),
            }),
            pump: Notify::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What of a session's arrival the filters read.
    pub(crate) fn reads(&self) -> Arrival {
        self.lock().classifier.reads()
    }

    /// The class of a new session: the first matching filter's scenario, or `default`.
    pub(crate) fn classify(&self, key: &SessionKey<'_>) -> Class {
        let mut state = self.lock();
        let found = state.classifier.classify(key);
        match found {
            Some(m) => state.matched[m.filter] += 1,
            None => state.unmatched += 1,
        }
        let scenario = found.map_or(state.default, |m| m.scenario);
        let spec = state.shaper.tree().spec(scenario);
        let class = Class {
            scenario,
            mode: spec.mode,
            dscp: spec.dscp,
        };
        if class.mode == Mode::Discard {
            state.discarded[scenario.index()] += 1;
        }
        class
    }

    /// Takes `tunnel` into the shaper: it gets a port and serves its streams by the shaper's
    /// turns.
    pub(crate) fn add_tunnel(self: &Arc<Self>, tunnel: &Tunnel) {
        let port = {
            let mut state = self.lock();
            if state.tunnels.iter().any(|(t, _)| t == tunnel) {
                return;
            }
            let port = state.shaper.add_port(PortKind::Driven);
            state.tunnels.push((tunnel.clone(), port));
            port
        };
        tunnel.set_scheduler(Box::new(TunnelScheduler {
            shaping: self.clone(),
            port,
            queued: HashSet::new(),
            fallback: RoundRobin::default(),
            from_fallback: false,
        }));
    }

    /// The tunnel has left service: its port and flows go.
    pub(crate) fn remove_tunnel(&self, tunnel: &Tunnel) {
        let mut state = self.lock();
        let Some(at) = state.tunnels.iter().position(|(t, _)| t == tunnel) else {
            return;
        };
        let (_, port) = state.tunnels.swap_remove(at);
        state.shaper.remove_port(port);
        let state = &mut *state;
        state.streams.retain(|&(p, _), _| p != port);
        state.moves.remove(&port);
    }

    /// Gives every tunnel back its own round-robin scheduler (the shaper is being turned
    /// off): the streams it held queued move there and go on unshaped.
    pub(crate) fn release_tunnels(&self) {
        let tunnels: Vec<Tunnel> = self.lock().tunnels.iter().map(|(t, _)| t.clone()).collect();
        for tunnel in tunnels {
            self.remove_tunnel(&tunnel);
            // Outside the lock: the tunnel's scheduler takes it with the tunnel's held.
            tunnel.set_scheduler(Box::new(RoundRobin::default()));
        }
    }

    /// A flow for `stream` of `tunnel`, in `class`'s scenario; it ends when the guard drops.
    pub(crate) fn open_stream(
        self: &Arc<Self>,
        tunnel: &Tunnel,
        stream: StreamId,
        class: Class,
    ) -> Option<FlowGuard> {
        let mut state = self.lock();
        let port = state.tunnels.iter().find(|(t, _)| t == tunnel)?.1;
        let owner = Owner::Stream { port, id: stream };
        let flow = state.open(class.scenario, port, owner);
        state.streams.insert((port, stream), flow);
        state
            .moves
            .entry(port)
            .or_default()
            .push((stream, Move::ToShaper));
        Some(FlowGuard {
            shaping: self.clone(),
            flow,
            buffer: state.flow_buffer(class.scenario),
        })
    }

    /// A flow for a direct relay in `class`'s scenario, and the guard that ends it.
    pub(crate) fn open_relay(self: &Arc<Self>, class: Class) -> FlowGuard {
        let mut state = self.lock();
        let port = state.direct;
        let flow = state.open(class.scenario, port, Owner::Relay(Relay::default()));
        FlowGuard {
            shaping: self.clone(),
            flow,
            buffer: state.flow_buffer(class.scenario),
        }
    }

    /// Serves the direct relays at the shaper's pace until `stop`.
    pub(crate) async fn pump(self: Arc<Self>, stop: CancellationToken) {
        let mut timer = match wsx_tunnel::driver::Timer::new() {
            Ok(timer) => timer,
            Err(e) => {
                // Without a timer relays still get grants when a tunnel transmits or a
                // writer asks; log it, it should not happen.
                warn!(error = %e, "no timer for the shaper's direct relays");
                return;
            }
        };
        loop {
            #[allow(clippy::disallowed_methods)] // wsx-proxy is a driver: it reads the clock
            let now = Instant::now();
            let deadline = {
                let mut state = self.lock();
                let direct = state.direct;
                state.serve(now, direct);
                state.shaper.poll_timeout(now, direct)
            };
            match deadline {
                Some(at) => timer.arm(at),
                None => timer.disarm(),
            }
            tokio::select! {
                r = timer.expired(), if deadline.is_some() => {
                    if let Err(e) = r {
                        warn!(error = %e, "the shaper's timer failed");
                        return;
                    }
                }
                () = self.pump.notified() => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// A new tree and filters: live flows move to the scenario of the same name, or to
    /// `default`; counts of discarded sessions follow their scenario's name.
    pub(crate) fn reconfigure(
        &self,
        config: &ShapingConfig,
        now: Instant,
    ) -> Result<(), ShapingError> {
        let (tree, classifier, default) = config.build()?;
        let mut state = self.lock();
        let old: HashMap<String, u64> = state
            .shaper
            .tree()
            .scenarios()
            .map(|s| s.name.clone())
            .zip(state.discarded.iter().copied())
            .collect();
        state.discarded = tree
            .scenarios()
            .map(|s| old.get(&s.name).copied().unwrap_or(0))
            .collect();
        state
            .shaper
            .reconfigure(tree, now, |tree, name| tree.leaf(name).unwrap_or(default));
        state.classifier = classifier;
        state.default = default;
        state.filters = config.filters.clone();
        state.matched = vec![0; config.filters.len()];
        // Rates restart with the new list of scenarios.
        state.readings.clear();
        drop(state);
        // Relays waiting for credit ask again under the new tree.
        self.pump.notify_one();
        Ok(())
    }

    /// The controller's state for the API: each scenario's settings and counters, with its
    /// rate since the previous reading at least a second old.
    pub(crate) fn status(&self, now: Instant) -> ShaperStatus {
        let mut state = self.lock();
        let state = &mut *state;
        let tree = state.shaper.tree();
        let count = tree.scenarios().count();
        let stats: Vec<ScenarioStats> = (0..count).filter_map(|i| state.shaper.stats(i)).collect();
        let total = state.shaper.total();
        let bytes: Vec<u64> = std::iter::once(total.bytes)
            .chain(stats.iter().map(|s| s.bytes))
            .collect();
        let rates = rates(&mut state.readings, now, &bytes);
        let scenarios = tree
            .scenarios()
            .zip(&stats)
            .enumerate()
            .map(|(i, (spec, st))| {
                let rate = rates[i + 1];
                let min_met = spec
                    .min_rate
                    .filter(|_| st.backlogged > 0)
                    .map(|min| rate >= 0.99 * min.bits_per_second() as f64);
                ScenarioStatus {
                    spec: spec.clone(),
                    bytes: st.bytes,
                    flows: st.flows,
                    backlogged: st.backlogged,
                    rate,
                    held_at_max: Duration::from_nanos(st.held_at_max_nanos),
                    min_met,
                    discarded: state.discarded.get(i).copied().unwrap_or(0),
                }
            })
            .collect();
        ShaperStatus {
            wan_rate: tree.wan_rate(),
            bytes: total.bytes,
            rate: rates[0],
            flows: total.flows,
            scenarios,
            filters: state
                .filters
                .iter()
                .zip(&state.matched)
                .map(|(f, &sessions)| FilterStatus {
                    scenario: f.scenario.clone(),
                    matches: f.to_string(),
                    sessions,
                })
                .collect(),
            unmatched: state.unmatched,
        }
    }
}

impl State {
    fn open(&mut self, scenario: ScenarioId, port: PortId, owner: Owner) -> FlowId {
        let flow = self.shaper.open(scenario, port);
        self.flows.insert(flow, owner);
        flow
    }

    /// What a flow opening now in `scenario` may hold: the scenario's buffer shared among
    /// its flows, at least [`MIN_FLOW_BUFFER`].
    fn flow_buffer(&self, scenario: ScenarioId) -> u64 {
        let buffer = self
            .shaper
            .tree()
            .spec(scenario)
            .buffer
            .unwrap_or(DEFAULT_BUFFER);
        let flows = self
            .shaper
            .stats(scenario.index())
            .map_or(1, |s| s.flows.max(1));
        (buffer / flows).max(MIN_FLOW_BUFFER)
    }

    fn close(&mut self, flow: FlowId) -> Option<Waker> {
        let owner = self.flows.remove(&flow)?;
        self.shaper.close(flow);
        match owner {
            Owner::Stream { port, id } => {
                self.streams.remove(&(port, id));
                if self.tunnels.iter().any(|&(_, p)| p == port) {
                    self.moves
                        .entry(port)
                        .or_default()
                        .push((id, Move::ToFallback));
                }
                None
            }
            Owner::Relay(relay) => relay.waker,
        }
    }

    /// Hands out every turn due at `now` that `caller` may take; returns the first for a
    /// stream of `caller` (a tunnel takes one turn at a time), after handing the direct
    /// relays theirs.
    fn serve(&mut self, now: Instant, caller: PortId) -> Option<(StreamId, Grant)> {
        while let Some(grant) = self.shaper.next(now, caller) {
            let Some(owner) = self.flows.get_mut(&grant.flow) else {
                // A flow the shaper knows and the gateway forgot: close it in the shaper.
                self.shaper.close(grant.flow);
                continue;
            };
            match owner {
                Owner::Stream { id, .. } => return Some((*id, grant)),
                Owner::Relay(relay) => {
                    let bytes = grant.max_bytes.min(relay.offered);
                    relay.offered -= bytes;
                    relay.credit += bytes;
                    let more = relay.offered > 0;
                    if let Some(waker) = relay.waker.take() {
                        waker.wake();
                    }
                    self.shaper.sent(grant.flow, bytes, more, now);
                }
            }
        }
        None
    }
}

/// Bits per second for each of `bytes` since the newest reading at least a second old (or
/// the oldest there is), recording this one.
fn rates(readings: &mut VecDeque<(Instant, Vec<u64>)>, now: Instant, bytes: &[u64]) -> Vec<f64> {
    const SPAN: Duration = Duration::from_secs(1);
    // Keep only the newest reading a second old and those after it.
    while readings.len() > 1 && now.saturating_duration_since(readings[1].0) >= SPAN {
        readings.pop_front();
    }
    let rates = match readings.front() {
        Some((then, old)) if old.len() == bytes.len() && now > *then => {
            let seconds = (now - *then).as_secs_f64();
            bytes
                .iter()
                .zip(old)
                .map(|(b, o)| b.saturating_sub(*o) as f64 * 8.0 / seconds)
                .collect()
        }
        _ => vec![0.0; bytes.len()],
    };
    readings.push_back((now, bytes.to_vec()));
    rates
}

/// Ends a flow when dropped.
#[derive(Debug)]
pub(crate) struct FlowGuard {
    shaping: Arc<Shaping>,
    flow: FlowId,
    /// What the flow may hold in the gateway (its share of its scenario's buffer, when it
    /// opened).
    buffer: u64,
}

impl FlowGuard {
    pub(crate) fn buffer(&self) -> u64 {
        self.buffer
    }
}

impl Drop for FlowGuard {
    fn drop(&mut self) {
        let waker = self.shaping.lock().close(self.flow);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A direct session's WAN-bound side: writes only against the shaper's credit. Reads pass
/// through.
#[derive(Debug)]
pub(crate) struct Shaped<W> {
    inner: W,
    flow: FlowGuard,
    /// Credit taken from the shaper's account and not yet written.
    credit: usize,
}

impl<W> Shaped<W> {
    pub(crate) fn new(inner: W, flow: FlowGuard) -> Self {
        Self {
            inner,
            flow,
            credit: 0,
        }
    }

    pub(crate) fn into_inner(self) -> W {
        self.inner
    }

    /// Takes the credit granted so far; without any, offers `want` bytes and registers
    /// the task to be woken by the grant.
    fn take_credit(&mut self, want: usize, cx: &mut Context<'_>) -> Poll<()> {
        let shaping = &self.flow.shaping;
        let mut state = shaping.lock();
        let state = &mut *state;
        let flow = self.flow.flow;
        let Some(Owner::Relay(relay)) = state.flows.get_mut(&flow) else {
            // Cannot happen (the guard keeps the flow); do not hold the session on it.
            self.credit = want;
            return Poll::Ready(());
        };
        if relay.credit > 0 {
            self.credit = std::mem::take(&mut relay.credit);
            // What is still offered is what the writer wants beyond it now.
            relay.offered = want.saturating_sub(self.credit);
            if relay.offered == 0 {
                state.shaper.remove(flow);
            }
            return Poll::Ready(());
        }
        relay.offered = want;
        relay.waker = Some(cx.waker().clone());
        #[allow(clippy::disallowed_methods)] // wsx-proxy is a driver: it reads the clock
        let now = Instant::now();
        state.shaper.push(flow, now);
        shaping.pump.notify_one();
        Poll::Pending
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Shaped<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Pin::new(&mut self.inner).poll_write(cx, buf);
        }
        if self.credit == 0 && self.take_credit(buf.len(), cx).is_pending() {
            return Poll::Pending;
        }
        let n = self.credit.min(buf.len());
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, &buf[..n]) {
            Poll::Ready(Ok(written)) => {
                this.credit -= written;
                Poll::Ready(Ok(written))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<W: AsyncRead + Unpin> AsyncRead for Shaped<W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: Side> Side for Shaped<S> {
    fn abort(self, code: u64) {
        self.into_inner().abort(code);
    }
}

/// A tunnel connection's stream scheduler: the shaper's turns for the tunnel's port. Streams
/// without a flow (none should remain once sessions register theirs; a stream can outlive
/// its session while its last bytes are retransmitted) share what the shaper leaves, in
/// round robin.
#[derive(Debug)]
struct TunnelScheduler {
    shaping: Arc<Shaping>,
    port: PortId,
    /// Streams with a flow that are queued.
    queued: HashSet<StreamId>,
    fallback: RoundRobin,
    /// The last turn came from the fallback.
    from_fallback: bool,
}

impl TunnelScheduler {
    fn flow(&self, state: &State, id: StreamId) -> Option<FlowId> {
        state.streams.get(&(self.port, id)).copied()
    }
}

impl TunnelScheduler {
    /// Moves the streams whose flow opened or closed between the shaper and the fallback.
    fn apply_moves(&mut self, state: &mut State, now: Instant) {
        let Some(moves) = state.moves.get_mut(&self.port).filter(|m| !m.is_empty()) else {
            return;
        };
        let moves = std::mem::take(moves);
        for (id, to) in moves {
            match to {
                Move::ToShaper if self.fallback.contains(id) => {
                    self.fallback.remove(id);
                    if let Some(flow) = self.flow(state, id) {
                        state.shaper.push(flow, now);
                        self.queued.insert(id);
                    }
                }
                Move::ToFallback if self.queued.remove(&id) => self.fallback.push(id),
                _ => {}
            }
        }
    }
}

impl Scheduler for TunnelScheduler {
    fn push(&mut self, id: StreamId) {
        let shaping = self.shaping.clone();
        let mut state = shaping.lock();
        match self.flow(&state, id) {
            Some(flow) => {
                #[allow(clippy::disallowed_methods)] // wsx-proxy is a driver: it reads the clock
                let now = Instant::now();
                state.shaper.push(flow, now);
                self.queued.insert(id);
            }
            None => self.fallback.push(id),
        }
    }

    fn next(&mut self, now: Instant) -> Option<Turn> {
        let shaping = self.shaping.clone();
        let mut state = shaping.lock();
        self.apply_moves(&mut state, now);
        if !self.queued.is_empty() {
            let turn = state.serve(now, self.port);
            if let Some((id, grant)) = turn {
                self.from_fallback = false;
                return Some(Turn {
                    id,
                    max_bytes: grant.max_bytes,
                });
            }
        }
        drop(state);
        self.from_fallback = true;
        self.fallback.next(now)
    }

    fn sent(&mut self, id: StreamId, bytes: usize, more: bool, now: Instant) {
        if self.from_fallback {
            return self.fallback.sent(id, bytes, more, now);
        }
        let shaping = self.shaping.clone();
        let mut state = shaping.lock();
        if let Some(flow) = self.flow(&state, id) {
            state.shaper.sent(flow, bytes, more, now);
        }
        if !more {
            self.queued.remove(&id);
        }
    }

    fn remove(&mut self, id: StreamId) {
        if self.queued.remove(&id) {
            let shaping = self.shaping.clone();
            let mut state = shaping.lock();
            if let Some(flow) = self.flow(&state, id) {
                state.shaper.remove(flow);
            }
        } else {
            self.fallback.remove(id);
        }
    }

    fn is_empty(&self) -> bool {
        self.queued.is_empty() && self.fallback.is_empty()
    }

    fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        if !self.fallback.is_empty() {
            return None;
        }
        // `None` also while a stream whose flow just ended waits to move to the fallback
        // (next `next` moves it): the connection then transmits, which is what it needs.
        self.shaping.lock().shaper.poll_timeout(now, self.port)
    }
}
