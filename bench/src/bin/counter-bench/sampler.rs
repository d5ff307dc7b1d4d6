//! Zipf draws: owner `k` of `1..=n` with probability `k^-s / H(n, s)`,
//! where `H(n, s)` is the sum of `j^-s` over `1..=n`. Owner 1 is the hottest.
//!
//! By inverse CDF over a table of the cumulative probabilities, built once
//! per run and shared by every client: a draw is one uniform number and a
//! binary search (about 17 steps for 100,000 owners). `rand_distr`, whose
//! `Zipf` would do the same job by rejection sampling, is not a dependency
//! of the examples; the table costs 8 bytes per owner (80 MB at the
//! largest `--owners`, 10 million), which a benchmark can afford.

use rand::Rng;

use crate::writes::BoxError;

/// A Zipf distribution over `1..=n`.
#[derive(Debug)]
pub struct Zipf {
    /// `cdf[k - 1]`: the probability of drawing an owner `<= k`; the last
    /// entry is exactly 1.
    cdf: Vec<f64>,
}

impl Zipf {
    /// Owners `1..=n`, exponent `s` (0 draws uniformly; the larger, the
    /// more the first owners take).
    pub fn new(n: u64, s: f64) -> Result<Self, BoxError> {
        if n == 0 {
            return Err("a Zipf distribution needs at least one owner".into());
        }
        if !s.is_finite() || s < 0.0 {
            return Err(format!("a Zipf exponent must be finite and >= 0, not {s}").into());
        }
        let mut cdf = Vec::with_capacity(usize::try_from(n)?);
        let mut total = 0.0;
        for k in 1..=n {
            total += (k as f64).powf(-s);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        // Rounding may leave the last sum a hair under 1: a draw must never
        // fall past the table.
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        Ok(Self { cdf })
    }

    /// How many owners the distribution covers.
    pub fn owners(&self) -> u64 {
        self.cdf.len() as u64
    }

    /// One owner in `1..=n`: the first whose cumulative probability exceeds
    /// a uniform draw in `[0, 1)`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        let u: f64 = rng.random();
        let index = self.cdf.partition_point(|&c| c <= u);
        index.min(self.cdf.len() - 1) as u64 + 1
    }
}

#[cfg(test)]
mod tests {
    use rand::{SeedableRng, rngs::SmallRng};

    use super::*;

    /// Draws `draws` owners and counts how often each of the first `top`
    /// came up (index 0 unused).
    fn counts(zipf: &Zipf, draws: usize, top: usize) -> Vec<usize> {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut hits = vec![0; top + 1];
        for _ in 0..draws {
            let owner = zipf.sample(&mut rng);
            assert!((1..=zipf.owners()).contains(&owner), "{owner}");
            if let Some(hit) = hits.get_mut(owner as usize) {
                *hit += 1;
            }
        }
        hits
    }

    #[test]
    fn owner_one_is_drawn_most_in_the_right_proportion() {
        let (n, s) = (100_000u64, 1.1);
        let zipf = Zipf::new(n, s).unwrap();
        let harmonic: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        let draws = 200_000;
        let hits = counts(&zipf, draws, 5);
        // About 13.5% of all draws go to owner 1 (1 / H(100000, 1.1)).
        let expected = 1.0 / harmonic;
        assert!((0.13..0.14).contains(&expected), "{expected}");
        let share = hits[1] as f64 / draws as f64;
        // Six standard deviations of the binomial share: ~0.0045.
        assert!((share - expected).abs() < 0.0045, "{share} vs {expected}");
        // Each of the first five owners is drawn more than the next, and owner 2
        // about 2^-1.1 as often as owner 1.
        assert!(hits[1..].windows(2).all(|w| w[0] > w[1]), "{hits:?}");
        let ratio = hits[1] as f64 / hits[2] as f64;
        assert!((ratio - 2f64.powf(s)).abs() < 0.15, "{ratio}");
    }

    #[test]
    fn exponent_zero_is_uniform_and_one_owner_is_always_drawn() {
        let uniform = Zipf::new(4, 0.0).unwrap();
        let hits = counts(&uniform, 40_000, 4);
        assert!(
            hits[1..].iter().all(|&h| (9_400..10_600).contains(&h)),
            "{hits:?}"
        );
        let one = Zipf::new(1, 1.1).unwrap();
        assert_eq!(counts(&one, 100, 1)[1], 100);
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Zipf::new(0, 1.1).is_err());
        assert!(Zipf::new(10, -1.0).is_err());
        assert!(Zipf::new(10, f64::NAN).is_err());
    }
}
