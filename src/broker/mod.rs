//! The broker (see `uvm_core::broker`: why, its lifecycle, protocol, server and client): here
//! only its background worker, the part that talks to PostgreSQL.

pub use uvm_core::broker::*;

pub mod worker;
