//! A segment's mapping in one process: the reservation, the chunks mapped in it, and which of
//! them kernels may read.
//!
//! A [`Mapping`] is shared (`Rc`) by the process's [`Attachment`] to the segment and by every
//! [`super::Pin`] on it, and is unmapped when the last of them goes: detaching while a guard is
//! alive (`detach_all` at process exit) leaves the guard's memory mapped until the guard is
//! dropped. The provider maps and unmaps only inside the mapping's [`Reservation`], never at a
//! raw address. Chunks are mapped lazily by the manager (`Segments`, in `mod.rs`) when the
//! generation moves; those whose provider needs it (the GPU service's memfd host chunks under
//! CUDA) are registered for kernels at the first kernel address asked for
//! ([`Mapping::ready_for_kernels`]), and the registrations go with their chunk's unmapping.

use std::cell::{Cell, RefCell};
use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::sync::Arc;

use crate::error::Result;
use crate::provider::{Provider, Reservation};
use crate::registry::{ChunkInfo, Tier};

/// One reservation of this process and the chunks mapped in it. The attachment and every
/// [`super::Pin`] on it share it (`Rc`), so the memory stays mapped until the last of them is gone, even
/// if the attachment is detached while a pin is still alive (process exit).
pub(super) struct Mapping {
    pub(super) provider: Arc<dyn Provider>,
    /// `Some` until `drop` gives it back.
    pub(super) reservation: Option<Reservation>,
    /// Chunks mapped in the reservation, by offset.
    pub(super) mapped: RefCell<Vec<ChunkInfo>>,
    /// A `cpu` segment's mapping: its chunks are memfds, mapped for the CPU alone whatever the
    /// provider (`Provider::map_memfd_chunk`), and no kernel is given their addresses.
    pub(super) cpu_only: bool,
    /// Ids of the mapped chunks that `Provider::register_for_kernels` made ready for kernels
    /// (only chunks whose provider needs it: the GPU service's memfd host chunks under CUDA).
    pub(super) registered: RefCell<Vec<u64>>,
    /// Every mapped chunk is ready for kernels (set by `ready_for_kernels`, cleared when a chunk
    /// is mapped): `Pin::addr` runs for every kernel's address, and the look through the
    /// chunks is then skipped.
    pub(super) ready: Cell<bool>,
}

impl Mapping {
    pub(super) fn reservation(&self) -> &Reservation {
        self.reservation.as_ref().expect("released only in drop")
    }
    pub(super) fn addr(&self) -> u64 {
        self.reservation().addr()
    }
    pub(super) fn map(&self, fd: BorrowedFd<'_>, c: &ChunkInfo) -> Result<()> {
        self.ready.set(false);
        if self.cpu_only {
            self.provider.map_memfd_chunk(fd, self.reservation(), c.offset, c.size)?;
        } else {
            self.provider.map_chunk(fd, c.tier, self.reservation(), c.offset, c.size)?;
        }
        let mut mapped = self.mapped.borrow_mut();
        mapped.push(*c);
        mapped.sort_by_key(|c| c.offset);
        Ok(())
    }
    pub(super) fn unmap(&self, c: &ChunkInfo) {
        unmap_from(self.provider.as_ref(), self.cpu_only, self.reservation(), c);
        self.mapped.borrow_mut().retain(|m| m != c);
        self.registered.borrow_mut().retain(|&id| id != c.id);
    }
    /// Makes every mapped chunk readable by kernels at its address, registering those that need
    /// it and are not yet (`Provider::needs_kernel_registration`): 0.16-0.23 s a GiB under
    /// CUDA on the H100, paid by the first kernel over a host-tier chunk this process mapped (a
    /// migration to the host tier registers nothing on its path). Answers cancel between chunks.
    pub(super) fn ready_for_kernels(&self) -> Result<()> {
        if self.cpu_only || self.ready.get() {
            return Ok(());
        }
        let todo: Vec<ChunkInfo> = {
            let registered = self.registered.borrow();
            let mapped = self.mapped.borrow();
            mapped
                .iter()
                .filter(|c| self.provider.needs_kernel_registration(c.tier) && !registered.contains(&c.id))
                .copied()
                .collect()
        };
        for c in todo {
            crate::interrupt::check()?;
            self.provider.register_for_kernels(self.reservation(), c.offset, c.size, c.tier)?;
            self.registered.borrow_mut().push(c.id);
        }
        self.ready.set(true);
        Ok(())
    }
    /// Whether the CPU addresses this mapping's chunks of `tier`: a `cpu` segment's always,
    /// others where the provider gives the CPU that tier.
    pub(super) fn cpu_accessible(&self, tier: Tier) -> bool {
        self.cpu_only || self.provider.cpu_accessible(tier)
    }
}

/// Unmaps chunk `c` of a mapping (`cpu_only`: a `cpu` segment's memfd).
fn unmap_from(provider: &dyn Provider, cpu_only: bool, r: &Reservation, c: &ChunkInfo) {
    if cpu_only {
        provider.unmap_memfd_chunk(r, c.offset, c.size);
    } else {
        provider.unmap_chunk(r, c.offset, c.size, c.tier);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let Some(r) = self.reservation.take() else { return };
        for c in self.mapped.get_mut().drain(..) {
            unmap_from(self.provider.as_ref(), self.cpu_only, &r, &c);
        }
        self.provider.release_reservation(r);
    }
}

/// A segment mapped in this process (read-only to other modules: the reservation in it is what
/// every pin's memory lives in).
pub struct Attachment {
    pub(super) segment_id: u64,
    pub(super) mapping: Rc<Mapping>,
    pub(super) generation: u64,
    pub(super) att_slot: u32,
    pub(super) same_address: bool,
}

impl Attachment {
    pub fn segment_id(&self) -> u64 {
        self.segment_id
    }
    /// Where the segment is mapped in this process.
    pub fn base(&self) -> u64 {
        self.mapping.addr()
    }
    /// The generation whose chunks are mapped.
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// The chunks mapped, by offset.
    pub fn mapped(&self) -> Vec<ChunkInfo> {
        self.mapping.mapped.borrow().clone()
    }
    pub fn same_address(&self) -> bool {
        self.same_address
    }
    pub(super) fn overlaps(&self, addr: u64, size: u64) -> bool {
        let r = self.mapping.reservation();
        r.addr() < addr.saturating_add(size) && addr < r.addr() + r.size()
    }
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment")
            .field("segment_id", &self.segment_id)
            .field("base", &format_args!("0x{:x}", self.base()))
            .field("generation", &self.generation)
            .field("att_slot", &self.att_slot)
            .field("same_address", &self.same_address)
            .finish()
    }
}
