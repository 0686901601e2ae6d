//! Helpers for the stage tests: a collecting sink and a bounded run.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leda_core::prelude::*;

/// What a sink received: one `Vec<Value>` per event.
pub type Got = Arc<Mutex<Vec<Vec<Value>>>>;

/// A serial stage that records every event it receives.
pub fn sink(name: &str) -> (Stage, Got) {
    let got: Got = Arc::default();
    let g = got.clone();
    let s = Stage::new(name, move |ev: Event, _: &mut Ctx| {
        g.lock().unwrap().push(ev.args().to_vec());
        Ok(())
    })
    .serial();
    (s, got)
}

/// Runs until idle (10 s at most) on two threads.
pub fn run(g: &Graph) -> RunReport {
    g.run(
        Run::default()
            .threads(2)
            .until_idle()
            .timeout(Duration::from_secs(10)),
    )
    .expect("run")
}

/// The message of a run refused before it starts (by a `bind`).
pub fn refused(g: &Graph) -> String {
    match g.run(
        Run::default()
            .threads(1)
            .until_idle()
            .timeout(Duration::from_secs(5)),
    ) {
        Ok(r) => panic!("the run was not refused: {:?}", r.reason),
        Err(e) => e.to_string(),
    }
}

/// Taken values.
pub fn take(got: &Got) -> Vec<Vec<Value>> {
    std::mem::take(&mut *got.lock().unwrap())
}

/// A string value.
pub fn s(x: &str) -> Value {
    Value::Str(x.to_owned())
}

/// An array of ints.
pub fn ints(xs: &[i64]) -> Value {
    Value::Array(xs.iter().map(|&x| Value::Int(x)).collect())
}
