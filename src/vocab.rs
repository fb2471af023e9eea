//! The vocabulary every layer speaks: tiers, the address arena, a chunk as a process maps it,
//! and which provider backs the cluster's chunks.
//!
//! These are plain values (no PostgreSQL, no shared memory, no CUDA), kept apart from the
//! modules that store or act on them so that the layers depend on the words rather than on each
//! other: the registry records tiers and chunks, the providers allocate and map by tier inside
//! the arena, and neither needs to import the other. `registry` and `provider` re-export what
//! belongs to their interfaces, so callers may name these types through either.

use crate::error::{Code, Result};
use crate::uvm_err;

/// Where a chunk's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Tier {
    /// Pinned host memory (or a memfd with the host provider); CPU-addressable.
    Host = 1,
    /// GPU memory.
    Device = 2,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Host => "host",
            Tier::Device => "device",
        }
    }
    /// The tier a registry slot records (anything but `Device` reads as `Host`).
    pub(crate) fn from_u32(v: u32) -> Tier {
        if v == Tier::Device as u32 {
            Tier::Device
        } else {
            Tier::Host
        }
    }
}

/// The tier a caller asks for: a fixed tier, or `auto` (device while the budget lasts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum TierPref {
    Auto = 0,
    Host = 1,
    Device = 2,
}

impl TierPref {
    /// Parses a tier name as SQL gives it; anything else is a 22023 error.
    pub fn parse(s: &str) -> Result<TierPref> {
        match s {
            "auto" => Ok(TierPref::Auto),
            "host" => Ok(TierPref::Host),
            "device" => Ok(TierPref::Device),
            _ => Err(uvm_err!(Code::InvalidParameterValue, "invalid tier \"{s}\"")
                .hint("Valid tiers are \"auto\", \"device\" and \"host\".")),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TierPref::Auto => "auto",
            TierPref::Host => "host",
            TierPref::Device => "device",
        }
    }
    /// The preference a registry slot records (anything unknown reads as `Auto`).
    pub(crate) fn from_u32(v: u32) -> TierPref {
        match v {
            1 => TierPref::Host,
            2 => TierPref::Device,
            _ => TierPref::Auto,
        }
    }
}

/// The reserved virtual address range that every process inherits from the postmaster. Segments
/// get disjoint sub-ranges of it, so their base address is the same in every process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Arena {
    pub base: u64,
    pub size: u64,
}

/// One chunk as a process needs it to map it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    pub id: u64,
    pub offset: u64,
    pub size: u64,
    pub tier: Tier,
}

/// Which provider backs this process's chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    Host,
    Cuda,
}

impl ProviderKind {
    /// The code recorded in the registry (never 0).
    pub fn code(self) -> u32 {
        match self {
            ProviderKind::Host => 1,
            ProviderKind::Cuda => 2,
        }
    }
    pub fn from_code(c: u32) -> Option<ProviderKind> {
        match c {
            1 => Some(ProviderKind::Host),
            2 => Some(ProviderKind::Cuda),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Host => "host",
            ProviderKind::Cuda => "cuda",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes stored in shared memory decode to what was stored, and unknown ones to the
    /// documented defaults (never a panic on a corrupted slot).
    #[test]
    fn stored_codes_round_trip() {
        for t in [Tier::Host, Tier::Device] {
            assert_eq!(Tier::from_u32(t as u32), t);
        }
        assert_eq!(Tier::from_u32(0), Tier::Host);
        assert_eq!(Tier::from_u32(77), Tier::Host);
        for p in [TierPref::Auto, TierPref::Host, TierPref::Device] {
            assert_eq!(TierPref::from_u32(p as u32), p);
            assert_eq!(TierPref::parse(p.name()).unwrap(), p);
        }
        assert_eq!(TierPref::from_u32(77), TierPref::Auto);
        for k in [ProviderKind::Host, ProviderKind::Cuda] {
            assert_ne!(k.code(), 0);
            assert_eq!(ProviderKind::from_code(k.code()), Some(k));
        }
        assert_eq!(ProviderKind::from_code(0), None);
    }
}
