//! The bandwidth controller's part of the file: `[shaper]`, `[[scenario]]`,
//! `[[address_list]]` and `[[filter]]`, read into a [`ShapingConfig`] whose mistakes are
//! reported at the field they are about.
//!
//! ```toml
//! [shaper]
//! wan_rate = "100 Mbit/s"            # what the scenarios divide, for what this gateway sends
//!
//! [[scenario]]
//! name = "smb"
//! parent = "office"                  # optional; at most 8 levels
//! mode = "accelerate"                # accelerate | aggregate | fixed | discard
//! min_rate = "30 Mbit/s"             # assured while busy
//! max_rate = "60 Mbit/s"             # never exceeded
//! priority = 2                       # 0 (first) to 7, for the excess above the minimums
//! dscp = 26                          # marks what this gateway sends for it
//!
//! [[address_list]]
//! name = "branches"
//! prefixes = ["10.1.0.0/16", "fd00:1::/48"]
//!
//! [[filter]]                         # first match wins; unmatched sessions go to "default"
//! scenario = "smb"
//! source_list = ["branches"]
//! destination_port = [445, "8000-8080"]
//! ```

use super::Loaded;
use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use toml::Spanned;
use wsx_proxy::{ShapingConfig, ShapingError};
use wsx_shaper::{
    AddressList as ListSpec, FilterField, FilterSpec, Mode as CoreMode, PortRange, Rate,
    ScenarioSpec,
};

/// `[shaper]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Shaper {
    /// What the scenarios divide: the rate this gateway may send toward the WAN.
    pub(crate) wan_rate: RateText,
}

/// `[[scenario]]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Scenario {
    pub(crate) name: Spanned<String>,
    pub(crate) parent: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) mode: Mode,
    pub(crate) min_rate: Option<Spanned<RateText>>,
    pub(crate) max_rate: Option<Spanned<RateText>>,
    /// Each flow's rate, in fixed scenarios.
    pub(crate) flow_rate: Option<Spanned<RateText>>,
    pub(crate) priority: Option<Spanned<u8>>,
    /// KiB the scenario's sessions may hold in the gateway.
    pub(crate) buffer_kib: Option<u64>,
    pub(crate) dscp: Option<Spanned<u8>>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    #[default]
    Accelerate,
    Aggregate,
    Fixed,
    Discard,
}

/// `[[address_list]]`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddressList {
    pub(crate) name: Spanned<String>,
    #[serde(default)]
    pub(crate) prefixes: Vec<IpNet>,
}

/// `[[filter]]`: every field given must match; within a field, any entry.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Filter {
    pub(crate) scenario: Spanned<String>,
    #[serde(default)]
    pub(crate) source: Vec<IpNet>,
    pub(crate) source_list: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(crate) destination: Vec<IpNet>,
    pub(crate) destination_list: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(crate) source_port: Vec<Port>,
    #[serde(default)]
    pub(crate) destination_port: Vec<Port>,
    pub(crate) dscp: Option<Spanned<Vec<u8>>>,
    /// Ingress interfaces (of sessions a client opened here, not of those from the tunnel).
    #[serde(default)]
    pub(crate) interface: Vec<String>,
    /// Peer gateways the session goes to or came from.
    #[serde(default)]
    pub(crate) peer: Vec<String>,
}

/// A rate as written: `"20 Mbit/s"`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateText(pub(crate) Rate);

impl<'de> Deserialize<'de> for RateText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map(RateText).map_err(serde::de::Error::custom)
    }
}

impl Serialize for RateText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

/// A port (`445`) or a range (`"8000-8080"`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Port(PortRange);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Port;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port (445) or a range (\"8000-8080\")")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Port, E> {
                let port = u16::try_from(v)
                    .map_err(|_| E::custom(format!("{v} is not a port (0-65535)")))?;
                Ok(Port(PortRange {
                    first: port,
                    last: port,
                }))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Port, E> {
                v.parse().map(Port).map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl Serialize for Port {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let PortRange { first, last } = self.0;
        if first == last {
            s.serialize_u16(first)
        } else {
            s.collect_str(&format_args!("{first}-{last}"))
        }
    }
}

impl Loaded {
    /// The bandwidth controller, if the file has a `[shaper]` table, checked.
    pub(crate) fn shaping(&self) -> anyhow::Result<Option<ShapingConfig>> {
        let c = &self.config;
        let Some(shaper) = &c.shaper else {
            if let Some(s) = c.scenarios.first() {
                return Err(self.error(
                    Some(s.name.span().start),
                    "scenario[0]",
                    "scenarios need a [shaper] table with the wan_rate they divide",
                ));
            }
            if !c.filters.is_empty() {
                return Err(self.error(
                    self.locate(&["filter", "0"]),
                    "filter[0]",
                    "filters need a [shaper] table",
                ));
            }
            return Ok(None);
        };
        let mut config = ShapingConfig::new(shaper.wan_rate.0);
        config.scenarios = c.scenarios.iter().map(scenario_spec).collect();
        config.lists = c
            .address_lists
            .iter()
            .map(|l| ListSpec {
                name: l.name.get_ref().clone(),
                prefixes: l.prefixes.clone(),
            })
            .collect();
        config.filters = c.filters.iter().map(filter_spec).collect();
        config.build().map_err(|e| self.shaping_error(&e))?;
        Ok(Some(config))
    }

    /// `e` as an error at the field it is about.
    fn shaping_error(&self, e: &ShapingError) -> anyhow::Error {
        let c = &self.config;
        match e {
            ShapingError::Tree(e) => {
                let Some(s) = c.scenarios.get(e.index) else {
                    // About the tree as a whole (too many scenarios): at the first one.
                    return self.error(self.locate(&["scenario", "0"]), "scenario", &e.reason);
                };
                let span = |f: Option<usize>| f.or(Some(s.name.span().start));
                let rate = |r: &Option<Spanned<RateText>>| r.as_ref().map(|r| r.span().start);
                let at = match e.field {
                    wsx_shaper::Field::Parent => span(s.parent.as_ref().map(|p| p.span().start)),
                    wsx_shaper::Field::MinRate => span(rate(&s.min_rate)),
                    wsx_shaper::Field::MaxRate => span(rate(&s.max_rate)),
                    wsx_shaper::Field::FlowRate => span(rate(&s.flow_rate)),
                    wsx_shaper::Field::Priority => {
                        span(s.priority.as_ref().map(|p| p.span().start))
                    }
                    wsx_shaper::Field::Dscp => span(s.dscp.as_ref().map(|d| d.span().start)),
                    _ => span(None),
                };
                self.error(
                    at,
                    format!("scenario[{}].{}", e.index, e.field.as_str()),
                    &e.reason,
                )
            }
            ShapingError::Filter(e) if e.field == FilterField::ListName => {
                let at = c.address_lists.get(e.index).map(|l| l.name.span().start);
                self.error(at, format!("address_list[{}].name", e.index), &e.reason)
            }
            ShapingError::Filter(e) => {
                let Some(f) = c.filters.get(e.index) else {
                    return self.error(self.locate(&["filter", "0"]), "filter", &e.reason);
                };
                let start = |s: &Option<Spanned<Vec<_>>>| s.as_ref().map(|s| s.span().start);
                let (field, at) = match e.field {
                    FilterField::SourceLists => ("source_list", start(&f.source_list)),
                    FilterField::DestinationLists => {
                        ("destination_list", start(&f.destination_list))
                    }
                    FilterField::Dscp => ("dscp", f.dscp.as_ref().map(|d| d.span().start)),
                    _ => ("scenario", None),
                };
                let at = at.unwrap_or(f.scenario.span().start);
                self.error(Some(at), format!("filter[{}].{field}", e.index), &e.reason)
            }
            ShapingError::Default { index } => {
                let at = c.scenarios.get(*index).map(|s| s.name.span().start);
                self.error(at, format!("scenario[{index}]"), e)
            }
        }
    }
}

fn scenario_spec(s: &Scenario) -> ScenarioSpec {
    let rate = |r: &Option<Spanned<RateText>>| r.as_ref().map(|r| r.get_ref().0);
    ScenarioSpec {
        name: s.name.get_ref().clone(),
        parent: s.parent.as_ref().map(|p| p.get_ref().clone()),
        mode: match s.mode {
            Mode::Accelerate => CoreMode::Accelerate,
            Mode::Aggregate => CoreMode::Aggregate,
            Mode::Fixed => CoreMode::Fixed,
            Mode::Discard => CoreMode::Discard,
        },
        min_rate: rate(&s.min_rate),
        max_rate: rate(&s.max_rate),
        flow_rate: rate(&s.flow_rate),
        priority: s.priority.as_ref().map_or(0, |p| *p.get_ref()),
        buffer: s.buffer_kib.map(|k| k.saturating_mul(1024)),
        dscp: s.dscp.as_ref().map(|d| *d.get_ref()),
    }
}

fn list<T: Clone>(field: &Option<Spanned<Vec<T>>>) -> Vec<T> {
    field
        .as_ref()
        .map(|f| f.get_ref().clone())
        .unwrap_or_default()
}

fn filter_spec(f: &Filter) -> FilterSpec {
    let ports = |p: &[Port]| p.iter().map(|p| p.0).collect();
    FilterSpec {
        scenario: f.scenario.get_ref().clone(),
        source: f.source.clone(),
        source_lists: list(&f.source_list),
        destination: f.destination.clone(),
        destination_lists: list(&f.destination_list),
        source_ports: ports(&f.source_port),
        destination_ports: ports(&f.destination_port),
        dscp: list(&f.dscp),
        interfaces: f.interface.clone(),
        peers: f.peer.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const HEAD: &str = "[tunnel]\nprivate_key = \"MHO2Y2n1HcHeNrBqO+T8gkcN1Kj8gJ1f0+Jt0sZ/u0A=\"\n";

    fn shaping(body: &str) -> anyhow::Result<Option<ShapingConfig>> {
        Loaded::parse(Path::new("wsx.toml"), format!("{HEAD}{body}"))?.shaping()
    }

    /// The error's text for `body`, which must fail.
    fn error(body: &str) -> String {
        match shaping(body) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_shaper_section_is_read() {
        let c = shaping(
            r#"
[shaper]
wan_rate = "100 Mbit/s"

[[scenario]]
name = "office"
max_rate = "80 Mbit/s"

[[scenario]]
name = "smb"
parent = "office"
min_rate = "30 Mbit/s"
priority = 2
dscp = 26

[[scenario]]
name = "backup"
mode = "fixed"
flow_rate = "2 Mbit/s"

[[address_list]]
name = "branches"
prefixes = ["10.1.0.0/16", "fd00:1::/48"]

[[filter]]
scenario = "smb"
source_list = ["branches"]
destination_port = [445, "8000-8080"]
"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.wan_rate, Rate::mbit(100));
        assert_eq!(c.scenarios.len(), 3);
        assert_eq!(c.scenarios[1].parent.as_deref(), Some("office"));
        assert_eq!(c.scenarios[1].dscp, Some(26));
        assert_eq!(c.scenarios[2].mode, CoreMode::Fixed);
        assert_eq!(
            c.filters[0].destination_ports,
            [
                PortRange {
                    first: 445,
                    last: 445
                },
                PortRange {
                    first: 8000,
                    last: 8080
                }
            ]
        );
        assert_eq!(c.lists[0].prefixes.len(), 2);
        assert!(
            shaping("").unwrap().is_none(),
            "no [shaper]: nothing shaped"
        );
    }

    #[test]
    fn every_mistake_has_its_line_column_and_field() {
        let shaper = "[shaper]\nwan_rate = \"100 Mbit/s\"\n";
        let cases = [
            // Parse errors, positioned by the TOML reader.
            (
                "[shaper]\nwan_rate = \"100 MB/s\"\n",
                "wsx.toml:4:12: shaper.wan_rate: unknown unit \"MB/s\"",
            ),
            (
                "[shaper]\nwan_rate = \"5 kbit/s\"\n",
                "wsx.toml:4:12: shaper.wan_rate: 5000 bit/s is outside",
            ),
            (
                &format!("{shaper}[[scenario]]\nname = \"a\"\nmode = \"turbo\"\n"),
                "wsx.toml:7:8: scenario[0].mode: unknown variant `turbo`",
            ),
            (
                &format!(
                    "{shaper}[[scenario]]\nname = \"a\"\n[[filter]]\nscenario = \"a\"\ndestination_port = [\"90-80\"]\n"
                ),
                "wsx.toml:9:21: filter[0].destination_port[0]: the range \"90-80\" runs backwards",
            ),
            (
                &format!(
                    "{shaper}[[scenario]]\nname = \"a\"\n[[filter]]\nscenario = \"a\"\nsource_port = [70000]\n"
                ),
                "wsx.toml:9:16: filter[0].source_port[0]: 70000 is not a port",
            ),
            // Checks across fields, positioned at the field.
            (
                &format!("{shaper}[[scenario]]\nname = \"a\"\nparent = \"b\"\n"),
                "wsx.toml:7:10: scenario[0].parent: no scenario \"b\"",
            ),
            (
                &format!(
                    "{shaper}[[scenario]]\nname = \"a\"\nmin_rate = \"20 Mbit/s\"\nmax_rate = \"10 Mbit/s\"\n"
                ),
                "wsx.toml:7:12: scenario[0].min_rate: the minimum (20 Mbit/s) is above the maximum (10 Mbit/s)",
            ),
            (
                &format!("{shaper}[[scenario]]\nname = \"a\"\npriority = 9\n"),
                "wsx.toml:7:12: scenario[0].priority: priorities are 0 (first) to 7",
            ),
            (
                &format!("{shaper}[[scenario]]\nname = \"a\"\ndscp = 64\n"),
                "wsx.toml:7:8: scenario[0].dscp: a DSCP is 0 to 63",
            ),
            (
                &format!("{shaper}[[scenario]]\nname = \"a\"\nmode = \"fixed\"\n"),
                "wsx.toml:6:8: scenario[0].flow_rate: a fixed scenario needs flow_rate",
            ),
            (
                &format!("{shaper}[[scenario]]\nname = \"default\"\nmode = \"discard\"\n"),
                "wsx.toml:6:8: scenario[0]: scenario 0 (\"default\") takes the sessions no filter matches",
            ),
            (
                &format!("{shaper}[[filter]]\nscenario = \"nothing\"\n"),
                "wsx.toml:6:12: filter[0].scenario: \"nothing\": no such scenario",
            ),
            (
                &format!(
                    "{shaper}[[scenario]]\nname = \"a\"\n[[filter]]\nscenario = \"a\"\nsource_list = [\"x\"]\n"
                ),
                "wsx.toml:9:15: filter[0].source_list: no address list \"x\"",
            ),
            (
                &format!(
                    "{shaper}[[scenario]]\nname = \"a\"\n[[filter]]\nscenario = \"a\"\ndscp = [70]\n"
                ),
                "wsx.toml:9:8: filter[0].dscp: 70 is not a DSCP",
            ),
            (
                &format!(
                    "{shaper}[[address_list]]\nname = \"l\"\n[[address_list]]\nname = \"l\"\n"
                ),
                "wsx.toml:8:8: address_list[1].name: the address list \"l\" is defined twice",
            ),
            (
                "[[scenario]]\nname = \"a\"\n",
                "wsx.toml:4:8: scenario[0]: scenarios need a [shaper] table",
            ),
        ];
        for (body, expected) in cases {
            let e = error(body);
            assert!(
                e.starts_with(expected),
                "{body}\n  got: {e}\n want: {expected}"
            );
        }
    }
}
