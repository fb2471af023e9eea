//! The GpuJoin aggregates' state, in plain Rust: keys are batched (a kernel, or a CPU loop, per
//! batch, never per row), and partial results merge associatively, so that the planner's
//! Partial Aggregate → Gather → Finalize Aggregate plan gives the same answer as a serial one.
//! One state serves both aggregates: `gpujoin_probe` (matches and payload sum) and
//! `gpujoin_materialize` (the same, with every matched pair appended to a result buffer).

use crate::error::{Code, Result, UvmError};

/// Keys collected before a batch is probed.
pub const BATCH: usize = 1 << 16;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeState {
    /// The segment holding the inner table (from the first row).
    pub segment: String,
    /// The result buffer that matched pairs go to (`gpujoin_materialize`; empty for the probe).
    pub result: String,
    /// Width in bytes of the probe keys' SQL type (4: integer, 8: bigint; 0: no row yet).
    pub key_width: u32,
    /// Non-NULL keys not probed yet (NULL keys never match: they are not kept).
    pub keys: Vec<i64>,
    pub matches: u64,
    pub sum: i128,
    /// Set when the SQL layer knows the name arguments cannot change between rows (constants
    /// or parameters): rows then skip `bind`. Not part of the wire form.
    pub names_fixed: bool,
}

impl ProbeState {
    /// Checks that a row names the segments of the first row (or takes them from it). Called for
    /// every row, so it compares bytes and allocates only on the first.
    #[inline]
    pub fn bind(&mut self, segment: &[u8], result: &[u8], key_width: u32) -> Result<()> {
        if self.key_width != 0 && self.segment.as_bytes() == segment && self.result.as_bytes() == result {
            return Ok(());
        }
        let text = |b: &[u8]| {
            std::str::from_utf8(b)
                .map(str::to_string)
                .map_err(|_| UvmError::new(Code::InvalidName, "segment names must be valid UTF-8"))
        };
        if self.key_width == 0 {
            self.segment = text(segment)?;
            self.result = text(result)?;
            self.key_width = key_width;
            self.keys.reserve(BATCH);
            return Ok(());
        }
        Err(UvmError::new(
            Code::InvalidParameterValue,
            format!(
                "one GpuJoin aggregate works on one segment, not \"{}\" and \"{}\"",
                if self.segment.as_bytes() != segment { &self.segment } else { &self.result },
                String::from_utf8_lossy(if self.segment.as_bytes() != segment { segment } else { result })
            ),
        ))
    }

    /// Adds a probe key.
    #[inline]
    pub fn push(&mut self, key: Option<i64>) {
        if let Some(k) = key {
            self.keys.push(k);
        }
    }

    /// Folds in the result of probing the pending keys and forgets them.
    pub fn absorb(&mut self, matches: u64, sum: i128) {
        self.matches += matches;
        self.sum += sum;
        self.keys.clear();
    }

    /// Folds in the result of probing keys that were handed on already (the pending keys stay).
    pub fn add(&mut self, matches: u64, sum: i128) {
        self.matches += matches;
        self.sum += sum;
    }

    /// Merges another (fully probed) partial state.
    pub fn merge(&mut self, other: &ProbeState) -> Result<()> {
        debug_assert!(other.keys.is_empty());
        if self.key_width == 0 {
            self.segment = other.segment.clone();
            self.result = other.result.clone();
            self.key_width = other.key_width;
        } else if other.key_width != 0 && (other.segment != self.segment || other.result != self.result) {
            return Err(UvmError::new(Code::InvalidParameterValue, "partial GpuJoin states of different segments"));
        }
        self.matches += other.matches;
        self.sum += other.sum;
        Ok(())
    }

    /// The wire form of a fully probed state (for parallel workers): version, key width,
    /// counts, then both names (the first with its length).
    pub fn serialize(&self) -> Vec<u8> {
        debug_assert!(self.keys.is_empty());
        let mut v = Vec::with_capacity(33 + self.segment.len() + self.result.len());
        v.push(2u8);
        v.extend_from_slice(&self.key_width.to_le_bytes());
        v.extend_from_slice(&self.matches.to_le_bytes());
        v.extend_from_slice(&self.sum.to_le_bytes());
        v.extend_from_slice(&(self.segment.len() as u32).to_le_bytes());
        v.extend_from_slice(self.segment.as_bytes());
        v.extend_from_slice(self.result.as_bytes());
        v
    }

    pub fn deserialize(b: &[u8]) -> Result<ProbeState> {
        let bad = || UvmError::new(Code::ProtocolViolation, "malformed GpuJoin partial state");
        if b.len() < 33 || b[0] != 2 {
            return Err(bad());
        }
        let seg_len = u32::from_le_bytes(b[29..33].try_into().unwrap()) as usize;
        let names = &b[33..];
        if seg_len > names.len() {
            return Err(bad());
        }
        Ok(ProbeState {
            key_width: u32::from_le_bytes(b[1..5].try_into().unwrap()),
            matches: u64::from_le_bytes(b[5..13].try_into().unwrap()),
            sum: i128::from_le_bytes(b[13..29].try_into().unwrap()),
            segment: String::from_utf8(names[..seg_len].to_vec()).map_err(|_| bad())?,
            result: String::from_utf8(names[seg_len..].to_vec()).map_err(|_| bad())?,
            keys: Vec::new(),
            names_fixed: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_merge_and_round_trip() {
        let mut a = ProbeState::default();
        a.bind(b"t", b"", 8).unwrap();
        a.bind(b"t", b"", 8).unwrap();
        assert_eq!(a.bind(b"u", b"", 8).unwrap_err().code, Code::InvalidParameterValue);
        assert_eq!(a.bind(b"t", b"r", 8).unwrap_err().code, Code::InvalidParameterValue);
        a.push(Some(1));
        a.push(None);
        assert_eq!(a.keys, vec![1]);
        a.absorb(3, -7);
        let mut b = ProbeState::default();
        b.bind(b"t", b"", 8).unwrap();
        b.absorb(2, i128::from(i64::MAX) * 4);
        a.merge(&b).unwrap();
        assert_eq!((a.matches, a.sum), (5, i128::from(i64::MAX) * 4 - 7));
        let c = ProbeState::deserialize(&a.serialize()).unwrap();
        assert_eq!(c, ProbeState { names_fixed: false, ..a.clone() });
        assert!(ProbeState::deserialize(b"\x02abc").is_err());
        let mut empty = ProbeState::default();
        empty.merge(&c).unwrap();
        assert_eq!(empty.segment, "t");
        // materialize states carry the result buffer's name through the wire form
        let mut m = ProbeState::default();
        m.bind("inner".as_bytes(), "résultat".as_bytes(), 4).unwrap();
        let back = ProbeState::deserialize(&m.serialize()).unwrap();
        assert_eq!((back.segment.as_str(), back.result.as_str(), back.key_width), ("inner", "résultat", 4));
        assert!(ProbeState::default().bind(b"\xff", b"", 8).is_err());
        let mut other = ProbeState::default();
        other.bind(b"inner", b"elsewhere", 4).unwrap();
        assert!(m.merge(&other).is_err());
    }
}
