//! A log subscriber's output kept in memory, for tests that check what the runtime logs
//! (each in a test binary of its own: the subscriber is global).

use std::io::Write;
use std::sync::{Arc, Mutex};

/// What the subscriber wrote.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    /// Installs a subscriber at `filter` writing here; returns this log.
    pub fn install(filter: &str) -> Log {
        let log = Log::default();
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(log.clone())
            .with_ansi(false)
            .init();
        log
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;
    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}
