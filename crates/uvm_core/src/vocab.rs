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

/// The most GPUs one cluster places chunks on (the registry keeps a byte count per GPU).
pub const MAX_DEVICES: u32 = 16;

/// Where one chunk lives: the host tier, or the device tier of one GPU (its ordinal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    Host,
    Device(u32),
}

impl Place {
    pub fn tier(self) -> Tier {
        match self {
            Place::Host => Tier::Host,
            Place::Device(_) => Tier::Device,
        }
    }
    /// The GPU of a device chunk; 0 for the host tier (as the registry records it).
    pub fn device(self) -> u32 {
        match self {
            Place::Host => 0,
            Place::Device(n) => n,
        }
    }
    /// The place a registry slot records (`device` is ignored for the host tier).
    pub(crate) fn from_parts(tier: Tier, device: u32) -> Place {
        match tier {
            Tier::Host => Place::Host,
            Tier::Device => Place::Device(device),
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Host => f.write_str("host"),
            Place::Device(n) => write!(f, "device:{n}"),
        }
    }
}

/// The tier a caller asks for: `auto` (device while a GPU's budget lasts, then host), `host`,
/// `device` (any GPU: the placement picks, chunk by chunk), `device:N` (GPU N), or `cpu`.
///
/// `cpu` is host memory for the CPU alone: its chunks are memfds under every provider, so every
/// process of the cluster maps them without CUDA (service mode's backends included, which under
/// CUDA map no other chunk), and no GPU kernel ever reads them (a pin refuses their addresses
/// for kernels, `Pin::addr`); they never move to a GPU. For what only CPU code reads: a cache's
/// appended rows, a plan node's spilled rows. It is a segment's preference for its whole life;
/// its chunks are in the host tier (`Tier::Host`) as every view and budget counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierPref {
    Auto,
    Host,
    Device,
    DeviceOn(u32),
    Cpu,
}

/// Registry code of `device:N`: this plus N.
const DEVICE_ON_CODE: u32 = 0x100;

impl TierPref {
    /// Parses a tier name as SQL gives it; anything else is a 22023 error.
    pub fn parse(s: &str) -> Result<TierPref> {
        match s {
            "auto" => Ok(TierPref::Auto),
            "host" => Ok(TierPref::Host),
            "device" => Ok(TierPref::Device),
            "cpu" => Ok(TierPref::Cpu),
            _ => match s.strip_prefix("device:").map(|n| (n, n.parse::<u32>())) {
                // Digits only: no sign, no spaces, no leading "+".
                Some((n, Ok(d))) if d < MAX_DEVICES && n.bytes().all(|b| b.is_ascii_digit()) => Ok(TierPref::DeviceOn(d)),
                Some(_) => Err(uvm_err!(Code::InvalidParameterValue, "invalid tier \"{s}\"")
                    .hint(format!("A GPU is named \"device:N\", N from 0 to {}.", MAX_DEVICES - 1))),
                None => Err(uvm_err!(Code::InvalidParameterValue, "invalid tier \"{s}\"")
                    .hint("Valid tiers are \"auto\", \"device\", \"device:N\" (GPU N), \"host\" and \"cpu\".")),
            },
        }
    }
    pub fn name(self) -> String {
        match self {
            TierPref::Auto => "auto".into(),
            TierPref::Host => "host".into(),
            TierPref::Device => "device".into(),
            TierPref::DeviceOn(n) => format!("device:{n}"),
            TierPref::Cpu => "cpu".into(),
        }
    }
    /// The code a registry slot or a request records.
    pub fn code(self) -> u32 {
        match self {
            TierPref::Auto => 0,
            TierPref::Host => 1,
            TierPref::Device => 2,
            TierPref::Cpu => 3,
            TierPref::DeviceOn(n) => DEVICE_ON_CODE + n,
        }
    }
    /// The preference a registry slot or a request records (anything unknown reads as `Auto`).
    pub fn from_code(v: u32) -> TierPref {
        match v {
            1 => TierPref::Host,
            2 => TierPref::Device,
            3 => TierPref::Cpu,
            n if (DEVICE_ON_CODE..DEVICE_ON_CODE + MAX_DEVICES).contains(&n) => TierPref::DeviceOn(n - DEVICE_ON_CODE),
            _ => TierPref::Auto,
        }
    }
    /// The tier it asks for (`Auto` counts as the device tier, its first choice).
    pub fn tier(self) -> Tier {
        match self {
            TierPref::Host | TierPref::Cpu => Tier::Host,
            _ => Tier::Device,
        }
    }
    /// Whether a segment of this preference is CPU memory alone (`cpu`: memfd chunks that every
    /// process maps and no kernel reads).
    pub fn cpu_only(self) -> bool {
        self == TierPref::Cpu
    }
    /// Whether a chunk at `place` is where this preference wants it (`Auto`: anywhere).
    pub fn holds(self, place: Place) -> bool {
        match self {
            TierPref::Auto => true,
            TierPref::Host | TierPref::Cpu => place == Place::Host,
            TierPref::Device => place != Place::Host,
            TierPref::DeviceOn(n) => place == Place::Device(n),
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
    /// The GPU of a device chunk (0 for the host tier).
    pub device: u32,
}

impl ChunkInfo {
    pub fn place(&self) -> Place {
        Place::from_parts(self.tier, self.device)
    }
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
        for p in [TierPref::Auto, TierPref::Host, TierPref::Device, TierPref::DeviceOn(0), TierPref::DeviceOn(MAX_DEVICES - 1)] {
            assert_eq!(TierPref::from_code(p.code()), p);
            assert_eq!(TierPref::parse(&p.name()).unwrap(), p);
        }
        for code in [77, DEVICE_ON_CODE + MAX_DEVICES, u32::MAX] {
            assert_eq!(TierPref::from_code(code), TierPref::Auto);
        }
        for k in [ProviderKind::Host, ProviderKind::Cuda] {
            assert_ne!(k.code(), 0);
            assert_eq!(ProviderKind::from_code(k.code()), Some(k));
        }
        assert_eq!(ProviderKind::from_code(0), None);
    }

    /// `device:N` names one GPU; anything else that looks like it is a 22023 error.
    #[test]
    fn device_tiers_parse_strictly() {
        assert_eq!(TierPref::parse("device:3").unwrap(), TierPref::DeviceOn(3));
        for bad in ["device:", "device:-1", "device:+1", "device: 1", "device:16", "device:99999999999", "Device", "gpu:0"] {
            assert_eq!(TierPref::parse(bad).unwrap_err().code, Code::InvalidParameterValue, "{bad}");
        }
        assert!(TierPref::DeviceOn(2).holds(Place::Device(2)));
        assert!(!TierPref::DeviceOn(2).holds(Place::Device(1)));
        assert!(TierPref::Device.holds(Place::Device(5)) && !TierPref::Device.holds(Place::Host));
        assert!(TierPref::Host.holds(Place::Host) && !TierPref::Host.holds(Place::Device(0)));
        assert_eq!(Place::Device(1).to_string(), "device:1");
    }
}
