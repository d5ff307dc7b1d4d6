//! The one hash of every sketch: MurmurHash64A with seed `0xadc83b19`,
//! Redis's `PFADD` hash, so a member hashes the same in every process,
//! release and language (and a sketch can be checked against Redis).

/// The seed Redis's HyperLogLog uses.
pub const SEED: u64 = 0xadc8_3b19;

/// MurmurHash64A of `data` with seed `0xadc83b19` (Austin Appleby's public-domain
/// algorithm, little-endian words, as Redis computes it).
pub fn murmur64a(data: &[u8]) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h = SEED ^ (data.len() as u64).wrapping_mul(M);
    let mut words = data.chunks_exact(8);
    for word in &mut words {
        let mut k = word
            .iter()
            .rev()
            .fold(0u64, |k, byte| (k << 8) | u64::from(*byte));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate() {
            h ^= u64::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}
