//! Migrations between tiers under concurrent readers, against the suite's second cluster, which
//! simulates a GPU with memfd device chunks (`connect_tiers`), in the execution mode of the run
//! (`make integration`: process; `make integration-service`: the GPU service).
//!
//! Issue 25 point 2: on the H200, four sessions checksumming a segment in a loop kept every move
//! to the device from starting ("still in use after 10000 ms"): a migration needs the pins to
//! drain, and the readers' pins overlapped. A migration that waits now queues, and new pins wait
//! behind it. The GPU suite runs the held-out shape over 2 GiB on the H200.

use pg_uvm_share_tests::*;

/// Readers that hand over (each lets go of its pin only once another holds one) leave the
/// segment free at no moment: without the queue every move fails after pin_wait_timeout
/// (measured before the fix: 6 of 6 failed with 55P03, in both modes).
#[test]
fn migrations_are_not_starved_by_readers_handing_over() {
    let counts = migrations_under_readers(connect_tiers, 16 << 20, 3, Readers::HandingOver, 6);
    eprintln!("checksums per reader: {counts:?}");
    assert!(counts.iter().all(|&n| n > 0), "every reader read: {counts:?}");
}

/// The held-out shape (four readers pausing 50 ms between checksums), smaller: here the pins
/// drain by chance often enough, so this checks the answers under moves more than the queue.
#[test]
fn migrations_under_pausing_readers_keep_every_checksum() {
    let counts = migrations_under_readers(connect_tiers, 64 << 20, 4, Readers::Pausing, 10);
    eprintln!("checksums per reader: {counts:?}");
    assert!(counts.iter().all(|&n| n > 0), "every reader read: {counts:?}");
}

/// The simulated GPU is there: the tests above move between two tiers, not within one.
#[test]
fn the_tiers_cluster_simulates_a_gpu() {
    let mut c = connect_tiers();
    assert_eq!(device_info_value(&mut c, "gpus").as_deref(), Some("1"), "{:?}", device_info(&mut c));
    let mode: String = c.query_one("SHOW pg_uvm_share.gpu_execution", &[]).unwrap().get(0);
    let want = std::env::var("UVM_EXPECT_EXECUTION").unwrap_or_default();
    assert!(mode == want || (want == "process" && mode == "auto"), "gpu_execution {mode}, expected {want}");
}
