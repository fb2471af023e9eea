//! Cancellation: a statement interrupted from another session, and what it leaves pinned.

use crate::*;

/// How [`run_and_interrupt`] interrupts a statement.
#[derive(Debug, Clone, Copy)]
pub enum Interrupt {
    /// `pg_cancel_backend` from a second session, this long after the statement starts.
    Cancel(Duration),
    /// `statement_timeout` set to this for the statement (and reset after it).
    Timeout(Duration),
}

/// How a statement ended under [`run_and_interrupt`].
#[derive(Debug)]
pub struct Interrupted {
    pub how: Interrupt,
    /// The statement's outcome: an error (57014 when the interrupt worked), or `Ok` when it ended
    /// before the interrupt arrived (or ignored it).
    pub result: Result<(), postgres::Error>,
    /// From the interrupt (the cancel request sent, or the timeout expired) to the statement's
    /// return; zero when it returned first.
    pub after_interrupt: Duration,
    /// From the statement's start to its return.
    pub total: Duration,
}

impl Interrupted {
    /// The outcome, timings included, for assertion messages.
    pub fn describe(&self) -> String {
        let outcome = match &self.result {
            Ok(()) => "it completed".to_string(),
            Err(e) => describe(e),
        };
        format!(
            "{:?}: {outcome}, {} ms after the interrupt, {} ms in all",
            self.how,
            self.after_interrupt.as_millis(),
            self.total.as_millis()
        )
    }
}

/// Runs `sql` on `client` and interrupts it as `how` says, measuring how long it takes to give
/// up. With `Cancel`, a second connection sends `pg_cancel_backend` to `client`'s backend; the
/// clock for `after_interrupt` starts when the request has been sent.
pub fn run_and_interrupt(client: &mut Client, sql: &str, how: Interrupt) -> Interrupted {
    match how {
        Interrupt::Cancel(after) => {
            let pid = backend_pid(client);
            let mut other = connect();
            let start = Instant::now();
            let canceller = std::thread::spawn(move || {
                std::thread::sleep(after.saturating_sub(start.elapsed()));
                let sent: bool = other.query_one("SELECT pg_cancel_backend($1)", &[&pid]).expect("pg_cancel_backend").get(0);
                assert!(sent, "pg_cancel_backend({pid}) found no such backend");
                Instant::now()
            });
            let result = client.batch_execute(sql);
            let end = Instant::now();
            let sent_at = canceller.join().expect("the cancelling thread panicked");
            Interrupted { how, result, after_interrupt: end.saturating_duration_since(sent_at), total: end - start }
        }
        Interrupt::Timeout(t) => {
            client.batch_execute(&format!("SET statement_timeout = {}", t.as_millis().max(1))).expect("SET statement_timeout");
            let start = Instant::now();
            let result = client.batch_execute(sql);
            let total = start.elapsed();
            client.batch_execute("RESET statement_timeout").expect("RESET statement_timeout");
            Interrupted { how, result, after_interrupt: total.saturating_sub(t), total }
        }
    }
}

/// Asserts that `i` ended with SQLSTATE 57014 (query_canceled) at most `within` after the
/// interrupt.
#[track_caller]
pub fn assert_interrupted(what: &str, i: &Interrupted, within: Duration) {
    match &i.result {
        Err(e) if sqlstate(e).as_deref() == Some("57014") => {}
        _ => panic!("{what}: expected SQLSTATE 57014; {}", i.describe()),
    }
    assert!(i.after_interrupt <= within, "{what}: took longer than {within:?} to stop; {}", i.describe());
}

/// Pins held on segment `name` by any process (`uvm.attachments`).
pub fn pins_held(c: &mut Client, name: &str) -> i64 {
    c.query_one("SELECT coalesce(sum(pins), 0)::bigint FROM uvm.attachments WHERE segment = $1", &[&name])
        .unwrap_or_else(|e| panic!("uvm.attachments for {name}: {}", describe(&e)))
        .get(0)
}
