//! A role without grants can neither create segments nor read a superuser's segment.

use pg_uvm_share_tests::*;

#[test]
fn unprivileged_role_is_refused() {
    let role = unique_name("role");
    let seg = unique_name("priv");
    let mine = unique_name("priv_mine");
    let _guard = SegmentGuard::with(&[&seg, &mine]);
    let mut su = connect();
    su.batch_execute(&format!("DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN")).expect("create role");

    let result = std::panic::catch_unwind(|| {
        let mut su = connect();
        create_segment(&mut su, &seg, MIB as i64);
        write_segment(&mut su, &seg, 0, b"secret");

        let mut user = connect_as(&role);
        let is_super: bool = user.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = current_user", &[]).unwrap().get(0);
        assert!(!is_super, "test role must not be a superuser");

        expect_sqlstate(
            user.query_one("SELECT uvm.create_segment($1, $2)", &[&mine, &(MIB as i64)]),
            "42501",
            "create_segment by a role without grants",
        );
        expect_sqlstate(
            user.query_one("SELECT uvm.read_segment($1, 0::bigint, 6)", &[&seg]),
            "42501",
            "read_segment of a superuser's segment",
        );
        // The superuser still reads it, and the role created nothing.
        assert_eq!(read_segment(&mut su, &seg, 0, 6), b"secret");
        assert!(segment_row(&mut su, &mine).is_none(), "refused create left a segment behind");
        drop(user);
        drop_segment(&mut su, &seg);
    });

    // Clean up the role whatever happened (its sessions are closed by now).
    let _ = su.batch_execute(&format!("DROP ROLE IF EXISTS {role}"));
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
