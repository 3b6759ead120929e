//! A WAN described the way people talk about one (round-trip time, loss, rate), turned into the
//! emulator's per-direction parameters.

use crate::emulator::{EmulatorConfig, GilbertElliott, LinkParams, QueueLimit};
use serde::{Deserialize, Serialize};

/// Which directions `--loss` applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LossDirection {
    /// Both directions (data and acknowledgements).
    #[default]
    Both,
    /// Only client to server (the data direction of the lab's transfers).
    Forward,
}

/// A symmetric emulated WAN.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct WanSpec {
    /// Round-trip time in ms, split evenly between the directions.
    #[arg(long, default_value_t = 100.0)]
    pub rtt_ms: f64,
    /// Random (independent) loss in percent.
    #[arg(long = "loss", default_value_t = 0.0)]
    pub loss_pct: f64,
    /// Directions the loss applies to.
    #[arg(long, value_enum, default_value_t = LossDirection::Both)]
    pub loss_dir: LossDirection,
    /// Bottleneck rate in Mbit/s of IP bytes, each direction; 0 for none.
    #[arg(long, default_value_t = 100.0)]
    pub rate_mbit: f64,
    /// Drop-tail queue at the bottleneck, in ms at the rate [default: the RTT, at least 10 ms,
    /// about one bandwidth-delay product].
    #[arg(long)]
    pub queue_ms: Option<f64>,
    /// Gilbert-Elliott burst loss on top of --loss: percent chance per packet of entering the
    /// lossy state (every packet lost there), in the same directions as --loss.
    #[arg(long, requires = "burst_r_pct")]
    pub burst_p_pct: Option<f64>,
    /// Gilbert-Elliott: percent chance per packet of leaving the lossy state (mean burst
    /// length 100 / this, in packets).
    #[arg(long, requires = "burst_p_pct")]
    pub burst_r_pct: Option<f64>,
    /// Jitter in ms (uniform, order kept).
    #[arg(long, default_value_t = 0.0)]
    pub jitter_ms: f64,
    /// Seed of the emulator's random generators.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl Default for WanSpec {
    fn default() -> Self {
        Self {
            rtt_ms: 100.0,
            loss_pct: 0.0,
            loss_dir: LossDirection::Both,
            rate_mbit: 100.0,
            queue_ms: None,
            burst_p_pct: None,
            burst_r_pct: None,
            jitter_ms: 0.0,
            seed: 1,
        }
    }
}

impl WanSpec {
    /// The queue in force, in ms.
    pub fn queue_ms(&self) -> f64 {
        self.queue_ms.unwrap_or(self.rtt_ms.max(10.0))
    }

    /// The Gilbert-Elliott burst-loss model, if configured.
    pub fn burst(&self) -> Option<GilbertElliott> {
        Some(GilbertElliott {
            p_pct: self.burst_p_pct?,
            r_pct: self.burst_r_pct?,
            loss_good_pct: 0.0,
            loss_bad_pct: 100.0,
        })
    }

    /// The emulator configuration for this WAN.
    pub fn emulator_config(&self) -> EmulatorConfig {
        let one_way = LinkParams {
            delay_us: (self.rtt_ms * 500.0).round() as u64,
            jitter_us: (self.jitter_ms * 1000.0).round() as u64,
            rate_kbit: (self.rate_mbit * 1000.0).round() as u64,
            queue: QueueLimit::Ms(self.queue_ms()),
            loss_pct: self.loss_pct,
            burst: self.burst(),
            ..LinkParams::default()
        };
        let (reverse_loss, reverse_burst) = match self.loss_dir {
            LossDirection::Both => (self.loss_pct, self.burst()),
            LossDirection::Forward => (0.0, None),
        };
        EmulatorConfig {
            b_to_a: LinkParams {
                loss_pct: reverse_loss,
                burst: reverse_burst,
                ..one_way.clone()
            },
            a_to_b: one_way,
            seed: self.seed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_splits_evenly_and_loss_direction_is_honoured() {
        let spec = WanSpec {
            rtt_ms: 100.0,
            loss_pct: 1.0,
            loss_dir: LossDirection::Forward,
            ..Default::default()
        };
        let c = spec.emulator_config();
        assert_eq!(c.a_to_b.delay_us + c.b_to_a.delay_us, 100_000);
        assert_eq!((c.a_to_b.loss_pct, c.b_to_a.loss_pct), (1.0, 0.0));
        assert_eq!(c.a_to_b.rate_kbit, 100_000);
        assert_eq!((c.a_to_b.burst, c.b_to_a.burst), (None, None));
        let bursty = WanSpec {
            burst_p_pct: Some(0.5),
            burst_r_pct: Some(30.0),
            ..spec.clone()
        }
        .emulator_config();
        assert_eq!(
            bursty.a_to_b.burst.map(|b| (b.p_pct, b.r_pct)),
            Some((0.5, 30.0))
        );
        assert_eq!(bursty.b_to_a.burst, None, "forward only, like the loss");
        assert_eq!(spec.queue_ms(), 100.0);
        assert_eq!(
            WanSpec {
                rtt_ms: 2.0,
                ..spec
            }
            .queue_ms(),
            10.0
        );
    }
}
