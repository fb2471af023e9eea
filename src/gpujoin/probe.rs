//! The probe aggregate's state, in plain Rust: keys are batched (a kernel, or a CPU loop, per
//! batch, never per row), and partial results merge associatively, so that the planner's
//! Partial Aggregate → Gather → Finalize Aggregate plan gives the same answer as a serial one.

use crate::error::{Code, Result, UvmError};

/// Keys collected before a batch is probed.
pub const BATCH: usize = 1 << 16;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeState {
    /// The segment holding the inner table (from the first row).
    pub segment: String,
    /// Width in bytes of the probe keys' SQL type (4: integer, 8: bigint; 0: no row yet).
    pub key_width: u32,
    /// Keys not probed yet.
    pub keys: Vec<Option<i64>>,
    pub matches: u64,
    pub sum: i128,
}

impl ProbeState {
    /// Adds a probe key; true when a batch is full and must be probed.
    pub fn push(&mut self, segment: &str, key: Option<i64>, key_width: u32) -> Result<bool> {
        if self.segment.is_empty() {
            self.segment = segment.to_string();
            self.key_width = key_width;
            self.keys.reserve(BATCH);
        } else if self.segment != segment {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("one gpujoin_probe aggregate probes one segment, not \"{}\" and \"{segment}\"", self.segment),
            ));
        }
        self.keys.push(key);
        Ok(self.keys.len() >= BATCH)
    }

    /// Folds in the result of probing the pending keys and forgets them.
    pub fn absorb(&mut self, matches: u64, sum: i128) {
        self.matches += matches;
        self.sum += sum;
        self.keys.clear();
    }

    /// Merges another (fully probed) partial state.
    pub fn merge(&mut self, other: &ProbeState) -> Result<()> {
        debug_assert!(other.keys.is_empty());
        if self.segment.is_empty() {
            self.segment = other.segment.clone();
            self.key_width = other.key_width;
        } else if !other.segment.is_empty() && other.segment != self.segment {
            return Err(UvmError::new(Code::InvalidParameterValue, "partial probe states of different segments"));
        }
        self.matches += other.matches;
        self.sum += other.sum;
        Ok(())
    }

    /// The wire form of a fully probed state (for parallel workers): version, counts, name.
    pub fn serialize(&self) -> Vec<u8> {
        debug_assert!(self.keys.is_empty());
        let mut v = Vec::with_capacity(32 + self.segment.len());
        v.push(1u8);
        v.extend_from_slice(&self.key_width.to_le_bytes());
        v.extend_from_slice(&self.matches.to_le_bytes());
        v.extend_from_slice(&self.sum.to_le_bytes());
        v.extend_from_slice(self.segment.as_bytes());
        v
    }

    pub fn deserialize(b: &[u8]) -> Result<ProbeState> {
        let bad = || UvmError::new(Code::ProtocolViolation, "malformed gpujoin_probe partial state");
        if b.len() < 29 || b[0] != 1 {
            return Err(bad());
        }
        Ok(ProbeState {
            key_width: u32::from_le_bytes(b[1..5].try_into().unwrap()),
            matches: u64::from_le_bytes(b[5..13].try_into().unwrap()),
            sum: i128::from_le_bytes(b[13..29].try_into().unwrap()),
            segment: String::from_utf8(b[29..].to_vec()).map_err(|_| bad())?,
            keys: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_merge_and_round_trip() {
        let mut a = ProbeState::default();
        assert!(!a.push("t", Some(1), 8).unwrap());
        assert_eq!(a.push("u", Some(1), 8).unwrap_err().code, Code::InvalidParameterValue);
        a.absorb(3, -7);
        let mut b = ProbeState::default();
        b.push("t", None, 8).unwrap();
        b.absorb(2, i128::from(i64::MAX) * 4);
        a.merge(&b).unwrap();
        assert_eq!((a.matches, a.sum), (5, i128::from(i64::MAX) * 4 - 7));
        let c = ProbeState::deserialize(&a.serialize()).unwrap();
        assert_eq!(c, a);
        assert!(ProbeState::deserialize(b"\x02abc").is_err());
        let mut empty = ProbeState::default();
        empty.merge(&c).unwrap();
        assert_eq!(empty.segment, "t");
        let mut full = ProbeState::default();
        for i in 0..BATCH - 1 {
            assert!(!full.push("t", Some(i as i64), 8).unwrap());
        }
        assert!(full.push("t", Some(0), 8).unwrap());
    }
}
