//! Deterministic payload streams. Sender and sink generate the same stream from the same seed
//! and flow number, so the sink checks every byte without the data ever being stored. The output
//! does not depend on how the stream is cut into reads and writes.

use serde::{Deserialize, Serialize};

/// What the payload looks like.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum PayloadKind {
    /// Pseudo-random bytes: incompressible, like encrypted or already compressed traffic.
    #[default]
    Random,
    /// English-like text from a fixed vocabulary: deflate compresses it about three to one.
    Text,
}

impl PayloadKind {
    pub(crate) fn code(self) -> u8 {
        match self {
            PayloadKind::Random => 0,
            PayloadKind::Text => 1,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(PayloadKind::Random),
            1 => Some(PayloadKind::Text),
            _ => None,
        }
    }
}

/// An endless deterministic byte stream.
#[derive(Debug)]
pub struct Payload {
    kind: PayloadKind,
    rng: fastrand::Rng,
    /// Generated but not yet handed out: one 8-byte block (random) or one word (text).
    pending: Vec<u8>,
    consumed: usize,
    words_in_sentence: u32,
}

impl Payload {
    /// The stream for `flow` of a run seeded with `seed`.
    pub fn new(kind: PayloadKind, seed: u64, flow: u16) -> Self {
        let flow_seed = seed ^ (u64::from(flow) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Self {
            kind,
            rng: fastrand::Rng::with_seed(flow_seed),
            pending: Vec::with_capacity(32),
            consumed: 0,
            words_in_sentence: 0,
        }
    }

    /// Writes the next `buf.len()` bytes of the stream into `buf`.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut at = self.drain_pending(buf);
        match self.kind {
            PayloadKind::Random => {
                let whole = (buf.len() - at) / 8 * 8;
                for block in buf[at..at + whole].chunks_exact_mut(8) {
                    block.copy_from_slice(&self.rng.u64(..).to_le_bytes());
                }
                at += whole;
                if at < buf.len() {
                    self.pending
                        .extend_from_slice(&self.rng.u64(..).to_le_bytes());
                    self.drain_pending(&mut buf[at..]);
                }
            }
            PayloadKind::Text => {
                while at < buf.len() {
                    self.next_word();
                    at += self.drain_pending(&mut buf[at..]);
                }
            }
        }
    }

    fn drain_pending(&mut self, buf: &mut [u8]) -> usize {
        let n = (self.pending.len() - self.consumed).min(buf.len());
        buf[..n].copy_from_slice(&self.pending[self.consumed..self.consumed + n]);
        self.consumed += n;
        if self.consumed == self.pending.len() {
            self.pending.clear();
            self.consumed = 0;
        }
        n
    }

    fn next_word(&mut self) {
        let word = VOCABULARY[self.rng.usize(..VOCABULARY.len())];
        self.pending.extend_from_slice(word.as_bytes());
        self.words_in_sentence += 1;
        if self.words_in_sentence >= 6 && self.rng.u8(..) < 40 {
            self.words_in_sentence = 0;
            self.pending
                .extend_from_slice(if self.rng.bool() { b".\n" } else { b". " });
        } else {
            self.pending.push(b' ');
        }
    }
}

/// The text mode's words: common English and networking vocabulary.
const VOCABULARY: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "was",
    "with",
    "as",
    "be",
    "at",
    "by",
    "this",
    "from",
    "or",
    "an",
    "are",
    "not",
    "but",
    "which",
    "have",
    "has",
    "were",
    "their",
    "all",
    "one",
    "when",
    "there",
    "can",
    "more",
    "been",
    "other",
    "its",
    "into",
    "than",
    "time",
    "only",
    "some",
    "two",
    "may",
    "then",
    "first",
    "any",
    "over",
    "such",
    "each",
    "after",
    "most",
    "also",
    "made",
    "between",
    "under",
    "network",
    "packet",
    "server",
    "client",
    "gateway",
    "tunnel",
    "stream",
    "window",
    "latency",
    "bandwidth",
    "router",
    "link",
    "queue",
    "loss",
    "delay",
    "frame",
    "header",
    "payload",
    "session",
    "protocol",
    "address",
    "route",
    "traffic",
    "buffer",
    "segment",
    "transfer",
    "request",
    "response",
    "connection",
    "interface",
    "report",
    "quarterly",
    "revenue",
    "customer",
    "account",
    "invoice",
    "shipment",
    "warehouse",
    "schedule",
    "meeting",
    "project",
    "document",
    "contract",
    "department",
    "manager",
    "office",
    "budget",
    "forecast",
    "inventory",
    "supplier",
    "order",
    "delivery",
    "payment",
    "balance",
    "record",
    "system",
    "process",
    "service",
    "support",
    "update",
    "review",
    "approval",
];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn generate(kind: PayloadKind, cuts: &[usize]) -> Vec<u8> {
        let mut p = Payload::new(kind, 42, 3);
        let mut out = Vec::new();
        for &n in cuts {
            let mut buf = vec![0; n];
            p.fill(&mut buf);
            out.extend_from_slice(&buf);
        }
        out
    }

    proptest! {
        #[test]
        fn stream_does_not_depend_on_how_it_is_cut(cuts in prop::collection::vec(0usize..3000, 1..40)) {
            for kind in [PayloadKind::Random, PayloadKind::Text] {
                let total: usize = cuts.iter().sum();
                prop_assert_eq!(generate(kind, &cuts), generate(kind, &[total]));
            }
        }
    }

    #[test]
    fn flows_and_seeds_give_different_streams() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        Payload::new(PayloadKind::Random, 1, 0).fill(&mut a);
        Payload::new(PayloadKind::Random, 1, 1).fill(&mut b);
        assert_ne!(a, b);
        Payload::new(PayloadKind::Random, 2, 0).fill(&mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn text_is_printable_and_compressible() {
        let text = generate(PayloadKind::Text, &[100_000]);
        assert!(
            text.iter()
                .all(|&c| c.is_ascii_graphic() || c == b' ' || c == b'\n')
        );
        // Only the vocabulary and separators occur, so the byte distribution is skewed: far
        // fewer than 256 distinct bytes.
        let distinct = text.iter().collect::<std::collections::HashSet<_>>().len();
        assert!(distinct < 40, "{distinct} distinct bytes");
    }
}
