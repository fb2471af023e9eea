//! `#[pg_test]`s: single-backend behaviour inside a real PostgreSQL started by `cargo pgrx test`
//! with the library preloaded (see `crate::pg_test`). Multi-process behaviour is tested by the
//! integration suite (tests/integration) against a cluster of its own.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one<T: pgrx::FromDatum + pgrx::IntoDatum>(q: &str) -> T {
        Spi::get_one::<T>(q).expect("query failed").expect("NULL result")
    }

    #[pg_test]
    fn create_write_read_drop() {
        Spi::run("CREATE EXTENSION IF NOT EXISTS pg_uvm_share").unwrap();
        let id: i64 = one("SELECT uvm.create_segment('t_a', 10000)");
        assert!(id > 0);
        assert_eq!(one::<i64>("SELECT uvm.write_segment('t_a', 5000, '\\x0a0b0c'::bytea)"), 3);
        assert_eq!(one::<Vec<u8>>("SELECT uvm.read_segment('t_a', 4999, 5)"), vec![0, 10, 11, 12, 0]);
        assert_eq!(one::<i64>("SELECT size FROM uvm.segments WHERE name = 't_a'"), 10000);
        Spi::run("SELECT uvm.drop_segment('t_a')").unwrap();
        assert_eq!(one::<i64>("SELECT count(*) FROM uvm.segments WHERE name = 't_a'"), 0);
    }

    #[pg_test]
    fn checksum_matches_the_cpu_definition() {
        Spi::run("CREATE EXTENSION IF NOT EXISTS pg_uvm_share").unwrap();
        Spi::run("SELECT uvm.create_segment('t_c', 4096)").unwrap();
        Spi::run("SELECT uvm.write_segment('t_c', 0, decode(repeat('00ff', 100), 'hex'))").unwrap();
        let got: i64 = one("SELECT uvm.checksum_segment('t_c', 0, 4096)");
        let mut bytes = vec![0u8; 4096];
        for i in 0..100 {
            bytes[2 * i + 1] = 0xff;
        }
        assert_eq!(got as u64, crate::checksum::checksum(&bytes, 0));
        Spi::run("SELECT uvm.drop_segment('t_c')").unwrap();
    }

    #[pg_test]
    fn growth_keeps_data_and_maps_new_chunks() {
        Spi::run("CREATE EXTENSION IF NOT EXISTS pg_uvm_share").unwrap();
        Spi::run("SELECT uvm.create_segment('t_g', 100)").unwrap();
        Spi::run("SELECT uvm.write_segment('t_g', 0, '\\x2a'::bytea)").unwrap();
        for size in [3_000_000i64, 7_000_000, 40_000_000] {
            assert_eq!(one::<i64>(&format!("SELECT uvm.grow_segment('t_g', {size})")), size);
            Spi::run(&format!("SELECT uvm.write_segment('t_g', {}, '\\x07'::bytea)", size - 1)).unwrap();
            assert_eq!(one::<Vec<u8>>(&format!("SELECT uvm.read_segment('t_g', {}, 1)", size - 1)), vec![7]);
        }
        assert_eq!(one::<Vec<u8>>("SELECT uvm.read_segment('t_g', 0, 1)"), vec![42]);
        assert!(one::<i32>("SELECT chunks FROM uvm.segments WHERE name = 't_g'") >= 3);
        let gen: i64 = one("SELECT generation FROM uvm.segments WHERE name = 't_g'");
        let mapped: i64 = one("SELECT mapped_generation FROM uvm.attachments WHERE segment = 't_g' AND pid = pg_backend_pid()");
        assert_eq!(gen, mapped);
        Spi::run("SELECT uvm.drop_segment('t_g')").unwrap();
    }

    #[pg_test(error = "segment \"t_p\" is in use")]
    fn pinned_segment_cannot_be_dropped() {
        Spi::run("CREATE EXTENSION IF NOT EXISTS pg_uvm_share").unwrap();
        Spi::run("SELECT uvm.create_segment('t_p', 100)").unwrap();
        Spi::run("SELECT uvm.pin_segment('t_p')").unwrap();
        Spi::run("SELECT uvm.drop_segment('t_p')").unwrap();
    }

    #[pg_test(error = "range [90, 90 + 20) is outside segment \"t_r\" of 100 bytes")]
    fn reads_past_the_end_fail() {
        Spi::run("CREATE EXTENSION IF NOT EXISTS pg_uvm_share").unwrap();
        Spi::run("SELECT uvm.create_segment('t_r', 100)").unwrap();
        Spi::run("SELECT uvm.read_segment('t_r', 90, 20)").unwrap();
    }

    #[pg_test]
    fn device_info_names_the_host_provider_and_broker() {
        Spi::run("CREATE EXTENSION IF NOT EXISTS pg_uvm_share").unwrap();
        assert_eq!(one::<String>("SELECT value FROM uvm.device_info() WHERE property = 'provider'"), "host");
        let pid: String = one("SELECT value FROM uvm.device_info() WHERE property = 'broker_pid'");
        assert!(pid.parse::<i32>().unwrap() > 0);
        assert_eq!(one::<i64>("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_uvm_share broker'"), 1);
    }
}
