//! The registry (see `uvm_core::registry`: its layout and operations, plain Rust): here only its
//! home in PostgreSQL's shared memory, `shmem`.

pub use uvm_core::registry::*;

pub mod shmem;
