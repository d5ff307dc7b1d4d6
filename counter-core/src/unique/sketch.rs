//! A HyperLogLog sketch in one fixed, versioned format.
//!
//! 16,384 registers (precision 14) of 6 bits: a standard error of 0.81 %,
//! like Redis. Hash, register choice, rank and estimator are Redis's
//! (MurmurHash64A, the low 14 bits choose the register, the rank is one
//! more than the trailing zeros of the rest; Ertl's improved estimator), so
//! a sketch's estimate equals `PFCOUNT` of the same members, which the
//! tests pin. Merging is the register-wise maximum: commutative,
//! associative and idempotent, so the merge of a counter's slots is exactly
//! the sketch of all its members, and a flush applied twice changes nothing.
//!
//! # Why not a crate
//!
//! `cardinality-estimator` (Cloudflare) tags pointers with `unsafe` and
//! hashes with a default that must be pinned by hand; `hyperloglog` keys
//! SipHash randomly unless told otherwise and keeps a byte per register (16
//! kB); `hyperloglogplus` has an open double-counting bug in sparse merges.
//! The format below is about 200 lines, safe, and pinned by Redis's own
//! figures: its estimates equal `PFCOUNT`'s from 10 to 1,000,000 members
//! (999,674 for a million, 0.03 % off), and 10 members take 31 bytes.
//! Speed is not what sets them apart: an observation hashes a member and
//! sets one register, and `unique-bench`'s buffered observes (hashing and
//! merging in memory, the flush included) ran at 2.2 to 2.5 million a
//! second on one 2-core machine (`docs/bench/unique-*.json`).
//!
//! # The serialized format (version 1)
//!
//! * byte 0: `0x11` (sparse) or `0x12` (dense); any other byte is refused;
//! * sparse: the non-zero registers, sorted by index, 3 bytes each, big
//!   endian `index << 6 | rank` (an empty sketch is the one byte `0x11`;
//!   10 members are 31 bytes);
//! * dense: 12,288 bytes, 16,384 registers of 6 bits packed as Redis packs
//!   them (register `i` at bits `6i .. 6i + 6`, least significant first).
//!
//! A sketch stays sparse up to [`SPARSE_MAX`] registers, then turns dense
//! (12,289 bytes), whatever the number of members after that.

use std::fmt;

use super::{hash::murmur64a, member::Member};

/// Register index bits.
pub const PRECISION: u32 = 14;
/// Registers.
pub const REGISTERS: usize = 1 << PRECISION;
/// Bits of the hash left after the register index.
const Q: u32 = 64 - PRECISION;
/// The largest rank a register holds.
const MAX_RANK: u8 = Q as u8 + 1;
/// Bytes of the packed registers.
pub const DENSE_BYTES: usize = REGISTERS * 6 / 8;
/// Bytes of the largest serialized sketch (a dense one).
pub const MAX_BYTES: usize = 1 + DENSE_BYTES;
/// Non-zero registers a sparse sketch holds at most.
pub const SPARSE_MAX: usize = 3_000;

const SPARSE: u8 = 0x11;
const DENSE: u8 = 0x12;

/// The standard error of an estimate: `1.04 / sqrt(16384)`.
pub const STANDARD_ERROR: f64 = 0.0081;

/// A bad serialized sketch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a sketch of this format: {reason}")]
pub struct SketchFormatError {
    reason: &'static str,
}

/// A HyperLogLog sketch: see the [module](self).
#[derive(Clone, PartialEq, Eq)]
pub struct Sketch {
    repr: Repr,
}

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    /// `(index, rank)` of the non-zero registers, sorted by index.
    Sparse(Vec<(u16, u8)>),
    /// Every register, one byte each in memory.
    Dense(Box<[u8]>),
}

impl fmt::Debug for Sketch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sketch")
            .field("dense", &matches!(self.repr, Repr::Dense(_)))
            .field("estimate", &self.estimate())
            .finish()
    }
}

impl Default for Sketch {
    fn default() -> Self {
        Self::new()
    }
}

/// The register and rank a hash sets.
fn register_of(hash: u64) -> (u16, u8) {
    let index = (hash & (REGISTERS as u64 - 1)) as u16;
    let rest = (hash >> PRECISION) | (1 << Q);
    (index, rest.trailing_zeros() as u8 + 1)
}

/// The register-wise maximum of two sorted sparse lists, in one pass;
/// whether it differs from `ours`.
fn merge_sorted(ours: &[(u16, u8)], theirs: &[(u16, u8)]) -> (Vec<(u16, u8)>, bool) {
    let mut merged = Vec::with_capacity(ours.len() + theirs.len());
    let mut changed = false;
    let (mut i, mut j) = (0, 0);
    while i < ours.len() && j < theirs.len() {
        let (a, b) = (ours[i], theirs[j]);
        match a.0.cmp(&b.0) {
            std::cmp::Ordering::Less => {
                merged.push(a);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                merged.push(b);
                changed = true;
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                changed |= b.1 > a.1;
                merged.push((a.0, a.1.max(b.1)));
                i += 1;
                j += 1;
            }
        }
    }
    merged.extend_from_slice(&ours[i..]);
    changed |= j < theirs.len();
    merged.extend_from_slice(&theirs[j..]);
    (merged, changed)
}

impl Sketch {
    /// An empty sketch.
    pub fn new() -> Self {
        Self {
            repr: Repr::Sparse(Vec::new()),
        }
    }

    /// Adds `member`; whether a register changed (a member seen before
    /// never changes one).
    pub fn insert<M: Member + ?Sized>(&mut self, member: &M) -> bool {
        member.with_bytes(|bytes| self.insert_hash(murmur64a(bytes)))
    }

    /// Adds a member by its [`murmur64a`] hash.
    pub fn insert_hash(&mut self, hash: u64) -> bool {
        let (index, rank) = register_of(hash);
        self.raise(index, rank)
    }

    /// Sets register `index` to at least `rank`.
    fn raise(&mut self, index: u16, rank: u8) -> bool {
        match &mut self.repr {
            Repr::Dense(registers) => {
                let register = &mut registers[usize::from(index)];
                if *register >= rank {
                    return false;
                }
                *register = rank;
                true
            }
            Repr::Sparse(entries) => {
                match entries.binary_search_by_key(&index, |(i, _)| *i) {
                    Ok(at) => {
                        if entries[at].1 >= rank {
                            return false;
                        }
                        entries[at].1 = rank;
                    }
                    Err(at) => {
                        entries.insert(at, (index, rank));
                        if entries.len() > SPARSE_MAX {
                            self.densify();
                        }
                    }
                }
                true
            }
        }
    }

    fn densify(&mut self) {
        if let Repr::Sparse(entries) = &self.repr {
            let mut registers = vec![0u8; REGISTERS].into_boxed_slice();
            for (index, rank) in entries {
                registers[usize::from(*index)] = *rank;
            }
            self.repr = Repr::Dense(registers);
        }
    }

    /// Merges `other` in: afterwards this is the sketch of both sets.
    /// Whether a register changed (merging a sketch already merged, or one
    /// of a subset, changes none).
    pub fn merge(&mut self, other: &Sketch) -> bool {
        match (&mut self.repr, &other.repr) {
            (Repr::Sparse(ours), Repr::Sparse(theirs)) => {
                let (merged, changed) = merge_sorted(ours, theirs);
                if changed {
                    *ours = merged;
                    if ours.len() > SPARSE_MAX {
                        self.densify();
                    }
                }
                changed
            }
            (Repr::Dense(_), Repr::Sparse(entries)) => {
                entries.iter().fold(false, |changed, (index, rank)| {
                    self.raise(*index, *rank) | changed
                })
            }
            (_, Repr::Dense(theirs)) => {
                self.densify();
                let Repr::Dense(ours) = &mut self.repr else {
                    return false;
                };
                let mut changed = false;
                for (ours, theirs) in ours.iter_mut().zip(theirs.iter()) {
                    if *theirs > *ours {
                        *ours = *theirs;
                        changed = true;
                    }
                }
                changed
            }
        }
    }

    /// Whether no member was added.
    pub fn is_empty(&self) -> bool {
        match &self.repr {
            Repr::Sparse(entries) => entries.is_empty(),
            Repr::Dense(registers) => registers.iter().all(|r| *r == 0),
        }
    }

    /// The estimated number of distinct members (Ertl's improved
    /// estimator, as Redis's `PFCOUNT`).
    pub fn estimate(&self) -> u64 {
        let mut histogram = [0u32; MAX_RANK as usize + 1];
        match &self.repr {
            Repr::Sparse(entries) => {
                histogram[0] = (REGISTERS - entries.len()) as u32;
                for (_, rank) in entries {
                    histogram[usize::from(*rank)] += 1;
                }
            }
            Repr::Dense(registers) => {
                for rank in registers.iter() {
                    histogram[usize::from(*rank)] += 1;
                }
            }
        }
        let m = REGISTERS as f64;
        let mut z = m * tau((m - f64::from(histogram[usize::from(MAX_RANK)])) / m);
        for k in (1..=Q as usize).rev() {
            z += f64::from(histogram[k]);
            z *= 0.5;
        }
        z += m * sigma(f64::from(histogram[0]) / m);
        let alpha = 0.5 / std::f64::consts::LN_2;
        (alpha * m * m / z).round() as u64
    }

    /// The serialized form (see the [module](self)).
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.repr {
            Repr::Sparse(entries) => {
                let mut bytes = Vec::with_capacity(1 + 3 * entries.len());
                bytes.push(SPARSE);
                for (index, rank) in entries {
                    let packed = (u32::from(*index) << 6) | u32::from(*rank);
                    bytes.extend_from_slice(&packed.to_be_bytes()[1..]);
                }
                bytes
            }
            Repr::Dense(registers) => {
                let mut bytes = vec![0u8; 1 + DENSE_BYTES];
                bytes[0] = DENSE;
                let packed = &mut bytes[1..];
                for (index, rank) in registers.iter().enumerate() {
                    let bit = index * 6;
                    let (byte, shift) = (bit / 8, bit % 8);
                    let value = u16::from(*rank) << shift;
                    packed[byte] |= value as u8;
                    if shift > 2 {
                        packed[byte + 1] |= (value >> 8) as u8;
                    }
                }
                bytes
            }
        }
    }

    /// A sketch from [`Sketch::to_bytes`]'s form; anything else is refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SketchFormatError> {
        let bad = |reason| Err(SketchFormatError { reason });
        match bytes.split_first() {
            Some((&SPARSE, rest)) => {
                if rest.len() % 3 != 0 || rest.len() / 3 > SPARSE_MAX {
                    return bad("a sparse sketch is 3 bytes per register, at most 3,000 registers");
                }
                let mut entries = Vec::with_capacity(rest.len() / 3);
                for chunk in rest.chunks_exact(3) {
                    let packed = u32::from_be_bytes([0, chunk[0], chunk[1], chunk[2]]);
                    let (index, rank) = (packed >> 6, (packed & 63) as u8);
                    if index >= REGISTERS as u32 {
                        return bad("a sparse register index is below 16,384");
                    }
                    // Below 16,384: fits.
                    let index = index as u16;
                    if rank == 0
                        || rank > MAX_RANK
                        || entries.last().is_some_and(|(i, _)| *i >= index)
                    {
                        return bad(
                            "sparse registers must be sorted, distinct and of rank 1 to 51",
                        );
                    }
                    entries.push((index, rank));
                }
                Ok(Self {
                    repr: Repr::Sparse(entries),
                })
            }
            Some((&DENSE, packed)) => {
                if packed.len() != DENSE_BYTES {
                    return bad("a dense sketch is 12,288 bytes after its tag");
                }
                let mut registers = vec![0u8; REGISTERS].into_boxed_slice();
                for (index, register) in registers.iter_mut().enumerate() {
                    let bit = index * 6;
                    let (byte, shift) = (bit / 8, bit % 8);
                    let low = u16::from(packed[byte]);
                    let high = packed.get(byte + 1).map_or(0, |b| u16::from(*b));
                    let rank = (((high << 8) | low) >> shift) as u8 & 63;
                    if rank > MAX_RANK {
                        return bad("a register's rank is at most 51");
                    }
                    *register = rank;
                }
                Ok(Self {
                    repr: Repr::Dense(registers),
                })
            }
            _ => bad("unknown format tag (expected 0x11 or 0x12)"),
        }
    }
}

/// Ertl's σ, for the registers still zero.
fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let (mut y, mut z) = (1.0, x);
    loop {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        if z == previous {
            return z;
        }
    }
}

/// Ertl's τ, for the registers at the largest rank.
fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let (mut y, mut z) = (1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x).powi(2) * y;
        if z == previous {
            return z / 3.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(range: std::ops::Range<u64>) -> Sketch {
        let mut sketch = Sketch::new();
        for n in range {
            sketch.insert(format!("user:{n}").as_str());
        }
        sketch
    }

    /// Redis 7.0's `PFCOUNT` of `PFADD key user:0 .. user:<n-1>`, read off
    /// a server: the same hash, registers and estimator give the same
    /// estimates, exactly.
    #[test]
    fn estimates_equal_redis_pfcount() {
        for (n, pfcount) in [
            (0, 0),
            (10, 10),
            (1_000, 1_007),
            (100_000, 99_471),
            (1_000_000, 999_674),
        ] {
            assert_eq!(users(0..n).estimate(), pfcount, "{n} members");
        }
    }

    /// The dense registers of 100,000 members, byte for byte Redis's dense
    /// encoding (its `GET` after the 16-byte header): registers 0 to 9 and
    /// an FNV-1a 64 of all 12,288 bytes.
    #[test]
    fn dense_registers_equal_redis() {
        let bytes = users(0..100_000).to_bytes();
        assert_eq!((bytes[0], bytes.len()), (DENSE, 1 + DENSE_BYTES));
        let sketch = Sketch::from_bytes(&bytes).unwrap();
        let Repr::Dense(registers) = &sketch.repr else {
            panic!("dense")
        };
        assert_eq!(&registers[..10], [4, 5, 5, 5, 3, 6, 2, 3, 2, 3]);
        let fnv = bytes[1..].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        assert_eq!(fnv, 0xefc2_a09f_15db_5010);
    }

    #[test]
    fn hash_test_vectors() {
        // Pinned: a change of hash would split every stored sketch. (The
        // tests above check it against Redis; these name the values.)
        let pinned: Vec<u64> = ["", "a", "user:0", "abcdefgh", "abcdefghi"]
            .iter()
            .map(|s| murmur64a(s.as_bytes()))
            .collect();
        assert_eq!(pinned, PINNED_HASHES);
    }

    const PINNED_HASHES: [u64; 5] = [
        0xd8df_ea65_85bc_9732,
        0x53d2_470a_9b43_b1a7,
        0x72ac_d4e5_acf7_7455,
        0xf3a6_5df5_5991_4567,
        0x834f_ba4d_9152_daf7,
    ];

    #[test]
    fn small_sketches_are_small_and_exact_enough() {
        let ten = users(0..10);
        assert_eq!(ten.to_bytes().len(), 31);
        assert!(ten.to_bytes().len() <= 64);
        assert_eq!(Sketch::new().to_bytes(), [SPARSE]);
        for n in [1, 2, 50, 200] {
            assert_eq!(users(0..n).estimate(), n, "{n} members");
        }
    }

    #[test]
    fn merges_are_unions_whatever_the_order_and_repetition() {
        let whole = users(0..20_000);
        // Four slots of a counter: overlapping parts, one repeated.
        let parts = [
            users(0..6_000),
            users(5_000..12_000),
            users(12_000..20_000),
            users(100..200),
        ];
        let mut merged = Sketch::new();
        for part in parts.iter().chain(parts.iter().rev()) {
            merged.merge(part);
        }
        assert_eq!(merged.to_bytes(), whole.to_bytes());
        let mut again = merged.clone();
        again.merge(&merged);
        assert_eq!(again, merged);
        // Sparse into sparse stays sparse while small, and equals the union.
        let mut small = users(0..5);
        assert!(small.merge(&users(3..9)), "new members change registers");
        assert_eq!(small.to_bytes(), users(0..9).to_bytes());
        assert!(!small.merge(&users(2..7)), "a subset changes none");
        // Two sparse halves whose union passes the sparse limit: dense, the union.
        let (mut left, right) = (users(0..2_500), users(2_000..4_500));
        assert!(left.merge(&right));
        assert_eq!(left.to_bytes(), users(0..4_500).to_bytes());
        assert_eq!(left.to_bytes().len(), 1 + DENSE_BYTES);
    }

    #[test]
    fn register_indexes_past_the_registers_are_refused() {
        // Index 16,384 (packed 0x100001), and 65,536 (which a 16-bit cast
        // would wrap to 0): refused, never stored to panic a merge later.
        for bytes in [[SPARSE, 0x10, 0x00, 0x01], [SPARSE, 0x40, 0x00, 0x01]] {
            assert!(Sketch::from_bytes(&bytes).is_err(), "{bytes:?}");
        }
        let last = Sketch::from_bytes(&[SPARSE, 0x0f, 0xff, 0xc1]).unwrap();
        let mut dense = users(0..5_000);
        dense.merge(&last);
        assert!(dense.estimate() > 4_900);
    }

    #[test]
    fn round_trips_and_refuses_garbage() {
        for sketch in [
            Sketch::new(),
            users(0..10),
            users(0..2_999),
            users(0..50_000),
        ] {
            let bytes = sketch.to_bytes();
            assert_eq!(Sketch::from_bytes(&bytes).unwrap(), sketch);
        }
        for garbage in [
            &[][..],
            &[0x13],
            &[SPARSE, 0, 0],
            &[SPARSE, 0, 0, 1, 0, 0, 1],
            &[DENSE, 1, 2],
        ] {
            assert!(Sketch::from_bytes(garbage).is_err(), "{garbage:?}");
        }
        // A rank over 51 in a dense sketch.
        let mut dense = users(0..50_000).to_bytes();
        dense[1] |= 0x3f;
        assert!(Sketch::from_bytes(&dense).is_err());
    }

    #[test]
    fn accuracy_within_three_standard_errors() {
        for n in [10_000u64, 300_000] {
            let estimate = users(7_000_000..7_000_000 + n).estimate() as f64;
            let error = (estimate - n as f64).abs() / n as f64;
            assert!(
                error <= 3.0 * STANDARD_ERROR,
                "{n}: {estimate} ({error:.4})"
            );
        }
    }
}
