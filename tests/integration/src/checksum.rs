//! Checksum and fill pattern: an independent copy of `crates/uvm_core/src/checksum.rs`.
//!
//! The GPU tests compare what the extension's kernels compute with these. They are copied, not
//! imported, on purpose: the test crate does not link the extension, and a change to one side
//! that is not made to the other must fail the GPU suite.
//!
//!   checksum = Σ mix(w[i] ^ (i * GOLDEN))  (wrapping), w[i] the little-endian 64-bit word at
//!              byte 8i of the range (the last one zero-padded), i counted from the range start
//!   fill     = byte j of a range is byte (j % 8) of mix(seed + j / 8)

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finalizer.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Checksum of `bytes` as a range of its own (word index from 0), what
/// `uvm.checksum_segment(name, offset, length)` returns (as `u64`) for the same bytes.
pub fn checksum(bytes: &[u8]) -> u64 {
    checksum_from(bytes, 0)
}

/// Checksum of `bytes` whose first word has index `first_word`: for a piece at byte offset `o`
/// (a multiple of 8) of a larger range, `first_word = o / 8`, and the pieces' values add up
/// (wrapping) to the checksum of the whole range.
pub fn checksum_from(bytes: &[u8], first_word: u64) -> u64 {
    let mut sum = 0u64;
    let mut words = bytes.chunks_exact(8);
    let mut i = first_word;
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap());
        sum = sum.wrapping_add(mix(w ^ i.wrapping_mul(GOLDEN)));
        i = i.wrapping_add(1);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(mix(u64::from_le_bytes(w) ^ i.wrapping_mul(GOLDEN)));
    }
    sum
}

/// The fill pattern of `uvm.fill_segment(name, offset, length, seed)` over `bytes`.
pub fn fill(bytes: &mut [u8], seed: u64) {
    let mut words = bytes.chunks_exact_mut(8);
    let mut i = 0u64;
    for w in &mut words {
        w.copy_from_slice(&mix(seed.wrapping_add(i)).to_le_bytes());
        i += 1;
    }
    let rest = words.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&mix(seed.wrapping_add(i)).to_le_bytes()[..n]);
}

/// Bytes `[at, at + len)` of a range filled with `seed` (from the range's start); `at` need not
/// be a multiple of 8. Because the pattern of a piece at byte `o` (a multiple of 8) is the fill
/// of seed `seed + o / 8`, this never materialises the bytes before `at`.
pub fn fill_range(seed: u64, at: u64, len: usize) -> Vec<u8> {
    let skew = (at % 8) as usize;
    let mut v = vec![0u8; len + skew];
    fill(&mut v, seed.wrapping_add(at / 8));
    v.drain(..skew);
    v
}

/// Checksum (word index from 0) of a range of `len` bytes filled with `seed`, computed in pieces
/// of 64 MiB so that multi-GiB ranges need little memory.
pub fn fill_checksum(seed: u64, len: u64) -> u64 {
    const PIECE: u64 = 64 << 20; // a multiple of 8
    let mut buf = vec![0u8; PIECE.min(len) as usize];
    let mut sum = 0u64;
    let mut at = 0u64;
    while at < len {
        let n = PIECE.min(len - at) as usize;
        let piece = &mut buf[..n];
        fill(piece, seed.wrapping_add(at / 8));
        sum = sum.wrapping_add(checksum_from(piece, at / 8));
        at += n as u64;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(checksum(&[]), 0);
        assert_eq!(checksum(&[0u8; 8]), 0);
        assert_eq!(checksum(&[1]), mix(1));
        assert_eq!(checksum_from(&1u64.to_le_bytes(), 1), mix(1 ^ GOLDEN));
    }

    #[test]
    fn pieces_add_up() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for split in [8usize, 800, 4096, 9992] {
            let a = checksum_from(&data[..split], 0);
            let b = checksum_from(&data[split..], (split / 8) as u64);
            assert_eq!(a.wrapping_add(b), checksum(&data), "split at {split}");
        }
    }

    #[test]
    fn fill_ranges() {
        let mut whole = vec![0u8; 1000];
        fill(&mut whole, 9);
        assert_eq!(&whole[..8], &mix(9).to_le_bytes());
        for (at, len) in [(0usize, 1000usize), (8, 100), (13, 500), (999, 1), (5, 0)] {
            assert_eq!(fill_range(9, at as u64, len), whole[at..at + len].to_vec(), "at {at} len {len}");
        }
        assert_eq!(fill_checksum(9, 1000), checksum(&whole));
        assert_eq!(fill_checksum(9, 0), 0);
    }

    #[test]
    fn fill_checksum_in_pieces() {
        // more than one 64 MiB piece, and a tail that is not a multiple of 8
        let len = (64 << 20) + 12_345;
        let mut v = vec![0u8; len];
        fill(&mut v, 7);
        assert_eq!(fill_checksum(7, len as u64), checksum(&v));
    }
}
