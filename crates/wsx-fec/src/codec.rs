//! The Reed-Solomon decoder: reed-solomon-simd's, with the one step that costs most at the
//! tunnel's block sizes done another way.
//!
//! Before it rebuilds anything, a decode evaluates the erasure locator polynomial at every
//! position of the code: the product of `(x_i - x_j)` over the erased positions `j`, as a
//! logarithm. reed-solomon-simd computes it for all 65,536 elements of GF(2^16) with two
//! Walsh-Hadamard transforms and a pointwise product (the sum of logarithms is a XOR
//! convolution), a fixed ~0.1 ms per decode whatever the block: most of the time a group of
//! 32 or 64 packets that lost one takes to rebuild. The tunnel's codes are short (at most
//! 255 originals, 511 positions with the recovery chunk), and a group rarely loses more than
//! a few, so [`DecodeEngine`] sums the logarithms directly at the positions the decode reads,
//! a few hundred table look-ups, and leaves larger cases to the transform. The FFTs and
//! multiplications stay reed-solomon-simd's (SIMD where the CPU has it).

use reed_solomon_simd::engine::{self, DefaultEngine, Engine, GF_MODULUS, GF_ORDER, GfElement};
use reed_solomon_simd::rate::{DecoderWork, DefaultRateDecoder, RateDecoder};

/// The longest code evaluated directly, in positions (the tunnel's codes have at most 511).
const DIRECT_POSITIONS: usize = 1024;

/// Above this many look-ups (positions times erasures) the transform is cheaper.
const DIRECT_LIMIT: usize = 1 << 15;

/// reed-solomon-simd's engine (the best its CPU detection finds), with the erasure locator
/// evaluated directly for short codes. See the module documentation.
pub struct DecodeEngine(DefaultEngine);

impl DecodeEngine {
    pub fn new() -> Self {
        Self(DefaultEngine::new())
    }
}

impl std::fmt::Debug for DecodeEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DecodeEngine")
    }
}

impl Default for DecodeEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine for DecodeEngine {
    fn fft(
        &self,
        data: &mut engine::ShardsRefMut,
        pos: usize,
        size: usize,
        truncated_size: usize,
        skew_delta: usize,
    ) {
        self.0.fft(data, pos, size, truncated_size, skew_delta);
    }

    fn ifft(
        &self,
        data: &mut engine::ShardsRefMut,
        pos: usize,
        size: usize,
        truncated_size: usize,
        skew_delta: usize,
    ) {
        self.0.ifft(data, pos, size, truncated_size, skew_delta);
    }

    fn mul(&self, x: &mut [[u8; 64]], log_m: GfElement) {
        self.0.mul(x, log_m);
    }

    /// `erasures[i]` is 1 at each erased position below `truncated_size` and 0 elsewhere;
    /// afterwards it holds, at every position below `truncated_size`, the logarithm of the
    /// product of `(i XOR j)` over the erased `j` (positions are field elements, subtraction
    /// is XOR), modulo 65,535, as the transform leaves it. The decoders read no position at
    /// or past `truncated_size` (the low-rate decoder, which would, passes the whole field
    /// and is left to the transform).
    fn eval_poly(erasures: &mut [GfElement; GF_ORDER], truncated_size: usize) {
        let end = truncated_size.min(GF_ORDER);
        let mut positions = [0u16; DIRECT_POSITIONS];
        let mut erased = 0;
        if end <= DIRECT_POSITIONS {
            for (j, _) in erasures[..end].iter().enumerate().filter(|(_, e)| **e != 0) {
                // `j` < DIRECT_POSITIONS.
                positions[erased] = j as u16;
                erased += 1;
            }
        }
        if erased == 0 || end * erased > DIRECT_LIMIT {
            DefaultEngine::eval_poly(erasures, truncated_size);
            return;
        }
        let log = &engine::tables::get_exp_log().log;
        let modulus = u32::from(GF_MODULUS);
        for (i, value) in erasures[..end].iter_mut().enumerate() {
            let sum = positions[..erased].iter().fold(0, |sum: u32, &j| {
                let sum = sum + u32::from(log[i ^ usize::from(j)]);
                if sum >= modulus { sum - modulus } else { sum }
            });
            // Below the modulus, which is below 2^16.
            *value = sum as GfElement;
        }
    }
}

/// The decoder the tunnel uses: reed-solomon-simd's rate decoder on [`DecodeEngine`].
pub type Decoder = DefaultRateDecoder<DecodeEngine>;

/// A decoder for `k` originals and `m` recovery shards of `shard_bytes`, reusing `work`.
pub fn decoder(
    k: usize,
    m: usize,
    shard_bytes: usize,
    work: Option<DecoderWork>,
) -> Result<Decoder, reed_solomon_simd::Error> {
    Decoder::new(k, m, shard_bytes, DecodeEngine::new(), work)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use reed_solomon_simd::ReedSolomonEncoder;

    /// A logarithm modulo 65,535 (the transform may leave 65,535 for 0).
    fn reduced(log: GfElement) -> GfElement {
        log % GF_MODULUS
    }

    proptest! {
        /// The direct sum of logarithms is the transform's result at every position below
        /// the truncation, for any set of erased positions (up to 32 of 1,024: every case
        /// takes the direct path).
        #[test]
        fn the_direct_locator_is_the_transforms(
            end in 1usize..=DIRECT_POSITIONS,
            erased in proptest::collection::vec(any::<u16>(), 1..=32),
        ) {
            let mut direct = Box::new([0 as GfElement; GF_ORDER]);
            for j in &erased {
                direct[usize::from(*j) % end] = 1;
            }
            let mut transform = direct.clone();
            DecodeEngine::eval_poly(&mut direct, end);
            DefaultEngine::eval_poly(&mut transform, end);
            for i in 0..end {
                prop_assert_eq!(reduced(direct[i]), reduced(transform[i]), "position {}", i);
            }
        }

        /// Whatever the code and whatever is lost (up to what the parity covers), the
        /// decoder rebuilds the originals.
        #[test]
        fn lost_originals_are_rebuilt(
            k in 1usize..=255,
            m_frac in 0.0f64..1.0,
            shard_pairs in 1usize..=760,
            lost_seed in any::<u64>(),
            data_seed in any::<u64>(),
        ) {
            let m = 1 + ((k - 1) as f64 * m_frac) as usize;
            let shard_bytes = 2 * shard_pairs;
            let mut rng = fastrand::Rng::with_seed(data_seed);
            let originals: Vec<Vec<u8>> = (0..k)
                .map(|_| (0..shard_bytes).map(|_| rng.u8(..)).collect())
                .collect();
            let mut encoder = ReedSolomonEncoder::new(k, m, shard_bytes)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for shard in &originals {
                encoder.add_original_shard(shard).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            let parity: Vec<Vec<u8>> = encoder
                .encode()
                .map_err(|e| TestCaseError::fail(e.to_string()))?
                .recovery_iter()
                .map(<[u8]>::to_vec)
                .collect();
            // Lose up to m of the k + m shards, at least one original.
            let mut pick = fastrand::Rng::with_seed(lost_seed);
            let lost_count = pick.usize(1..=m);
            let mut lost = vec![false; k + m];
            lost[pick.usize(..k)] = true;
            while lost.iter().filter(|&&l| l).count() < lost_count {
                lost[pick.usize(..k + m)] = true;
            }
            let mut decoder = decoder(k, m, shard_bytes, None)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (i, shard) in originals.iter().enumerate().filter(|(i, _)| !lost[*i]) {
                decoder.add_original_shard(i, shard).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            for (i, shard) in parity.iter().enumerate().filter(|(i, _)| !lost[k + *i]) {
                decoder.add_recovery_shard(i, shard).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            let result = decoder.decode().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut rebuilt = 0;
            for (i, shard) in result.restored_original_iter() {
                prop_assert!(lost[i]);
                prop_assert_eq!(shard, &originals[i][..], "original {}", i);
                rebuilt += 1;
            }
            prop_assert_eq!(rebuilt, lost[..k].iter().filter(|&&l| l).count());
        }
    }
}
