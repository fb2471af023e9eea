//! The segment checksum and fill pattern: one definition for the CPU path (here) and the GPU
//! kernels (`kernels/segment.cu`), which must produce the same bytes and values.
//!
//! The range is read as little-endian 64-bit words `w[i]` (the last one zero-padded), each mixed
//! with its index by the SplitMix64 finalizer, and the results are added modulo 2^64:
//!
//! ```text
//! checksum = Σ mix(w[i] ^ (i * 0x9E3779B97F4A7C15))   (wrapping)
//! ```
//!
//! Addition is associative and commutative, so any split of the range (threads, thread blocks,
//! chunks, parallel workers) combines to the same value; mixing with the index makes it
//! sensitive to the order of words as well as to their values.
//!
//! # Cancellation
//!
//! A segment can be tens of GiB, seconds of CPU work. The SQL functions therefore use
//! [`checksum_interruptible`] and [`fill_interruptible`], which work through the range in
//! blocks of [`BLOCK`] bytes (well under a millisecond each) and serve a pending cancel or
//! `statement_timeout` between two blocks (`crate::interrupt::check`). An interrupted fill
//! leaves the blocks before the interrupt written and the rest untouched; the caller's guards
//! (the segment pin) are released on the way out.

use crate::error::Result;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[inline]
fn term(word: u64, index: u64) -> u64 {
    mix(word ^ index.wrapping_mul(GOLDEN))
}

/// The fill pattern (`fill_segment`): byte j of a range is byte `j % 8` of `mix(seed + j / 8)`.
pub fn fill(bytes: &mut [u8], seed: u64) {
    let mut chunks = bytes.chunks_exact_mut(8);
    let mut i = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&mix(seed.wrapping_add(i)).to_le_bytes());
        i += 1;
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&mix(seed.wrapping_add(i)).to_le_bytes()[..n]);
}

/// Checksum of `bytes`, whose first word has index `first_word` (0 for a whole range).
pub fn checksum(bytes: &[u8], first_word: u64) -> u64 {
    let mut sum = 0u64;
    let mut chunks = bytes.chunks_exact(8);
    let mut i = first_word;
    for c in &mut chunks {
        sum = sum.wrapping_add(term(u64::from_le_bytes(c.try_into().unwrap()), i));
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(term(u64::from_le_bytes(w), i));
    }
    sum
}

/// Bytes between two interrupt checks of [`checksum_interruptible`] and [`fill_interruptible`]:
/// a multiple of 8 (so that blocks start on word boundaries), and well under a millisecond of
/// work at the slowest (a first touch of memfd pages, about 1 GB/s).
pub const BLOCK: usize = 256 << 10;

/// [`checksum`] of a whole range (first word index 0), serving interrupts between blocks.
pub fn checksum_interruptible(bytes: &[u8]) -> Result<u64> {
    let mut sum = 0u64;
    for (k, block) in bytes.chunks(BLOCK).enumerate() {
        crate::interrupt::check()?;
        sum = sum.wrapping_add(checksum(block, (k * (BLOCK / 8)) as u64));
    }
    Ok(sum)
}

/// [`fill`], serving interrupts between blocks. On an interrupt, the blocks before it are
/// written and the rest is untouched.
pub fn fill_interruptible(bytes: &mut [u8], seed: u64) -> Result<()> {
    for (k, block) in bytes.chunks_mut(BLOCK).enumerate() {
        crate::interrupt::check()?;
        fill(block, seed.wrapping_add((k * (BLOCK / 8)) as u64));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Code, UvmError};

    #[test]
    fn interruptible_versions_compute_the_same() {
        // No hook on this thread: nothing interrupts. Sizes around block boundaries, and ragged.
        for len in [0, 7, 8, BLOCK - 3, BLOCK, BLOCK + 1, 3 * BLOCK + 13] {
            let mut a = vec![0u8; len];
            let mut b = vec![0u8; len];
            fill(&mut a, 42);
            fill_interruptible(&mut b, 42).unwrap();
            assert!(a == b, "fill of {len} bytes");
            assert_eq!(checksum_interruptible(&a).unwrap(), checksum(&a, 0), "checksum of {len} bytes");
        }
    }

    #[test]
    fn interruptible_versions_stop_at_an_interrupt() {
        fn cancel() -> Result<()> {
            Err(UvmError::new(Code::QueryCanceled, "canceling statement due to user request"))
        }
        // The hook runs only on the thread that installed it: use a thread of our own.
        std::thread::spawn(|| {
            crate::interrupt::install(cancel);
            let mut data = vec![0u8; 2 * BLOCK];
            assert_eq!(fill_interruptible(&mut data, 1).unwrap_err().code, Code::QueryCanceled);
            assert!(data.iter().all(|&b| b == 0), "nothing written before the first check");
            assert_eq!(checksum_interruptible(&data).unwrap_err().code, Code::QueryCanceled);
            // an empty range does no work and needs no check
            assert_eq!(checksum_interruptible(&[]).unwrap(), 0);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn known_values() {
        assert_eq!(checksum(&[], 0), 0);
        // one zero word at index 0: mix(0) == 0
        assert_eq!(checksum(&[0u8; 8], 0), 0);
        assert_eq!(checksum(&[1], 0), mix(1));
        assert_eq!(checksum(&1u64.to_le_bytes(), 1), mix(1 ^ GOLDEN));
    }

    #[test]
    fn splits_combine() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let whole = checksum(&data, 0);
        for split in [8usize, 800, 4096, 9992] {
            let a = checksum(&data[..split], 0);
            let b = checksum(&data[split..], (split / 8) as u64);
            assert_eq!(a.wrapping_add(b), whole, "split at {split}");
        }
    }

    #[test]
    fn fill_pattern() {
        let mut a = vec![0u8; 21];
        fill(&mut a, 5);
        assert_eq!(&a[..8], &mix(5).to_le_bytes());
        assert_eq!(&a[16..], &mix(7).to_le_bytes()[..5]);
        // a fill of the first 16 bytes is a prefix of the fill of 21
        let mut b = vec![0u8; 16];
        fill(&mut b, 5);
        assert_eq!(&a[..16], &b[..]);
    }

    #[test]
    fn order_matters() {
        let mut data = vec![0u8; 64];
        data[0] = 1;
        let a = checksum(&data, 0);
        data.swap(0, 8);
        assert_ne!(a, checksum(&data, 0));
    }
}
