//! What an emulated link does to the packets crossing it, in one direction.

use serde::{Deserialize, Serialize};

/// The impairments of one direction of the emulated WAN link.
///
/// Rates and queue sizes count **IP packet bytes** (the Ethernet frame minus its 14-byte header),
/// the way WAN circuits are sold: a 100 Mbit/s link carries 100 Mbit/s of IP packets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkParams {
    /// One-way propagation delay in microseconds.
    pub delay_us: u64,
    /// Jitter: each packet's delay varies uniformly in `delay ± jitter`. Packets keep their order
    /// (a packet never leaves before the one ahead of it) unless `reorder_pct` says otherwise.
    pub jitter_us: u64,
    /// Independent random loss, percent of packets.
    pub loss_pct: f64,
    /// Gilbert-Elliott burst loss, applied on top of `loss_pct`.
    pub burst: Option<GilbertElliott>,
    /// Bottleneck rate in kbit/s of IP bytes; 0 means no bottleneck.
    pub rate_kbit: u64,
    /// The bottleneck's drop-tail queue. Ignored without a bottleneck.
    pub queue: QueueLimit,
    /// Percent of packets held back by an extra `reorder_delay_us`, so later packets overtake them.
    pub reorder_pct: f64,
    /// How long a reordered packet is held back, in microseconds.
    pub reorder_delay_us: u64,
    /// Percent of packets delivered twice.
    pub duplicate_pct: f64,
    /// The path's MTU: the largest IP packet carried, bytes. A longer one is dropped, as a
    /// router on the way with a smaller MTU drops a packet with don't-fragment set when its
    /// ICMP error never arrives (a black hole). 0: no limit but the interfaces' own (1500).
    pub mtu: u64,
}

impl LinkParams {
    /// A link with this one-way delay and nothing else.
    pub fn with_delay_ms(delay_ms: f64) -> Self {
        Self {
            delay_us: (delay_ms * 1000.0).round() as u64,
            ..Self::default()
        }
    }

    /// Checks that every percentage is within 0-100 and that burst parameters are sane.
    pub fn validate(&self) -> Result<(), String> {
        let pct = |name: &str, v: f64| {
            if (0.0..=100.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be within 0-100 %, got {v}"))
            }
        };
        pct("loss_pct", self.loss_pct)?;
        pct("reorder_pct", self.reorder_pct)?;
        pct("duplicate_pct", self.duplicate_pct)?;
        if let Some(ge) = &self.burst {
            pct("burst.p_pct", ge.p_pct)?;
            pct("burst.r_pct", ge.r_pct)?;
            pct("burst.loss_good_pct", ge.loss_good_pct)?;
            pct("burst.loss_bad_pct", ge.loss_bad_pct)?;
        }
        if self.reorder_pct > 0.0 && self.reorder_delay_us == 0 {
            return Err("reorder_pct needs a reorder_delay_us above zero".into());
        }
        Ok(())
    }
}

/// The Gilbert-Elliott two-state loss model: a Good and a Bad state, each with its own loss
/// probability, and per-packet transition probabilities between them. The mean burst length in
/// the Bad state is `100 / r_pct` packets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GilbertElliott {
    /// Probability, per packet, of moving from Good to Bad (percent).
    pub p_pct: f64,
    /// Probability, per packet, of moving from Bad back to Good (percent).
    pub r_pct: f64,
    /// Loss probability in the Good state (percent), usually 0.
    #[serde(default)]
    pub loss_good_pct: f64,
    /// Loss probability in the Bad state (percent), usually 100.
    #[serde(default = "hundred")]
    pub loss_bad_pct: f64,
}

fn hundred() -> f64 {
    100.0
}

/// The size of the bottleneck's drop-tail queue: a packet that would not fit entirely is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueLimit {
    /// At most this many bytes (IP bytes) waiting, the packet being serialised included.
    Bytes(u64),
    /// At most this much queueing delay at the configured rate, in milliseconds.
    Ms(f64),
}

impl Default for QueueLimit {
    /// 100 ms of queue: about one bandwidth-delay product for the RTTs the lab runs by default.
    fn default() -> Self {
        QueueLimit::Ms(100.0)
    }
}

impl QueueLimit {
    /// The limit in bytes at `rate_kbit`.
    pub fn bytes(self, rate_kbit: u64) -> u64 {
        match self {
            QueueLimit::Bytes(b) => b,
            QueueLimit::Ms(ms) => (ms * rate_kbit as f64 / 8.0).round() as u64,
        }
    }
}
