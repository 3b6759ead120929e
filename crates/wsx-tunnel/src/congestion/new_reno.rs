//! NewReno (RFC 9002 §7 and Appendix B): slow start, then additive increase; every loss
//! episode halves the window. The conventional baseline, and the choice for paths shared with
//! traffic that expects TCP-like behaviour.

use super::{
    AckEvent, Controller, ControllerFactory, ControllerState, LossEvent, LossVerdict, PathHint,
    PathParams, rate_of, scale,
};
use std::time::{Duration, Instant};

/// Settings of the [`NewReno`] controller.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NewRenoConfig {
    pub initial_window_packets: u64,
}

impl Default for NewRenoConfig {
    fn default() -> Self {
        Self {
            initial_window_packets: 10,
        }
    }
}

impl ControllerFactory for NewRenoConfig {
    fn build(&self, _now: Instant, params: &PathParams) -> Box<dyn Controller> {
        Box::new(NewReno::new(self, params))
    }
}

/// Minimum window: two packets (RFC 9002 §7.2).
const MIN_WINDOW_PACKETS: u64 = 2;
/// Loss reduction factor, per mille (RFC 9002 kLossReductionFactor = 0.5).
const LOSS_REDUCTION: u64 = 500;
/// Pacing at 1.25 times window/RTT (RFC 9002 §7.7 suggests N = 1.25).
const PACING_GAIN: u64 = 1250;

#[derive(Debug)]
pub struct NewReno {
    max_datagram: u64,
    window: u64,
    ssthresh: u64,
    /// Bytes acknowledged toward the next one-packet increase in congestion avoidance.
    acked_since_increase: u64,
    /// Losses of packets sent before this belong to an episode already reacted to.
    recovery_start: Option<Instant>,
    smoothed_rtt: std::time::Duration,
    congestion_events: u64,
    random_losses: u64,
    losses: u64,
}

impl NewReno {
    pub fn new(config: &NewRenoConfig, params: &PathParams) -> Self {
        Self {
            max_datagram: params.max_datagram,
            window: config.initial_window_packets.max(MIN_WINDOW_PACKETS) * params.max_datagram,
            ssthresh: u64::MAX,
            acked_since_increase: 0,
            recovery_start: None,
            smoothed_rtt: params.initial_rtt,
            congestion_events: 0,
            random_losses: 0,
            losses: 0,
        }
    }
}

impl Controller for NewReno {
    fn on_sent(&mut self, _now: Instant, _bytes: u64, _in_flight: u64) {}

    fn on_ack(&mut self, _now: Instant, ack: &AckEvent<'_>) {
        self.smoothed_rtt = ack.rtt.smoothed();
        if self.window < self.ssthresh {
            self.window += ack.acked_bytes;
        } else {
            self.acked_since_increase += ack.acked_bytes;
            if self.acked_since_increase >= self.window {
                self.acked_since_increase -= self.window;
                self.window += self.max_datagram;
            }
        }
    }

    fn on_loss(&mut self, now: Instant, loss: &LossEvent<'_>) -> LossVerdict {
        self.losses += loss.lost.len() as u64;
        let Some(last) = loss.lost.last() else {
            return LossVerdict::Random;
        };
        if self.recovery_start.is_some_and(|start| last.sent <= start) {
            self.random_losses += loss.lost.len() as u64;
            return LossVerdict::Random;
        }
        self.recovery_start = Some(now);
        self.congestion_events += 1;
        self.window =
            scale(self.window, LOSS_REDUCTION).max(MIN_WINDOW_PACKETS * self.max_datagram);
        self.ssthresh = self.window;
        self.acked_since_increase = 0;
        // Every loss is congestion to NewReno; it cannot tell a full queue from a bad line.
        LossVerdict::Congestion
    }

    fn on_persistent_congestion(&mut self, now: Instant) {
        self.window = MIN_WINDOW_PACKETS * self.max_datagram;
        self.recovery_start = Some(now);
    }

    fn window(&self) -> u64 {
        self.window
    }

    fn pacing_rate(&self) -> u64 {
        scale(rate_of(self.window, self.smoothed_rtt), PACING_GAIN)
    }

    fn state(&self) -> ControllerState {
        ControllerState {
            phase: if self.window < self.ssthresh {
                "slow-start"
            } else {
                "congestion-avoidance"
            },
            window: self.window,
            pacing_rate: self.pacing_rate(),
            bottleneck_rate: 0,
            min_rtt: Duration::ZERO,
            congestion_events: self.congestion_events,
            random_losses: self.random_losses,
            losses: self.losses,
        }
    }

    fn on_max_datagram(&mut self, max_datagram: u64) {
        self.max_datagram = max_datagram;
    }

    fn path_hint(&self) -> Option<PathHint> {
        None
    }
}
