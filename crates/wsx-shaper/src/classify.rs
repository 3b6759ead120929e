//! Filters: which scenario a new session belongs to.
//!
//! A [`FilterSpec`] matches on source and destination addresses (prefixes, or named
//! [`AddressList`]s), ports and port ranges, the DSCP the session arrived with, the interface
//! it arrived on, and the peer gateway it goes to; an empty field matches anything. Filters
//! are tried in order and the first that matches names the scenario; a session no filter
//! matches is not shaped. A field that names only empty address lists matches nothing (an
//! emptied list switches its filters off rather than widening them to everything).
//! IPv4-mapped IPv6 addresses (how a dual-stack socket sees an IPv4 peer) match as IPv4.
//!
//! # Index
//!
//! Trying 40,000 filters in order for every new session would cost a millisecond; instead
//! each filter is indexed by the first field it constrains, of destination address, source
//! address and destination port:
//!
//! - addresses: every prefix of every address set used as a key, in one hash map per prefix
//!   length; a lookup tries each length present (at most 33 for IPv4, 129 for IPv6), so its
//!   cost does not grow with the number of filters or prefixes. Each set lists, in order,
//!   the filters keyed by it.
//! - ports: the port range boundaries cut 0-65535 into intervals, found by binary search,
//!   each listing its filters in order.
//! - filters constraining none of those are tried in order.
//!
//! A candidate is then checked on all its fields (set membership by binary search over the
//! set's merged ranges), and no candidate after the best match so far is looked at. The cost
//! is the lookups plus the candidates that share a key with the session but fail on another
//! field; it does not depend on how many filters there are.

use crate::tree::{ScenarioId, Tree};
use ipnet::IpNet;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// A named list of prefixes that filters refer to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddressList {
    pub name: String,
    pub prefixes: Vec<IpNet>,
}

/// Ports `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    fn contains(self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

impl FromStr for PortRange {
    type Err = String;

    /// `"443"` or `"8000-8080"`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let port = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| format!("{s:?} is not a port (0-65535)"))
        };
        let (first, last) = match text.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => (port(text)?, port(text)?),
        };
        if first > last {
            return Err(format!("the range {text:?} runs backwards"));
        }
        Ok(PortRange { first, last })
    }
}

/// One filter as configured. Within a field the entries are alternatives (any matches);
/// across fields all must match.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilterSpec {
    /// The leaf scenario of the sessions it matches.
    pub scenario: String,
    pub source: Vec<IpNet>,
    /// Names of address lists, alternatives to `source`'s prefixes.
    pub source_lists: Vec<String>,
    pub destination: Vec<IpNet>,
    pub destination_lists: Vec<String>,
    pub source_ports: Vec<PortRange>,
    pub destination_ports: Vec<PortRange>,
    /// DSCP values (0-63).
    pub dscp: Vec<u8>,
    /// Ingress interface names.
    pub interfaces: Vec<String>,
    /// Peer gateway names.
    pub peers: Vec<String>,
}

impl std::fmt::Display for FilterSpec {
    /// The fields given, as `key=a,b` pairs (`any` for a filter that matches everything).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn join<T: std::fmt::Display>(items: &[T]) -> String {
            items
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        }
        let fields = [
            ("source", join(&self.source)),
            ("source_list", join(&self.source_lists)),
            ("destination", join(&self.destination)),
            ("destination_list", join(&self.destination_lists)),
            ("source_port", join(&self.source_ports)),
            ("destination_port", join(&self.destination_ports)),
            ("dscp", join(&self.dscp)),
            ("interface", join(&self.interfaces)),
            ("peer", join(&self.peers)),
        ];
        let given: Vec<String> = fields
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if given.is_empty() {
            f.write_str("any")
        } else {
            f.write_str(&given.join(" "))
        }
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// The field of a filter an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterField {
    Scenario,
    SourceLists,
    DestinationLists,
    Dscp,
    /// An address list's name (the index is the list's).
    ListName,
}

impl FilterField {
    pub fn as_str(self) -> &'static str {
        match self {
            FilterField::Scenario => "scenario",
            FilterField::SourceLists => "source_lists",
            FilterField::DestinationLists => "destination_lists",
            FilterField::Dscp => "dscp",
            FilterField::ListName => "name",
        }
    }
}

/// A filter (or, for [`FilterField::ListName`], an address list) that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter {index} ({field}): {reason}", field = field.as_str())]
pub struct FilterError {
    pub index: usize,
    pub field: FilterField,
    pub reason: String,
}

/// What is known of a new session when it is classified.
#[derive(Debug, Clone, Copy)]
pub struct SessionKey<'a> {
    pub source: SocketAddr,
    pub destination: SocketAddr,
    /// The DSCP it arrived with, if the gateway could read it.
    pub dscp: Option<u8>,
    /// The interface it arrived on, if known.
    pub interface: Option<&'a str>,
    /// The peer gateway it goes to (or came from), if any.
    pub peer: Option<&'a str>,
}

/// Which arrival fields of a session the filters read ([`Classifier::reads`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Arrival {
    pub dscp: bool,
    pub interface: bool,
}

/// The first filter that matched, and its scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    pub filter: usize,
    pub scenario: ScenarioId,
}

/// The filters, compiled; see the module documentation.
#[derive(Debug, Default)]
pub struct Classifier {
    filters: Vec<Filter>,
    sets: Vec<AddressSet>,
    by_destination: PrefixIndex,
    by_source: PrefixIndex,
    by_port: PortIndex,
    /// Filters keyed by none of the above, in order.
    unkeyed: Vec<u32>,
    /// Interface and peer names, interned.
    names: HashMap<String, u32>,
    reads: Arrival,
}

#[derive(Debug)]
struct Filter {
    scenario: ScenarioId,
    source: Option<usize>,
    destination: Option<usize>,
    source_ports: Vec<PortRange>,
    destination_ports: Vec<PortRange>,
    /// Bit `d` set: DSCP `d` matches; 0 means any.
    dscp: u64,
    interfaces: Vec<u32>,
    peers: Vec<u32>,
}

/// A set of addresses as merged, sorted ranges per family.
#[derive(Debug, Default)]
struct AddressSet {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
    /// The prefixes as given, for the index.
    prefixes: Vec<IpNet>,
    /// Filters keyed by this set, in order.
    keyed: Vec<u32>,
}

/// Prefix → the address sets containing it, one map per prefix length and family.
#[derive(Debug, Default)]
struct PrefixIndex {
    v4: Vec<(u8, HashMap<u32, Vec<u32>>)>,
    v6: Vec<(u8, HashMap<u128, Vec<u32>>)>,
}

/// Destination-port intervals → filters keyed by them.
#[derive(Debug, Default)]
struct PortIndex {
    /// Interval `i` starts at `starts[i]` and runs to the next start.
    starts: Vec<u16>,
    filters: Vec<Vec<u32>>,
}

impl Classifier {
    /// Compiles `filters` over `lists` for `tree`'s scenarios.
    pub fn build(
        tree: &Tree,
        lists: &[AddressList],
        filters: &[FilterSpec],
    ) -> Result<Classifier, FilterError> {
        let mut this = Classifier::default();
        let mut named: HashMap<&str, usize> = HashMap::with_capacity(lists.len());
        for (i, list) in lists.iter().enumerate() {
            if named.insert(list.name.as_str(), this.sets.len()).is_some() {
                return Err(FilterError {
                    index: i,
                    field: FilterField::ListName,
                    reason: format!("the address list {:?} is defined twice", list.name),
                });
            }
            this.sets.push(AddressSet::new(list.prefixes.clone()));
        }
        for (i, spec) in filters.iter().enumerate() {
            let filter = this.compile(tree, &named, lists, i, spec)?;
            this.reads.dscp |= filter.dscp != 0;
            this.reads.interface |= !filter.interfaces.is_empty();
            this.filters.push(filter);
        }
        this.index();
        Ok(this)
    }

    /// The first filter matching `key`.
    pub fn classify(&self, key: &SessionKey<'_>) -> Option<Match> {
        let interface = key.interface.and_then(|n| self.names.get(n).copied());
        let peer = key.peer.and_then(|n| self.names.get(n).copied());
        let mut best = u32::MAX;
        let consider = |candidates: &[u32], best: &mut u32| {
            for &f in candidates {
                if f >= *best {
                    break;
                }
                if self.matches(f, key, interface, peer) {
                    *best = f;
                    break;
                }
            }
        };
        for set in self.by_destination.lookup(key.destination.ip()) {
            consider(&self.sets[set as usize].keyed, &mut best);
        }
        for set in self.by_source.lookup(key.source.ip()) {
            consider(&self.sets[set as usize].keyed, &mut best);
        }
        consider(self.by_port.lookup(key.destination.port()), &mut best);
        consider(&self.unkeyed, &mut best);
        let filter = self.filters.get(best as usize)?;
        Some(Match {
            filter: best as usize,
            scenario: filter.scenario,
        })
    }

    /// What of a session's arrival some filter looks at: the gateway reads the DSCP and the
    /// ingress interface of a session only when they can change its class.
    pub fn reads(&self) -> Arrival {
        self.reads
    }

    pub fn len(&self) -> usize {
        self.filters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    fn compile(
        &mut self,
        tree: &Tree,
        named: &HashMap<&str, usize>,
        lists: &[AddressList],
        index: usize,
        spec: &FilterSpec,
    ) -> Result<Filter, FilterError> {
        let error = |field, reason: String| FilterError {
            index,
            field,
            reason,
        };
        let scenario = tree
            .leaf(&spec.scenario)
            .map_err(|e| error(FilterField::Scenario, format!("{:?}: {e}", spec.scenario)))?;
        let mut set = |prefixes: &[IpNet], names: &[String], field| {
            self.address_set(named, lists, prefixes, names)
                .map_err(|name| error(field, format!("no address list {name:?}")))
        };
        let source = set(&spec.source, &spec.source_lists, FilterField::SourceLists)?;
        let destination = set(
            &spec.destination,
            &spec.destination_lists,
            FilterField::DestinationLists,
        )?;
        let mut dscp = 0u64;
        for &d in &spec.dscp {
            if d > 63 {
                return Err(error(
                    FilterField::Dscp,
                    format!("{d} is not a DSCP (0-63)"),
                ));
            }
            dscp |= 1 << d;
        }
        let interfaces = spec.interfaces.iter().map(|n| self.intern(n)).collect();
        let peers = spec.peers.iter().map(|n| self.intern(n)).collect();
        Ok(Filter {
            scenario,
            source,
            destination,
            source_ports: spec.source_ports.clone(),
            destination_ports: spec.destination_ports.clone(),
            dscp,
            interfaces,
            peers,
        })
    }

    /// The set of `prefixes` and the lists `names`: a named list alone is used as it is,
    /// anything else becomes a set of its own. `Err` names an unknown list.
    fn address_set(
        &mut self,
        named: &HashMap<&str, usize>,
        lists: &[AddressList],
        prefixes: &[IpNet],
        names: &[String],
    ) -> Result<Option<usize>, String> {
        let mut ids = Vec::with_capacity(names.len());
        for name in names {
            ids.push(*named.get(name.as_str()).ok_or_else(|| name.clone())?);
        }
        match (prefixes.is_empty(), ids.as_slice()) {
            (true, []) => Ok(None),
            (true, &[id]) => Ok(Some(id)),
            _ => {
                let mut all = prefixes.to_vec();
                for &id in &ids {
                    all.extend_from_slice(&lists[id].prefixes);
                }
                self.sets.push(AddressSet::new(all));
                Ok(Some(self.sets.len() - 1))
            }
        }
    }

    fn intern(&mut self, name: &str) -> u32 {
        let next = self.names.len() as u32;
        *self.names.entry(name.to_owned()).or_insert(next)
    }

    /// Keys every filter by its first constrained field of destination, source, port.
    fn index(&mut self) {
        let mut keyed_by_port = Vec::new();
        for (f, filter) in self.filters.iter().enumerate() {
            let f = f as u32;
            if let Some(set) = filter.destination {
                self.sets[set].keyed.push(f);
            } else if let Some(set) = filter.source {
                self.sets[set].keyed.push(f);
            } else if !filter.destination_ports.is_empty() {
                keyed_by_port.push(f);
            } else {
                self.unkeyed.push(f);
            }
        }
        for (set_id, set) in self.sets.iter().enumerate() {
            if set.keyed.is_empty() {
                continue;
            }
            // Index the set under each direction some filter keys by it; a candidate found
            // the other way is still checked on every field.
            let as_destination = set
                .keyed
                .iter()
                .any(|&f| self.filters[f as usize].destination == Some(set_id));
            let as_source = set
                .keyed
                .iter()
                .any(|&f| self.filters[f as usize].destination != Some(set_id));
            for prefix in &set.prefixes {
                if as_destination {
                    self.by_destination.insert(*prefix, set_id as u32);
                }
                if as_source {
                    self.by_source.insert(*prefix, set_id as u32);
                }
            }
        }
        self.by_port = PortIndex::new(&self.filters, &keyed_by_port);
    }

    /// Whether filter `f` matches on every field.
    fn matches(
        &self,
        f: u32,
        key: &SessionKey<'_>,
        interface: Option<u32>,
        peer: Option<u32>,
    ) -> bool {
        let filter = &self.filters[f as usize];
        let in_set = |set: Option<usize>, ip: IpAddr| set.is_none_or(|s| self.sets[s].contains(ip));
        let ports = |ranges: &[PortRange], port: u16| {
            ranges.is_empty() || ranges.iter().any(|r| r.contains(port))
        };
        let named = |names: &[u32], name: Option<u32>| {
            names.is_empty() || name.is_some_and(|n| names.contains(&n))
        };
        in_set(filter.destination, key.destination.ip())
            && in_set(filter.source, key.source.ip())
            && ports(&filter.destination_ports, key.destination.port())
            && ports(&filter.source_ports, key.source.port())
            && (filter.dscp == 0
                || key
                    .dscp
                    .is_some_and(|d| d < 64 && filter.dscp & (1 << d) != 0))
            && named(&filter.interfaces, interface)
            && named(&filter.peers, peer)
    }
}

impl AddressSet {
    fn new(prefixes: Vec<IpNet>) -> Self {
        let prefixes: Vec<IpNet> = prefixes.into_iter().map(|p| p.trunc()).collect();
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for prefix in &prefixes {
            match prefix {
                IpNet::V4(p) => v4.push((u32::from(p.network()), u32::from(p.broadcast()))),
                IpNet::V6(p) => v6.push((u128::from(p.network()), u128::from(p.broadcast()))),
            }
        }
        Self {
            v4: merge(v4),
            v6: merge(v6),
            prefixes,
            keyed: Vec::new(),
        }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match canonical(ip) {
            IpAddr::V4(a) => within(&self.v4, u32::from(a)),
            IpAddr::V6(a) => within(&self.v6, u128::from(a)),
        }
    }
}

impl PrefixIndex {
    fn insert(&mut self, prefix: IpNet, set: u32) {
        fn add<K: std::hash::Hash + Eq>(
            maps: &mut Vec<(u8, HashMap<K, Vec<u32>>)>,
            len: u8,
            key: K,
            set: u32,
        ) {
            let at = match maps.iter().position(|(l, _)| *l == len) {
                Some(at) => at,
                None => {
                    maps.push((len, HashMap::new()));
                    maps.len() - 1
                }
            };
            let sets = maps[at].1.entry(key).or_default();
            if sets.last() != Some(&set) {
                sets.push(set);
            }
        }
        match prefix {
            IpNet::V4(p) => add(&mut self.v4, p.prefix_len(), u32::from(p.network()), set),
            IpNet::V6(p) => add(&mut self.v6, p.prefix_len(), u128::from(p.network()), set),
        }
    }

    /// The sets with a prefix containing `ip`.
    fn lookup(&self, ip: IpAddr) -> impl Iterator<Item = u32> + '_ {
        let (v4, v6) = match canonical(ip) {
            IpAddr::V4(a) => (Some(u32::from(a)), None),
            IpAddr::V6(a) => (None, Some(u128::from(a))),
        };
        let from_v4 = v4.into_iter().flat_map(move |a| {
            self.v4.iter().filter_map(move |(len, map)| {
                let mask = u32::MAX.checked_shl(32 - u32::from(*len)).unwrap_or(0);
                map.get(&(a & mask))
            })
        });
        let from_v6 = v6.into_iter().flat_map(move |a| {
            self.v6.iter().filter_map(move |(len, map)| {
                let mask = u128::MAX.checked_shl(128 - u32::from(*len)).unwrap_or(0);
                map.get(&(a & mask))
            })
        });
        from_v4.chain(from_v6).flatten().copied()
    }
}

impl PortIndex {
    fn new(filters: &[Filter], keyed: &[u32]) -> Self {
        let mut starts: Vec<u16> = vec![0];
        for &f in keyed {
            for r in &filters[f as usize].destination_ports {
                starts.push(r.first);
                if let Some(after) = r.last.checked_add(1) {
                    starts.push(after);
                }
            }
        }
        starts.sort_unstable();
        starts.dedup();
        let mut lists = vec![Vec::new(); starts.len()];
        for &f in keyed {
            for r in &filters[f as usize].destination_ports {
                let from = starts.partition_point(|&s| s < r.first);
                let to = starts.partition_point(|&s| s <= r.last);
                for list in &mut lists[from..to] {
                    if list.last() != Some(&f) {
                        list.push(f);
                    }
                }
            }
        }
        // A filter with several ranges may have been added out of order to an interval.
        for list in &mut lists {
            list.sort_unstable();
            list.dedup();
        }
        Self {
            starts,
            filters: lists,
        }
    }

    fn lookup(&self, port: u16) -> &[u32] {
        let i = self.starts.partition_point(|&s| s <= port);
        i.checked_sub(1)
            .and_then(|i| self.filters.get(i))
            .map_or(&[], Vec::as_slice)
    }
}

/// IPv4-mapped IPv6 addresses (a dual-stack socket's view of an IPv4 peer) as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Sorted, merged (overlapping or adjacent joined) ranges.
fn merge<T: Copy + Ord + num_like::Successor>(mut ranges: Vec<(T, T)>) -> Vec<(T, T)> {
    ranges.sort_unstable();
    let mut merged: Vec<(T, T)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if last.1.successor().is_none_or(|next| start <= next) => {
                last.1 = last.1.max(end);
            }
            _ => merged.push((start, end)),
        }
    }
    merged
}

fn within<T: Copy + Ord>(ranges: &[(T, T)], x: T) -> bool {
    let i = ranges.partition_point(|&(start, _)| start <= x);
    i > 0 && x <= ranges[i - 1].1
}

mod num_like {
    /// The next value, for merging adjacent ranges.
    pub(super) trait Successor: Sized {
        fn successor(self) -> Option<Self>;
    }
    impl Successor for u32 {
        fn successor(self) -> Option<Self> {
            self.checked_add(1)
        }
    }
    impl Successor for u128 {
        fn successor(self) -> Option<Self> {
            self.checked_add(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::Rate;
    use crate::tree::ScenarioSpec;
    use proptest::prelude::*;

    fn tree(leaves: usize) -> Tree {
        let scenarios = (0..leaves)
            .map(|i| ScenarioSpec {
                name: format!("s{i}"),
                ..ScenarioSpec::default()
            })
            .collect();
        Tree::build(Rate::mbit(100), scenarios).unwrap()
    }

    fn key(source: &str, destination: &str) -> SessionKey<'static> {
        SessionKey {
            source: source.parse().unwrap(),
            destination: destination.parse().unwrap(),
            dscp: None,
            interface: None,
            peer: None,
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_first_matching_filter_wins() {
        let lists = [AddressList {
            name: "branches".into(),
            prefixes: vec![net("10.1.0.0/16"), net("10.2.0.0/16"), net("fd00:1::/32")],
        }];
        let filters = [
            FilterSpec {
                scenario: "s0".into(),
                destination: vec![net("192.0.2.10/32")],
                destination_ports: vec!["445".parse().unwrap()],
                ..FilterSpec::default()
            },
            FilterSpec {
                scenario: "s1".into(),
                source_lists: vec!["branches".into()],
                ..FilterSpec::default()
            },
            FilterSpec {
                scenario: "s2".into(),
                destination_ports: vec!["8000-8080".parse().unwrap(), "443".parse().unwrap()],
                ..FilterSpec::default()
            },
            FilterSpec {
                scenario: "s3".into(),
                dscp: vec![46],
                ..FilterSpec::default()
            },
        ];
        let c = Classifier::build(&tree(4), &lists, &filters).unwrap();
        let which = |k: SessionKey<'_>| c.classify(&k).map(|m| m.filter);
        assert_eq!(which(key("10.1.2.3:5000", "192.0.2.10:445")), Some(0));
        assert_eq!(which(key("10.1.2.3:5000", "192.0.2.10:139")), Some(1));
        assert_eq!(which(key("[fd00:1::7]:5000", "[2001:db8::1]:80")), Some(1));
        // A dual-stack socket's view of an IPv4 client is the IPv4 client.
        assert_eq!(
            which(key("[::ffff:10.2.0.1]:5000", "[2001:db8::1]:80")),
            Some(1)
        );
        assert_eq!(which(key("10.3.0.1:5000", "198.51.100.1:8080")), Some(2));
        assert_eq!(which(key("10.3.0.1:5000", "198.51.100.1:8081")), None);
        let voice = SessionKey {
            dscp: Some(46),
            ..key("10.3.0.1:5000", "198.51.100.1:5060")
        };
        assert_eq!(which(voice), Some(3));
        // Without a DSCP reading, a filter on DSCP does not match.
        assert_eq!(which(key("10.3.0.1:5000", "198.51.100.1:5060")), None);
        // The gateway reads what the filters need, and only that.
        let reads = Arrival {
            dscp: true,
            interface: false,
        };
        assert_eq!(c.reads(), reads);
        let none = Classifier::build(&tree(4), &lists, &filters[..3]).unwrap();
        assert_eq!(none.reads(), Arrival::default());
    }

    #[test]
    fn mistakes_name_the_filter_and_field() {
        let t = tree(1);
        let ok = FilterSpec {
            scenario: "s0".into(),
            ..FilterSpec::default()
        };
        assert_eq!(
            Classifier::build(&t, &[], &[ok.clone(), ok.clone()]).map(|c| c.len()),
            Ok(2)
        );
        let e = Classifier::build(&t, &[], &[FilterSpec::default()]).unwrap_err();
        assert_eq!((e.index, e.field), (0, FilterField::Scenario));
        let unknown_list = FilterSpec {
            destination_lists: vec!["nothing".into()],
            ..ok.clone()
        };
        let e = Classifier::build(&t, &[], &[ok.clone(), unknown_list]).unwrap_err();
        assert_eq!((e.index, e.field), (1, FilterField::DestinationLists));
        let dscp = FilterSpec {
            dscp: vec![64],
            ..ok.clone()
        };
        let e = Classifier::build(&t, &[], &[ok.clone(), dscp]).unwrap_err();
        assert_eq!((e.index, e.field), (1, FilterField::Dscp));
        let twice = [AddressList::default(), AddressList::default()];
        let e = Classifier::build(&t, &twice, &[ok]).unwrap_err();
        assert_eq!((e.index, e.field), (1, FilterField::ListName));
        assert_eq!(
            "9-8".parse::<PortRange>().map(|_| ()),
            Err("the range \"9-8\" runs backwards".into())
        );
    }

    /// Addresses and ports from small pools, so that filters and sessions often meet.
    fn address() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            (0u32..4, 0u32..4, 0u32..4)
                .prop_map(|(a, b, c)| IpAddr::from([10, a as u8, b as u8, c as u8])),
            (0u16..4, 0u16..4).prop_map(|(a, b)| IpAddr::from([0xfd00, a, 0, 0, 0, 0, 0, b])),
        ]
    }

    fn prefix() -> impl Strategy<Value = IpNet> {
        (address(), 0u8..=129).prop_map(|(ip, len)| {
            let len = match ip {
                IpAddr::V4(_) => [0, 8, 16, 24, 30, 32][usize::from(len) % 6],
                IpAddr::V6(_) => [0, 16, 64, 126, 128][usize::from(len) % 5],
            };
            IpNet::new(ip, len).unwrap().trunc()
        })
    }

    fn ports() -> impl Strategy<Value = Vec<PortRange>> {
        prop::collection::vec(
            (0u16..6, 0u16..3).prop_map(|(a, w)| PortRange {
                first: a,
                last: a + w,
            }),
            0..3,
        )
    }

    fn filter(lists: usize) -> impl Strategy<Value = FilterSpec> {
        let names = move |n: Vec<prop::sample::Index>| -> Vec<String> {
            if lists == 0 {
                Vec::new()
            } else {
                n.iter().map(|i| format!("l{}", i.index(lists))).collect()
            }
        };
        (
            0usize..3,
            prop::collection::vec(prefix(), 0..3),
            prop::collection::vec(any::<prop::sample::Index>(), 0..2),
            prop::collection::vec(prefix(), 0..3),
            prop::collection::vec(any::<prop::sample::Index>(), 0..2),
            ports(),
            ports(),
            prop::collection::vec(0u8..4, 0..2),
            prop::collection::vec(0usize..3, 0..2),
        )
            .prop_map(
                move |(s, src, srcl, dst, dstl, sp, dp, dscp, ifs)| FilterSpec {
                    scenario: format!("s{s}"),
                    source: src,
                    source_lists: names(srcl),
                    destination: dst,
                    destination_lists: names(dstl),
                    source_ports: sp,
                    destination_ports: dp,
                    dscp,
                    interfaces: ifs.iter().map(|i| format!("eth{i}")).collect(),
                    peers: Vec::new(),
                },
            )
    }

    /// The specification, read literally: each filter in order, every field.
    fn first_match(
        lists: &[AddressList],
        filters: &[FilterSpec],
        k: &SessionKey<'_>,
    ) -> Option<usize> {
        let set_has = |prefixes: &[IpNet], names: &[String], ip: IpAddr| {
            let ip = canonical(ip);
            let mut all = prefixes.to_vec();
            for n in names {
                all.extend(lists.iter().find(|l| &l.name == n).unwrap().prefixes.iter());
            }
            // A field naming only empty lists matches nothing, not anything.
            (prefixes.is_empty() && names.is_empty()) || all.iter().any(|p| p.contains(&ip))
        };
        let port_ok = |r: &[PortRange], p: u16| r.is_empty() || r.iter().any(|r| r.contains(p));
        filters.iter().position(|f| {
            set_has(&f.source, &f.source_lists, k.source.ip())
                && set_has(&f.destination, &f.destination_lists, k.destination.ip())
                && port_ok(&f.source_ports, k.source.port())
                && port_ok(&f.destination_ports, k.destination.port())
                && (f.dscp.is_empty() || k.dscp.is_some_and(|d| f.dscp.contains(&d)))
                && (f.interfaces.is_empty()
                    || k.interface
                        .is_some_and(|i| f.interfaces.iter().any(|n| n == i)))
        })
    }

    proptest! {
        #[test]
        fn the_index_finds_what_trying_every_filter_in_order_finds(
            lists in prop::collection::vec(prop::collection::vec(prefix(), 0..4), 0..3),
            filters in prop::collection::vec(filter(3), 0..24),
            sessions in prop::collection::vec(
                (address(), 0u16..8, address(), 0u16..8, prop::option::of(0u8..4), prop::option::of(0usize..3)),
                1..32,
            ),
        ) {
            let lists: Vec<AddressList> = lists
                .into_iter()
                .enumerate()
                .map(|(i, prefixes)| AddressList { name: format!("l{i}"), prefixes })
                .collect();
            let filters: Vec<FilterSpec> = filters
                .into_iter()
                .map(|mut f| {
                    let known = |n: &String| lists.iter().any(|l| &l.name == n);
                    f.source_lists.retain(known);
                    f.destination_lists.retain(known);
                    f
                })
                .collect();
            let c = Classifier::build(&tree(3), &lists, &filters).unwrap();
            for (src, sp, dst, dp, dscp, interface) in sessions {
                let interface = interface.map(|i| format!("eth{i}"));
                let k = SessionKey {
                    source: SocketAddr::new(src, sp),
                    destination: SocketAddr::new(dst, dp),
                    dscp,
                    interface: interface.as_deref(),
                    peer: None,
                };
                prop_assert_eq!(c.classify(&k).map(|m| m.filter), first_match(&lists, &filters, &k));
            }
        }
    }
}
