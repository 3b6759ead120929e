//! The scheduler: which flow sends next, and how much, so that every scenario gets its
//! minimum, none exceeds its maximum, the excess goes by priority and the flows of a
//! scenario share it equally.
//!
//! # Model
//!
//! Every node of the tree (the root is the WAN rate) has up to two `RateClock`s: a
//! maximum, which holds the node's whole subtree to its rate, and a minimum, which marks when
//! the node is owed service. A turn is chosen in two phases:
//!
//! 1. **Minimums.** Among the nodes whose minimum clock is due, whose own and ancestors'
//!    maximums allow sending, the one that has been due longest (earliest deadline first)
//!    is served; inside it, the turn goes down by the excess rule below.
//! 2. **Excess.** From the root down: among the children with something to send whose
//!    maximum allows, the highest priority (0) first; equal priorities share equally
//!    (start-time fair queueing on the bytes each was given by this rule).
//!
//! In a leaf, the flows share equally (deficit round robin), whatever their turns carried.
//! Every byte sent moves every clock on its path: maximums by the bytes' time at their
//! rate, minimums too but never further ahead of the present than one turn, so that
//! service above a minimum is not held against a scenario when it next falls back to it.
//! When the sum of the minimums cannot be carried (a tunnel whose congestion controller
//! allows less), the earliest-deadline order divides what can be sent in proportion to the
//! minimums.
//!
//! # Ports
//!
//! Flows are served through *ports*: a tunnel connection, or the direct relays. A
//! [`PortKind::Driven`] port (a tunnel) asks for turns itself when it can send, so its
//! flows are candidates only while it asks: the tunnel's subtree never sends faster than
//! its congestion controller allows. A [`PortKind::Pumped`] port's flows are candidates in
//! every call (a timer serves the direct relays at [`Shaper::poll_timeout`]), so a turn
//! asked for by a tunnel may go to a direct relay that comes first by the rules above; the
//! caller hands such grants on.

use crate::rate::{Nanos, RateClock, WAKE_GAP};
use crate::tree::{Mode, NodeIndex, PRIORITIES, ROOT, ScenarioId, Tree};
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// The most one turn may carry: two full-sized TCP segments. A grant is sent at once, so
/// it is the most by which any millisecond can exceed the rate (`rate × 1 ms + 2 packets`).
pub const GRANT: usize = 2 * 1448;

/// Under a cap, a turn carries at most this long at the capped rate, so that a one-second
/// window never counts more than a 0.2 % share of a turn too many or too few (at 1 Mbit/s,
/// 250 bytes rather than 2,896, which would be 2.3 % of a second).
const GRANT_TIME_NANOS: u128 = 2_000_000;

/// Turns are never smaller than this, whatever the rate (a 10 kbit/s scenario sends
/// 200-byte turns, 160 ms apart).
const MIN_GRANT: usize = 200;

/// Deficit round robin's quantum among the flows of a scenario: one grant.
const QUANTUM: i64 = GRANT as i64;

/// How far behind its siblings a node that could not be served (its port was not asking)
/// may be when it is served again: it may catch up this many bytes, no more, so a tunnel's
/// flows do not take a burst at the others' cost when the tunnel can send again.
const TAG_SLACK: u64 = 4 * GRANT as u64;

/// A flow: one direction of one session, in one leaf scenario, served through one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowId {
    index: u32,
    generation: u32,
}

/// Where a flow's turns are carried out: a tunnel connection, or the direct relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortId(u16);

/// How a port asks for turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortKind {
    /// It asks itself whenever it can send (a tunnel connection).
    Driven,
    /// A timer asks on its behalf at [`Shaper::poll_timeout`] (direct relays).
    Pumped,
}

/// A turn: `flow` may send up to `max_bytes` now, through `port`. Report what it sent with
/// [`Shaper::sent`] before asking for the next turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub flow: FlowId,
    pub port: PortId,
    pub max_bytes: usize,
}

/// A scenario's running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScenarioStats {
    /// Bytes sent by the scenario's flows (for an interior scenario, its subtree's).
    pub bytes: u64,
    /// Flows in the scenario (for an interior one, its subtree's).
    pub flows: u64,
    /// Flows with something to send now.
    pub backlogged: u64,
    /// How long the scenario's maximum has held it back: the time its clock ran ahead of
    /// the present because of what it sent (all of it, for a scenario sending at its
    /// maximum; none, for one that never reaches it). Nanoseconds.
    pub held_at_max_nanos: u64,
}

/// The shaper of one gateway: a checked [`Tree`], its clocks, and the flows in it.
#[derive(Debug)]
pub struct Shaper {
    tree: Tree,
    epoch: Instant,
    nodes: Vec<Node>,
    flows: Vec<Flow>,
    free: Vec<u32>,
    ports: Vec<Option<PortKind>>,
    /// Busy nodes with a minimum rate, by when their minimum is next due.
    minimums: BTreeSet<(Nanos, NodeIndex)>,
    /// The last turn handed out, and the node whose minimum it served (if phase 1).
    last: Option<(FlowId, Option<NodeIndex>)>,
    /// Reused candidate lists, one per tree level (no allocation per turn).
    scratch: Vec<Vec<(u64, NodeIndex)>>,
}

#[derive(Debug)]
struct Node {
    parent: Option<NodeIndex>,
    priority: usize,
    /// Children ordered by priority.
    children: Vec<NodeIndex>,
    max: Option<RateClock>,
    min: Option<RateClock>,
    /// Bytes this node was given by its parent's excess rule (its start tag there).
    tag: u64,
    /// Per priority, the tag of the child last served: where a newly busy child starts.
    vtime: [u64; PRIORITIES],
    /// Backlogged flows in the subtree, per port.
    active: Vec<(PortId, u32)>,
    /// Flows, for leaves: one ring per port.
    rings: Vec<Ring>,
    /// The most a turn of this leaf's flows carries (see [`GRANT_TIME_NANOS`]).
    grant: usize,
    stats: ScenarioStats,
}

/// The flows of one leaf served through one port, in deficit round robin order.
#[derive(Debug)]
struct Ring {
    port: PortId,
    /// Flow indices; an entry whose flow is no longer queued is dropped when it comes round.
    queue: VecDeque<u32>,
    /// Bytes per queued flow this ring was given: rings of a leaf share by it.
    tag: u64,
    queued: u32,
}

#[derive(Debug)]
struct Flow {
    generation: u32,
    open: bool,
    leaf: NodeIndex,
    port: PortId,
    deficit: i64,
    /// It has something to send.
    queued: bool,
    /// Its index is in its ring's queue (possibly stale, see [`Ring::queue`]).
    in_ring: bool,
    /// `flow_rate`, in fixed scenarios.
    clock: Option<RateClock>,
}

impl Shaper {
    pub fn new(tree: Tree, now: Instant) -> Self {
        let mut nodes: Vec<Node> = tree
            .nodes
            .iter()
            .map(|n| Node {
                parent: n.parent,
                priority: usize::from(n.spec.priority),
                children: n.children.clone(),
                max: n.spec.max_rate.map(RateClock::new),
                min: n.spec.min_rate.map(RateClock::new),
                tag: 0,
                vtime: [0; PRIORITIES],
                active: Vec::new(),
                rings: Vec::new(),
                grant: GRANT,
                stats: ScenarioStats::default(),
            })
            .collect();
        for (i, node) in nodes.iter_mut().enumerate() {
            node.grant = grant_size(&tree, i);
        }
        let priorities: Vec<usize> = nodes.iter().map(|n| n.priority).collect();
        for node in &mut nodes {
            node.children.sort_by_key(|&c| priorities[c]);
        }
        let depth = tree.nodes.iter().map(|n| n.depth).max().unwrap_or(0);
        Self {
            tree,
            epoch: now,
            nodes,
            flows: Vec::new(),
            free: Vec::new(),
            ports: Vec::new(),
            minimums: BTreeSet::new(),
            last: None,
            scratch: vec![Vec::new(); depth + 1],
        }
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Replaces the tree (a reload), keeping every port and flow under the same ids: each
    /// open flow moves to the leaf `place` gives for the name of the scenario it was in, and
    /// one that had something to send still has. Clocks and shares start afresh.
    pub fn reconfigure(
        &mut self,
        tree: Tree,
        now: Instant,
        place: impl Fn(&Tree, &str) -> ScenarioId,
    ) {
        let old = std::mem::replace(self, Shaper::new(tree, self.epoch));
        self.ports = old.ports;
        let mut queued = Vec::new();
        for (i, flow) in old.flows.into_iter().enumerate() {
            let leaf = if flow.open {
                let name = &old.tree.nodes[flow.leaf].spec.name;
                place(&self.tree, name).0
            } else {
                self.free.push(i as u32);
                ROOT
            };
            let spec = &self.tree.nodes[leaf].spec;
            let clock = (spec.mode == Mode::Fixed)
                .then_some(spec.flow_rate)
                .flatten()
                .map(RateClock::new);
            if flow.open {
                let mut at = Some(leaf);
                while let Some(n) = at {
                    self.nodes[n].stats.flows += 1;
                    at = self.nodes[n].parent;
                }
                if flow.queued {
                    queued.push(i);
                }
            }
            self.flows.push(Flow {
                leaf,
                deficit: 0,
                queued: false,
                in_ring: false,
                clock,
                ..flow
            });
        }
        for i in queued {
            let id = self.id(i);
            self.push(id, now);
        }
    }

    pub fn add_port(&mut self, kind: PortKind) -> PortId {
        let slot = self.ports.iter().position(Option::is_none);
        let index = slot.unwrap_or_else(|| {
            self.ports.push(None);
            self.ports.len() - 1
        });
        self.ports[index] = Some(kind);
        PortId(u16::try_from(index).unwrap_or(u16::MAX))
    }

    /// Closes the port and every flow still served through it.
    pub fn remove_port(&mut self, port: PortId) {
        let doomed: Vec<FlowId> = (0..self.flows.len())
            .filter(|&i| self.flows[i].open && self.flows[i].port == port)
            .map(|i| self.id(i))
            .collect();
        for flow in doomed {
            self.close(flow);
        }
        if let Some(slot) = self.ports.get_mut(usize::from(port.0)) {
            *slot = None;
        }
    }

    /// A new flow in the leaf `scenario`, served through `port`, with nothing to send yet.
    pub fn open(&mut self, scenario: ScenarioId, port: PortId) -> FlowId {
        let leaf = scenario.0;
        let clock = match self.tree.nodes[leaf].spec.mode {
            Mode::Fixed => self.tree.nodes[leaf].spec.flow_rate.map(RateClock::new),
            _ => None,
        };
        let flow = Flow {
            generation: 0,
            open: true,
            leaf,
            port,
            deficit: 0,
            queued: false,
            in_ring: false,
            clock,
        };
        let index = match self.free.pop() {
            Some(i) => {
                let generation = self.flows[i as usize].generation.wrapping_add(1);
                self.flows[i as usize] = Flow { generation, ..flow };
                i
            }
            None => {
                self.flows.push(flow);
                (self.flows.len() - 1) as u32
            }
        };
        let mut at = Some(leaf);
        while let Some(n) = at {
            self.nodes[n].stats.flows += 1;
            at = self.nodes[n].parent;
        }
        self.id(index as usize)
    }

    /// The flow has ended: it leaves its scenario.
    pub fn close(&mut self, flow: FlowId) {
        let Some(i) = self.index(flow) else { return };
        self.unqueue(i);
        let f = &mut self.flows[i];
        f.open = false;
        let mut at = Some(f.leaf);
        while let Some(n) = at {
            self.nodes[n].stats.flows -= 1;
            at = self.nodes[n].parent;
        }
        if !self.flows[i].in_ring {
            self.free.push(i as u32);
        }
        if self.last.is_some_and(|(f, _)| f == flow) {
            self.last = None;
        }
    }

    /// The flow has something to send (again).
    pub fn push(&mut self, flow: FlowId, now: Instant) {
        let now = self.nanos(now);
        let Some(i) = self.index(flow) else { return };
        let f = &mut self.flows[i];
        if f.queued {
            return;
        }
        f.queued = true;
        f.deficit = 0;
        if let Some(clock) = &mut f.clock {
            clock.restart(now);
        }
        let (leaf, port, in_ring) = (f.leaf, f.port, f.in_ring);
        f.in_ring = true;
        let rings = &mut self.nodes[leaf].rings;
        let r = match rings.iter().position(|r| r.port == port) {
            Some(r) => r,
            None => {
                rings.push(Ring {
                    port,
                    queue: VecDeque::new(),
                    tag: 0,
                    queued: 0,
                });
                rings.len() - 1
            }
        };
        let lowest = rings.iter().filter(|r| r.queued > 0).map(|r| r.tag).min();
        let ring = &mut rings[r];
        if ring.queued == 0
            && let Some(lowest) = lowest
        {
            ring.tag = ring.tag.max(lowest);
        }
        ring.queued += 1;
        if !in_ring {
            ring.queue.push_back(i as u32);
        }
        self.activate(leaf, port, now);
    }

    /// The flow has nothing more to send for now.
    pub fn remove(&mut self, flow: FlowId) {
        if let Some(i) = self.index(flow) {
            self.unqueue(i);
        }
    }

    /// The next turn for `caller`'s flows or for a pumped port's, if any may send at `now`.
    pub fn next(&mut self, now: Instant, caller: PortId) -> Option<Grant> {
        let now = self.nanos(now);
        let (flow, via) = self
            .next_by_minimum(now, caller)
            .or_else(|| self.descend(ROOT, now, caller).ok().map(|f| (f, None)))?;
        let id = self.id(flow);
        self.last = Some((id, via));
        Some(Grant {
            flow: id,
            port: self.flows[flow].port,
            max_bytes: self.nodes[self.flows[flow].leaf].grant,
        })
    }

    /// `flow` sent `bytes` in its last turn; `more` says whether it still has something to
    /// send.
    pub fn sent(&mut self, flow: FlowId, bytes: usize, more: bool, now: Instant) {
        let now = self.nanos(now);
        let Some(i) = self.index(flow) else { return };
        let via = match self.last.take() {
            Some((f, via)) if f == flow => via,
            _ => None,
        };
        let bytes_u64 = bytes as u64;
        let f = &mut self.flows[i];
        f.deficit -= bytes as i64;
        if let Some(clock) = &mut f.clock {
            clock.charge(bytes_u64, now);
        }
        let (leaf, port) = (f.leaf, f.port);
        if let Some(ring) = self.nodes[leaf].rings.iter_mut().find(|r| r.port == port) {
            ring.tag += bytes_u64 / u64::from(ring.queued.max(1));
        }
        // Up the path: every clock, and the excess tags of the choices made by the excess
        // rule (all of them in phase 2; below the served minimum's node in phase 1).
        let mut by_excess = true;
        let mut at = Some(leaf);
        while let Some(n) = at {
            if via == Some(n) {
                by_excess = false;
            }
            let parent = self.nodes[n].parent;
            if by_excess && let Some(p) = parent {
                let priority = self.nodes[n].priority;
                let floor = self.nodes[p].vtime[priority].saturating_sub(TAG_SLACK);
                let node = &mut self.nodes[n];
                node.tag = node.tag.max(floor);
                let start = node.tag;
                node.tag += bytes_u64;
                self.nodes[p].vtime[priority] = start;
            }
            let node = &mut self.nodes[n];
            if let Some(max) = &mut node.max {
                let from = max.next().max(now);
                max.charge(bytes_u64, now);
                node.stats.held_at_max_nanos += max.next().saturating_sub(from);
            }
            node.stats.bytes += bytes_u64;
            self.update_minimum(n, |min| min.charge_floor(bytes_u64, now));
            at = parent;
        }
        if !more {
            self.unqueue(i);
        }
    }

    /// When `caller` should ask again: `None` if none of its flows (nor a pumped port's)
    /// has anything to send, `now` or earlier if one may send at once, and otherwise
    /// never sooner than [`WAKE_GAP`] from `now`.
    pub fn poll_timeout(&self, now: Instant, caller: PortId) -> Option<Instant> {
        let now = self.nanos(now);
        let at = self.eligible_at(ROOT, caller, now)?;
        let at = if at > now {
            at.max(now + WAKE_GAP.as_nanos() as Nanos)
        } else {
            at
        };
        Some(self.epoch + Duration::from_nanos(at))
    }

    /// The totals of the scenario at `index` in the tree's list (interior ones count their
    /// subtree), if there is one.
    pub fn stats(&self, index: usize) -> Option<ScenarioStats> {
        self.nodes.get(index + 1).map(|n| n.stats)
    }

    /// The totals of everything shaped.
    pub fn total(&self) -> ScenarioStats {
        self.nodes[ROOT].stats
    }

    /// Phase 1: the most overdue minimum that can be served.
    fn next_by_minimum(
        &mut self,
        now: Nanos,
        caller: PortId,
    ) -> Option<(usize, Option<NodeIndex>)> {
        let mut due = std::mem::take(&mut self.scratch[0]);
        due.clear();
        for &(at, n) in self.minimums.range(..(now.saturating_add(1), 0)) {
            if self.busy(n, caller) && self.ancestors_ready(n, now) {
                due.push((at, n));
            }
        }
        let mut found = None;
        for &(_, n) in &due {
            if let Ok(flow) = self.descend(n, now, caller) {
                found = Some((flow, Some(n)));
                break;
            }
        }
        self.scratch[0] = due;
        found
    }

    /// Phase 2 inside `n`: a flow that may send now, or the earliest time one might.
    fn descend(&mut self, n: NodeIndex, now: Nanos, caller: PortId) -> Result<usize, Nanos> {
        if let Some(max) = &self.nodes[n].max
            && !max.ready(now)
        {
            return Err(max.next());
        }
        if self.nodes[n].children.is_empty() {
            return self.pick_flow(n, now, caller);
        }
        // A node with children is above the deepest level, so its children's level exists.
        let level = self.tree.nodes[n].depth + 1;
        let mut candidates = std::mem::take(&mut self.scratch[level]);
        let mut earliest = Nanos::MAX;
        let mut found = Err(earliest);
        let children = self.nodes[n].children.len();
        let mut c = 0;
        'priorities: while c < children {
            let priority = self.nodes[self.nodes[n].children[c]].priority;
            candidates.clear();
            while c < children {
                let child = self.nodes[n].children[c];
                let node = &self.nodes[child];
                if node.priority != priority {
                    break;
                }
                c += 1;
                if self.busy(child, caller) {
                    candidates.push((node.tag, child));
                }
            }
            // The lowest tag first; the rest only if it cannot send (held by a maximum).
            while !candidates.is_empty() {
                let lowest = (0..candidates.len())
                    .min_by_key(|&i| candidates[i])
                    .unwrap_or(0);
                let (_, child) = candidates.swap_remove(lowest);
                match self.descend(child, now, caller) {
                    Ok(flow) => {
                        found = Ok(flow);
                        break 'priorities;
                    }
                    Err(at) => earliest = earliest.min(at),
                }
            }
            found = Err(earliest);
        }
        self.scratch[level] = candidates;
        found
    }

    /// A leaf's next flow by deficit round robin, over the rings `caller` may serve.
    fn pick_flow(&mut self, leaf: NodeIndex, now: Nanos, caller: PortId) -> Result<usize, Nanos> {
        let mut earliest = Nanos::MAX;
        let mut tried = 0u64; // rings tried, as a bit set (a leaf has few)
        loop {
            let ring = self.nodes[leaf]
                .rings
                .iter()
                .enumerate()
                .filter(|&(r, ring)| {
                    ring.queued > 0
                        && r < 64
                        && tried & (1 << r) == 0
                        && self.serves(ring.port, caller)
                })
                .min_by_key(|(_, ring)| ring.tag)
                .map(|(r, _)| r);
            let Some(r) = ring else { return Err(earliest) };
            tried |= 1 << r;
            match self.round_robin(leaf, r, now) {
                Ok(flow) => return Ok(flow),
                Err(at) => earliest = earliest.min(at),
            }
        }
    }

    /// Deficit round robin in one ring: the front flow if it has credit and its own clock
    /// allows; flows out of credit get a quantum and go to the back.
    fn round_robin(&mut self, leaf: NodeIndex, r: usize, now: Nanos) -> Result<usize, Nanos> {
        let mut earliest = Nanos::MAX;
        let mut held = 0; // flows in a row held by their own rate
        loop {
            let ring = &mut self.nodes[leaf].rings[r];
            let Some(&front) = ring.queue.front() else {
                return Err(earliest);
            };
            let flow = &mut self.flows[front as usize];
            if !flow.queued {
                // A stale entry: the flow left the queue (or closed) since.
                ring.queue.pop_front();
                flow.in_ring = false;
                if !flow.open {
                    self.free.push(front);
                }
                continue;
            }
            if let Some(clock) = &flow.clock
                && !clock.ready(now)
            {
                earliest = earliest.min(clock.next());
                held += 1;
                if held >= ring.queued {
                    return Err(earliest);
                }
                ring.queue.rotate_left(1);
                continue;
            }
            if flow.deficit > 0 {
                return Ok(front as usize);
            }
            flow.deficit += QUANTUM;
            held = 0;
            ring.queue.rotate_left(1);
        }
    }

    /// The earliest time `n`'s subtree may send for `caller`, if it has anything to send;
    /// anything at or before `floor` (the present, or an ancestor's own next departure) is
    /// as good as `floor`, so the search stops at the first child that may send by then.
    fn eligible_at(&self, n: NodeIndex, caller: PortId, floor: Nanos) -> Option<Nanos> {
        if !self.busy(n, caller) {
            return None;
        }
        let own = self.nodes[n].max.as_ref().map_or(0, RateClock::next);
        let floor = floor.max(own);
        let below = if self.nodes[n].children.is_empty() {
            if self.tree.nodes[n].spec.mode != Mode::Fixed {
                // Flows without a rate of their own may always send.
                return Some(floor);
            }
            self.nodes[n]
                .rings
                .iter()
                .filter(|r| r.queued > 0 && self.serves(r.port, caller))
                .flat_map(|r| r.queue.iter())
                .map(|&f| &self.flows[f as usize])
                .filter(|f| f.queued)
                .map(|f| f.clock.as_ref().map_or(0, RateClock::next))
                .min()?
        } else {
            let mut earliest = None;
            for &c in &self.nodes[n].children {
                if let Some(at) = self.eligible_at(c, caller, floor) {
                    if at <= floor {
                        return Some(floor);
                    }
                    earliest = Some(earliest.map_or(at, |e: Nanos| e.min(at)));
                }
            }
            earliest?
        };
        Some(floor.max(below))
    }

    /// Whether `n`'s subtree has flows to send that `caller` may serve.
    fn busy(&self, n: NodeIndex, caller: PortId) -> bool {
        self.nodes[n]
            .active
            .iter()
            .any(|&(port, count)| count > 0 && self.serves(port, caller))
    }

    /// Whether a turn asked for by `caller` may go to a flow of `port`.
    fn serves(&self, port: PortId, caller: PortId) -> bool {
        port == caller
            || self.ports.get(usize::from(port.0)).copied().flatten() == Some(PortKind::Pumped)
    }

    /// Whether the maximums of all of `n`'s ancestors allow sending now.
    fn ancestors_ready(&self, n: NodeIndex, now: Nanos) -> bool {
        let mut at = self.nodes[n].parent;
        while let Some(p) = at {
            if self.nodes[p].max.as_ref().is_some_and(|m| !m.ready(now)) {
                return false;
            }
            at = self.nodes[p].parent;
        }
        true
    }

    /// The flow's subtree gained a backlogged flow of `port`; clocks of nodes that were
    /// idle restart at the present (no credit for idling) and their tags join their
    /// siblings'.
    fn activate(&mut self, leaf: NodeIndex, port: PortId, now: Nanos) {
        let mut at = Some(leaf);
        while let Some(n) = at {
            let parent = self.nodes[n].parent;
            let node = &mut self.nodes[n];
            let idle = node.active.iter().all(|&(_, c)| c == 0);
            match node.active.iter_mut().find(|(p, _)| *p == port) {
                Some((_, count)) => *count += 1,
                None => node.active.push((port, 1)),
            }
            node.stats.backlogged += 1;
            if idle {
                if let Some(max) = &mut node.max {
                    max.restart(now);
                }
                self.update_minimum(n, |min| min.restart(now));
                if let Some(p) = parent {
                    let vtime = self.nodes[p].vtime[self.nodes[n].priority];
                    let node = &mut self.nodes[n];
                    node.tag = node.tag.max(vtime);
                }
            }
            at = parent;
        }
    }

    /// Changes node `n`'s minimum clock (if it has one) and keeps its place in
    /// [`Shaper::minimums`] (only while the node is busy).
    fn update_minimum(&mut self, n: NodeIndex, change: impl FnOnce(&mut RateClock)) {
        let node = &mut self.nodes[n];
        let Some(min) = &mut node.min else { return };
        self.minimums.remove(&(min.next(), n));
        change(min);
        if node.active.iter().any(|&(_, count)| count > 0) {
            self.minimums.insert((min.next(), n));
        }
    }

    /// Takes flow `i` out of the backlog (its ring entry goes when it comes round).
    fn unqueue(&mut self, i: usize) {
        let f = &mut self.flows[i];
        if !f.queued {
            return;
        }
        f.queued = false;
        let (leaf, port) = (f.leaf, f.port);
        if let Some(ring) = self.nodes[leaf].rings.iter_mut().find(|r| r.port == port) {
            ring.queued -= 1;
        }
        let mut at = Some(leaf);
        while let Some(n) = at {
            let node = &mut self.nodes[n];
            if let Some((_, count)) = node.active.iter_mut().find(|(p, _)| *p == port) {
                *count -= 1;
            }
            node.stats.backlogged -= 1;
            at = node.parent;
            self.update_minimum(n, |_| ());
        }
    }

    fn id(&self, index: usize) -> FlowId {
        FlowId {
            index: index as u32,
            generation: self.flows[index].generation,
        }
    }

    /// The slot of an open flow.
    fn index(&self, flow: FlowId) -> Option<usize> {
        let i = flow.index as usize;
        self.flows
            .get(i)
            .filter(|f| f.open && f.generation == flow.generation)
            .map(|_| i)
    }

    fn nanos(&self, now: Instant) -> Nanos {
        now.saturating_duration_since(self.epoch).as_nanos() as Nanos
    }
}

/// The turn size of leaf `n`'s flows: [`GRANT_TIME_NANOS`] at the lowest rate that caps
/// them (a maximum on the path to the root, or the flow rate), within
/// [`MIN_GRANT`]..=[`GRANT`].
fn grant_size(tree: &Tree, n: NodeIndex) -> usize {
    let spec = &tree.nodes[n].spec;
    let mut lowest = spec.flow_rate.filter(|_| spec.mode == Mode::Fixed);
    let mut at = Some(n);
    while let Some(i) = at {
        let max = tree.nodes[i].spec.max_rate;
        lowest = match (lowest, max) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        at = tree.nodes[i].parent;
    }
    let bytes = lowest.map_or(GRANT as u128, |rate| {
        u128::from(rate.bytes_per_second()) * GRANT_TIME_NANOS / 1_000_000_000
    });
    (bytes as usize).clamp(MIN_GRANT, GRANT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::Rate;
    use crate::tree::ScenarioSpec;

    #[allow(clippy::disallowed_methods)] // one real instant; time is virtual from here
    fn epoch() -> Instant {
        Instant::now()
    }

    fn shaper(scenarios: Vec<ScenarioSpec>) -> (Shaper, Instant) {
        let now = epoch();
        let tree = Tree::build(Rate::mbit(100), scenarios).unwrap();
        (Shaper::new(tree, now), now)
    }

    fn leaf(name: &str) -> ScenarioSpec {
        ScenarioSpec {
            name: name.into(),
            ..ScenarioSpec::default()
        }
    }

    #[test]
    fn a_driven_port_is_served_only_when_it_asks() {
        let (mut s, now) = shaper(vec![leaf("a")]);
        let tunnel = s.add_port(PortKind::Driven);
        let other = s.add_port(PortKind::Driven);
        let direct = s.add_port(PortKind::Pumped);
        let a = s.tree().leaf("a").unwrap();
        let through_tunnel = s.open(a, tunnel);
        s.push(through_tunnel, now);
        assert_eq!(s.next(now, other), None, "another tunnel cannot serve it");
        assert_eq!(s.poll_timeout(now, other), None);
        assert_eq!(s.poll_timeout(now, tunnel), Some(now));
        let grant = s.next(now, tunnel).unwrap();
        assert_eq!((grant.flow, grant.port), (through_tunnel, tunnel));
        s.sent(grant.flow, 100, false, now);
        // A pumped port's flow is served whoever asks: the caller hands the grant on.
        // (The 100 bytes sent hold the root's 100 Mbit/s for 8 µs.)
        let relayed = s.open(a, direct);
        s.push(relayed, now);
        assert_eq!(s.next(now, other), None);
        // Due in 8 µs: asked to wait the wake-up gap, and served then.
        let later = now + WAKE_GAP;
        assert_eq!(s.poll_timeout(now, other), Some(later));
        let grant = s.next(later, other).unwrap();
        assert_eq!((grant.flow, grant.port), (relayed, direct));
    }

    #[test]
    fn closed_flows_and_removed_ports_are_forgotten() {
        let (mut s, now) = shaper(vec![leaf("a")]);
        let port = s.add_port(PortKind::Driven);
        let a = s.tree().leaf("a").unwrap();
        let first = s.open(a, port);
        s.push(first, now);
        s.close(first);
        assert_eq!(s.next(now, port), None);
        assert_eq!(s.stats(0).map(|st| (st.flows, st.backlogged)), Some((0, 0)));
        // The slot comes back under a new generation: the old id is dead.
        let second = s.open(a, port);
        assert_ne!(first, second);
        s.push(first, now);
        assert_eq!(s.stats(0).map(|st| st.backlogged), Some(0));
        s.push(second, now);
        assert_eq!(s.next(now, port).map(|g| g.flow), Some(second));
        s.remove_port(port);
        assert_eq!(s.total().flows, 0);
        assert_eq!(s.next(now, port), None);
    }

    #[test]
    fn a_reload_keeps_flows_and_ports_under_their_ids() {
        let (mut s, now) = shaper(vec![leaf("a"), leaf("b")]);
        let port = s.add_port(PortKind::Driven);
        let a = s.tree().leaf("a").unwrap();
        let b = s.tree().leaf("b").unwrap();
        let busy = s.open(a, port);
        let idle = s.open(b, port);
        let closed = s.open(b, port);
        s.close(closed);
        s.push(busy, now);
        // "a" is renamed: its flows go where `place` says (here, "c").
        let tree = Tree::build(Rate::mbit(50), vec![leaf("b"), leaf("c")]).unwrap();
        s.reconfigure(tree, now, |tree, name| {
            tree.leaf(if name == "a" { "c" } else { name }).unwrap()
        });
        assert_eq!(
            s.stats(0).map(|st| st.flows),
            Some(1),
            "b keeps its open flow"
        );
        assert_eq!(
            s.stats(1).map(|st| (st.flows, st.backlogged)),
            Some((1, 1)),
            "c took a's busy flow"
        );
        assert_eq!(s.next(now, port).map(|g| g.flow), Some(busy));
        // The closed flow's id stays dead; its slot is reused under a new generation.
        s.push(closed, now);
        let reused = s.open(s.tree().leaf("b").unwrap(), port);
        assert!(reused != closed && reused != idle && reused != busy);
    }

    #[test]
    fn a_flow_costs_64_bytes_and_a_ring_slot() {
        // The memory budget per flow in the docs (ARCHITECTURE.md): the flow's slot, plus
        // 4 bytes in its scenario's ring while it has something to send.
        assert!(
            std::mem::size_of::<Flow>() <= 64,
            "{}",
            std::mem::size_of::<Flow>()
        );
    }

    #[test]
    fn fixed_flows_each_keep_to_their_rate() {
        let fixed = ScenarioSpec {
            mode: Mode::Fixed,
            flow_rate: Some(Rate::mbit(8)), // one byte per µs
            ..leaf("f")
        };
        let (mut s, now) = shaper(vec![fixed]);
        let port = s.add_port(PortKind::Pumped);
        let f = s.tree().leaf("f").unwrap();
        let flows: Vec<FlowId> = (0..3).map(|_| s.open(f, port)).collect();
        for &flow in &flows {
            s.push(flow, now);
        }
        let mut bytes = [0u64; 3];
        let mut t = now;
        let end = now + Duration::from_millis(100);
        while t < end {
            while let Some(grant) = s.next(t, port) {
                let i = flows.iter().position(|&f| f == grant.flow).unwrap();
                bytes[i] += grant.max_bytes as u64;
                s.sent(grant.flow, grant.max_bytes, true, t);
            }
            t = s
                .poll_timeout(t, port)
                .unwrap()
                .max(t + Duration::from_nanos(1));
        }
        // 100 ms at 1 byte/µs each, give or take one turn (2 ms at 8 Mbit/s: 2,000 bytes).
        for b in bytes {
            assert!(b.abs_diff(100_000) <= 2_000, "{bytes:?}");
        }
    }
}
