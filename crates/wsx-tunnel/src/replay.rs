//! The sliding replay window over received packet numbers (as in RFC 6479 and WireGuard).
//!
//! A packet number is accepted once. Numbers more than [`WINDOW`] below the highest seen are
//! refused: the sender never reuses a number, so such a packet is a replay or so late that
//! the data it carried has been retransmitted already. The window is only moved by packets that
//! authenticated, so forged numbers cannot push it forward.

/// Packets of reordering the window tolerates. At 1 Gbit/s of 1400-byte packets that is 46 ms
/// of reordering, far more than any path reorders.
pub(crate) const WINDOW: u64 = 4096;
const WORDS: usize = (WINDOW / 64) as usize;

#[derive(Debug, Clone)]
pub(crate) struct ReplayWindow {
    /// Highest number accepted plus one (0: none yet).
    top: u64,
    /// Bit `n % WINDOW` is set when number `n` (within the window) was accepted.
    bits: [u64; WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self {
            top: 0,
            bits: [0; WORDS],
        }
    }
}

impl ReplayWindow {
    /// Whether `number` would be accepted. Checked before the (costly) decryption.
    pub(crate) fn check(&self, number: u64) -> bool {
        if number >= self.top {
            return true;
        }
        if self.top - number > WINDOW {
            return false;
        }
        let (word, bit) = Self::slot(number);
        self.bits[word] & bit == 0
    }

    /// Records `number` after its packet authenticated. Returns false for a replay.
    pub(crate) fn accept(&mut self, number: u64) -> bool {
        if !self.check(number) {
            return false;
        }
        if number >= self.top {
            // Clear the slots of the numbers the window moves over (at most the whole window).
            let advance = number + 1 - self.top;
            if advance >= WINDOW {
                self.bits = [0; WORDS];
            } else {
                for n in self.top..=number {
                    let (word, bit) = Self::slot(n);
                    self.bits[word] &= !bit;
                }
            }
            self.top = number + 1;
        }
        let (word, bit) = Self::slot(number);
        self.bits[word] |= bit;
        true
    }

    fn slot(number: u64) -> (usize, u64) {
        let index = number % WINDOW;
        ((index / 64) as usize, 1 << (index % 64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn duplicates_and_stale_numbers_are_refused() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(0));
        assert!(!w.accept(0));
        assert!(w.accept(10_000));
        assert!(w.accept(10_000 - WINDOW + 1));
        assert!(!w.accept(10_000 - WINDOW));
        assert!(!w.accept(5));
        assert!(w.accept(9_999));
        assert!(!w.accept(9_999));
    }

    proptest! {
        /// Against a model that remembers everything: a number is accepted exactly when it was
        /// never accepted before and is within the window below the highest accepted.
        #[test]
        fn matches_a_model(numbers in proptest::collection::vec(0u64..20_000, 1..400)) {
            let mut w = ReplayWindow::default();
            let mut seen = HashSet::new();
            let mut top: Option<u64> = None;
            for n in numbers {
                let fresh = !seen.contains(&n);
                let in_window = top.is_none_or(|t| n + WINDOW > t);
                let expected = fresh && in_window;
                prop_assert_eq!(w.accept(n), expected, "number {}", n);
                if expected {
                    seen.insert(n);
                    top = Some(top.map_or(n, |t| t.max(n)));
                }
            }
        }
    }
}
