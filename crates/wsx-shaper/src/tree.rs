//! The scenario tree: what operators configure, checked.
//!
//! The root is the gateway's WAN rate; every scenario hangs under it or under another
//! scenario, at most [`MAX_DEPTH`] levels down. Flows belong to leaves. [`Tree::build`]
//! refuses what could never be honoured (minimums above a maximum or above what the parent
//! is assured, a discard scenario with rates) and names the scenario and field at fault, so
//! that the configuration loader can point at the line.

use crate::rate::Rate;
use std::collections::HashMap;

/// Scenarios nest at most this deep (the root's children are level 1).
pub const MAX_DEPTH: usize = 8;
/// Scenarios in one tree, at most.
pub const MAX_SCENARIOS: usize = 4096;
/// Priorities are 0 (served first) to 7.
pub const PRIORITIES: usize = 8;

/// What a scenario does with the sessions classified into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Carried through the tunnel; the rates apply inside the tunnel's sender.
    #[default]
    Accelerate,
    /// Relayed directly, not through the tunnel; the rates apply to the sum of its flows.
    Aggregate,
    /// Relayed directly; each flow is held to the scenario's `flow_rate`.
    Fixed,
    /// Refused with a reset, and counted.
    Discard,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Accelerate => "accelerate",
            Mode::Aggregate => "aggregate",
            Mode::Fixed => "fixed",
            Mode::Discard => "discard",
        }
    }
}

/// One scenario as configured.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScenarioSpec {
    pub name: String,
    /// The parent scenario's name; `None` hangs it under the root.
    pub parent: Option<String>,
    pub mode: Mode,
    /// Assured while the scenario has something to send.
    pub min_rate: Option<Rate>,
    /// Never exceeded; unset, the parent's (ultimately the WAN rate) is the only cap.
    pub max_rate: Option<Rate>,
    /// Each flow's rate (`fixed` only).
    pub flow_rate: Option<Rate>,
    /// 0 (served first) to 7: who gets the excess above the minimums.
    pub priority: u8,
    /// Bytes the scenario may hold in the gateway before its senders are held back.
    pub buffer: Option<u64>,
    /// The DSCP (0-63) to mark what the gateway sends for this scenario.
    pub dscp: Option<u8>,
}

/// The field of a scenario an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Name,
    Parent,
    Mode,
    MinRate,
    MaxRate,
    FlowRate,
    Priority,
    Dscp,
}

impl Field {
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Name => "name",
            Field::Parent => "parent",
            Field::Mode => "mode",
            Field::MinRate => "min_rate",
            Field::MaxRate => "max_rate",
            Field::FlowRate => "flow_rate",
            Field::Priority => "priority",
            Field::Dscp => "dscp",
        }
    }
}

/// A scenario the tree cannot hold: which one (its index in the list given to
/// [`Tree::build`]), which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("scenario {index} ({field}): {reason}", field = field.as_str())]
pub struct TreeError {
    pub index: usize,
    pub field: Field,
    pub reason: String,
}

/// A node's index: 0 is the root, scenario `i` of the specification is `i + 1`.
pub(crate) type NodeIndex = usize;
pub(crate) const ROOT: NodeIndex = 0;

/// A checked tree: the root (the WAN rate) and the scenarios, parents before children.
#[derive(Debug, Clone)]
pub struct Tree {
    pub(crate) nodes: Vec<TreeNode>,
    by_name: HashMap<String, NodeIndex>,
}

#[derive(Debug, Clone)]
pub(crate) struct TreeNode {
    pub(crate) spec: ScenarioSpec,
    pub(crate) parent: Option<NodeIndex>,
    pub(crate) children: Vec<NodeIndex>,
    pub(crate) depth: usize,
}

impl Tree {
    /// Checks `scenarios` under a root of `wan_rate`.
    pub fn build(wan_rate: Rate, scenarios: Vec<ScenarioSpec>) -> Result<Tree, TreeError> {
        let error = |index, field, reason: String| TreeError {
            index,
            field,
            reason,
        };
        if scenarios.len() > MAX_SCENARIOS {
            return Err(error(
                MAX_SCENARIOS,
                Field::Name,
                format!("more than {MAX_SCENARIOS} scenarios"),
            ));
        }
        let mut by_name = HashMap::with_capacity(scenarios.len());
        for (i, spec) in scenarios.iter().enumerate() {
            if spec.name.is_empty() {
                return Err(error(i, Field::Name, "a scenario needs a name".into()));
            }
            if by_name.insert(spec.name.clone(), i + 1).is_some() {
                return Err(error(
                    i,
                    Field::Name,
                    format!("{:?} is defined twice", spec.name),
                ));
            }
            check_fields(spec).map_err(|(field, reason)| error(i, field, reason))?;
        }
        let root = TreeNode {
            spec: ScenarioSpec {
                name: String::new(),
                max_rate: Some(wan_rate),
                ..ScenarioSpec::default()
            },
            parent: None,
            children: Vec::new(),
            depth: 0,
        };
        let mut nodes = vec![root];
        for spec in &scenarios {
            let parent = match &spec.parent {
                None => ROOT,
                Some(name) => match by_name.get(name) {
                    Some(&p) => p,
                    None => {
                        let i = nodes.len() - 1;
                        return Err(error(i, Field::Parent, format!("no scenario {name:?}")));
                    }
                },
            };
            nodes.push(TreeNode {
                spec: spec.clone(),
                parent: Some(parent),
                children: Vec::new(),
                depth: 0,
            });
        }
        for i in 1..nodes.len() {
            let depth = depth(&nodes, i).map_err(|reason| error(i - 1, Field::Parent, reason))?;
            nodes[i].depth = depth;
            if let Some(p) = nodes[i].parent {
                nodes[p].children.push(i);
            }
        }
        let tree = Tree { nodes, by_name };
        tree.check_rates(error)?;
        Ok(tree)
    }

    /// The WAN rate at the root.
    pub fn wan_rate(&self) -> Rate {
        self.nodes[ROOT].spec.max_rate.unwrap_or(Rate::MAX)
    }

    /// The scenarios, in the order given.
    pub fn scenarios(&self) -> impl Iterator<Item = &ScenarioSpec> {
        self.nodes[1..].iter().map(|n| &n.spec)
    }

    /// The scenario named `name`, if it exists and is a leaf (only leaves hold flows).
    pub fn leaf(&self, name: &str) -> Result<ScenarioId, LeafError> {
        let &index = self.by_name.get(name).ok_or(LeafError::Unknown)?;
        if self.nodes[index].children.is_empty() {
            Ok(ScenarioId(index))
        } else {
            Err(LeafError::Interior)
        }
    }

    pub fn spec(&self, id: ScenarioId) -> &ScenarioSpec {
        &self.nodes[id.0].spec
    }

    /// What node `n`'s subtree is assured: its minimum, or without one, its children's
    /// added up (a parent without a minimum passes its children's on to its own parent).
    fn assured(&self, n: NodeIndex) -> u64 {
        match self.nodes[n].spec.min_rate {
            Some(min) => min.bits_per_second(),
            None => self.nodes[n]
                .children
                .iter()
                .map(|&c| self.assured(c))
                .sum(),
        }
    }

    /// Minimums that could never all be met, and maximums below a minimum.
    fn check_rates(
        &self,
        error: impl Fn(usize, Field, String) -> TreeError,
    ) -> Result<(), TreeError> {
        for (i, node) in self.nodes.iter().enumerate() {
            // A minimum above what the children may ever send together.
            let caps: Option<u64> = node
                .children
                .iter()
                .map(|&c| self.nodes[c].spec.max_rate.map(Rate::bits_per_second))
                .sum();
            if let (Some(min), Some(caps)) = (node.spec.min_rate, caps)
                && !node.children.is_empty()
                && min.bits_per_second() > caps
            {
                return Err(error(
                    i - 1,
                    Field::MinRate,
                    format!(
                        "the minimum ({min}) is above what its children may send together ({})",
                        display_bits(caps)
                    ),
                ));
            }
            let assured: u64 = node.children.iter().map(|&c| self.assured(c)).sum();
            if assured == 0 {
                continue;
            }
            let room = match (node.spec.min_rate, i) {
                (_, ROOT) => self.wan_rate(),
                (Some(min), _) => min,
                (None, _) => node.spec.max_rate.unwrap_or(Rate::MAX),
            };
            if assured > room.bits_per_second() {
                let (index, what) = if i == ROOT {
                    (0, "the WAN rate".to_owned())
                } else {
                    let which = if node.spec.min_rate.is_some() {
                        "minimum"
                    } else {
                        "maximum"
                    };
                    (i - 1, format!("its {which}"))
                };
                return Err(error(
                    index,
                    Field::MinRate,
                    format!(
                        "the minimums of {} add up to {}, above {what} ({room})",
                        if i == ROOT {
                            "the top-level scenarios".to_owned()
                        } else {
                            format!("{:?}'s children", node.spec.name)
                        },
                        display_bits(assured),
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A leaf scenario: where flows go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScenarioId(pub(crate) NodeIndex);

impl ScenarioId {
    /// The scenario's position in the list given to [`Tree::build`].
    pub fn index(self) -> usize {
        self.0 - 1
    }
}

/// Why a name is not a leaf scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LeafError {
    #[error("no such scenario")]
    Unknown,
    #[error("the scenario has children; only leaf scenarios take sessions")]
    Interior,
}

/// One scenario's fields alone.
fn check_fields(spec: &ScenarioSpec) -> Result<(), (Field, String)> {
    if usize::from(spec.priority) >= PRIORITIES {
        return Err((Field::Priority, "priorities are 0 (first) to 7".into()));
    }
    if spec.dscp.is_some_and(|d| d > 63) {
        return Err((Field::Dscp, "a DSCP is 0 to 63".into()));
    }
    if let (Some(min), Some(max)) = (spec.min_rate, spec.max_rate)
        && min > max
    {
        return Err((
            Field::MinRate,
            format!("the minimum ({min}) is above the maximum ({max})"),
        ));
    }
    match spec.mode {
        Mode::Fixed if spec.flow_rate.is_none() => Err((
            Field::FlowRate,
            "a fixed scenario needs flow_rate, the rate of each of its flows".into(),
        )),
        Mode::Fixed => Ok(()),
        _ if spec.flow_rate.is_some() => Err((
            Field::FlowRate,
            "flow_rate applies to fixed scenarios only".into(),
        )),
        Mode::Discard if spec.min_rate.is_some() || spec.max_rate.is_some() => Err((
            Field::Mode,
            "a discard scenario refuses its sessions and takes no rates".into(),
        )),
        _ => Ok(()),
    }
}

/// The depth of node `i`, or why its parents do not lead to the root.
fn depth(nodes: &[TreeNode], i: NodeIndex) -> Result<usize, String> {
    let mut depth = 0;
    let mut at = i;
    while let Some(parent) = nodes[at].parent {
        depth += 1;
        if depth > MAX_DEPTH {
            // Either a cycle or a chain too deep; say which.
            let mut seen = vec![false; nodes.len()];
            let mut at = i;
            while let Some(p) = nodes[at].parent {
                if seen[p] {
                    return Err("its parents form a cycle".into());
                }
                seen[p] = true;
                at = p;
            }
            return Err(format!("scenarios nest at most {MAX_DEPTH} levels deep"));
        }
        if nodes[parent].spec.mode == Mode::Discard && parent != ROOT {
            return Err(format!(
                "its parent {:?} discards; a discard scenario has no children",
                nodes[parent].spec.name
            ));
        }
        at = parent;
    }
    Ok(depth)
}

fn display_bits(bits: u64) -> String {
    Rate::from_bits_per_second(bits).map_or_else(|| format!("{bits} bit/s"), |r| r.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn scenario(name: &str, parent: Option<&str>) -> ScenarioSpec {
        ScenarioSpec {
            name: name.into(),
            parent: parent.map(Into::into),
            ..ScenarioSpec::default()
        }
    }

    fn build(scenarios: Vec<ScenarioSpec>) -> Result<Tree, TreeError> {
        Tree::build(Rate::mbit(100), scenarios)
    }

    #[test]
    fn a_tree_knows_its_leaves() {
        let tree = build(vec![
            scenario("office", None),
            scenario("web", Some("office")),
            scenario("backup", None),
        ])
        .unwrap();
        assert_eq!(tree.leaf("web").map(ScenarioId::index), Ok(1));
        assert_eq!(tree.leaf("backup").map(ScenarioId::index), Ok(2));
        assert_eq!(tree.leaf("office"), Err(LeafError::Interior));
        assert_eq!(tree.leaf("nothing"), Err(LeafError::Unknown));
        assert_eq!(tree.nodes[2].depth, 2);
    }

    #[test]
    fn each_mistake_names_its_scenario_and_field() {
        let at = |e: TreeError| (e.index, e.field);
        let fixed_without_rate = ScenarioSpec {
            mode: Mode::Fixed,
            ..scenario("f", None)
        };
        let cases: Vec<(Vec<ScenarioSpec>, (usize, Field))> = vec![
            (
                vec![scenario("a", None), scenario("a", None)],
                (1, Field::Name),
            ),
            (vec![scenario("", None)], (0, Field::Name)),
            (vec![scenario("a", Some("b"))], (0, Field::Parent)),
            (
                vec![scenario("a", Some("b")), scenario("b", Some("a"))],
                (0, Field::Parent),
            ),
            (
                vec![ScenarioSpec {
                    priority: 8,
                    ..scenario("a", None)
                }],
                (0, Field::Priority),
            ),
            (
                vec![ScenarioSpec {
                    dscp: Some(64),
                    ..scenario("a", None)
                }],
                (0, Field::Dscp),
            ),
            (
                vec![ScenarioSpec {
                    min_rate: Some(Rate::mbit(20)),
                    max_rate: Some(Rate::mbit(10)),
                    ..scenario("a", None)
                }],
                (0, Field::MinRate),
            ),
            (vec![fixed_without_rate], (0, Field::FlowRate)),
            (
                vec![ScenarioSpec {
                    flow_rate: Some(Rate::mbit(1)),
                    ..scenario("a", None)
                }],
                (0, Field::FlowRate),
            ),
            (
                vec![ScenarioSpec {
                    mode: Mode::Discard,
                    max_rate: Some(Rate::mbit(1)),
                    ..scenario("a", None)
                }],
                (0, Field::Mode),
            ),
            (
                vec![
                    ScenarioSpec {
                        mode: Mode::Discard,
                        ..scenario("a", None)
                    },
                    scenario("b", Some("a")),
                ],
                (1, Field::Parent),
            ),
        ];
        for (scenarios, expected) in cases {
            let result = build(scenarios.clone());
            assert_eq!(
                result.map(|_| ()).map_err(at),
                Err(expected),
                "{scenarios:?}"
            );
        }
    }

    #[test]
    fn minimums_must_fit_what_their_parent_is_assured() {
        let with_min = |name: &str, parent: Option<&str>, min: u64| ScenarioSpec {
            min_rate: Some(Rate::mbit(min)),
            ..scenario(name, parent)
        };
        // The top level must fit the WAN rate.
        let e = build(vec![with_min("a", None, 60), with_min("b", None, 50)]).unwrap_err();
        assert_eq!((e.index, e.field), (0, Field::MinRate));
        assert!(e.reason.contains("110 Mbit/s"), "{e}");
        // Children must fit their parent's minimum.
        let e = build(vec![
            with_min("p", None, 20),
            with_min("x", Some("p"), 15),
            with_min("y", Some("p"), 10),
        ])
        .unwrap_err();
        assert_eq!((e.index, e.field), (0, Field::MinRate));
        // A minimum its children's maximums could never carry.
        let e = build(vec![
            with_min("p", None, 20),
            ScenarioSpec {
                max_rate: Some(Rate::mbit(15)),
                ..scenario("x", Some("p"))
            },
        ])
        .unwrap_err();
        assert_eq!((e.index, e.field), (0, Field::MinRate));
        assert!(e.reason.contains("15 Mbit/s"), "{e}");
        // A parent without a minimum passes its children's on to its own parent.
        build(vec![
            scenario("p", None),
            with_min("x", Some("p"), 50),
            with_min("y", Some("p"), 50),
        ])
        .unwrap();
        let e = build(vec![
            ScenarioSpec {
                max_rate: Some(Rate::mbit(5)),
                ..scenario("p", None)
            },
            scenario("q", Some("p")),
            with_min("x", Some("q"), 6),
        ])
        .unwrap_err();
        assert_eq!((e.index, e.field), (0, Field::MinRate), "{e}");
    }

    #[test]
    fn depth_is_limited_to_eight() {
        let mut chain = vec![scenario("0", None)];
        for i in 1..MAX_DEPTH {
            chain.push(scenario(&i.to_string(), Some(&(i - 1).to_string())));
        }
        build(chain.clone()).unwrap();
        chain.push(scenario("8", Some("7")));
        let e = build(chain).unwrap_err();
        assert_eq!((e.index, e.field), (MAX_DEPTH, Field::Parent));
        assert!(e.reason.contains("at most 8"), "{e}");
    }
}
