//! raft-rs logs through `slog`; this drain hands its records to `tracing`, so one subscriber
//! sees everything. raft-rs's debug chatter (every message stepped) stays at `debug`.

use slog::{Drain, KV, OwnedKVList, Record, Serializer};

struct TracingDrain;

/// Collects a record's key-values as `k=v` text.
struct Fields(String);

impl Serializer for Fields {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments) -> slog::Result {
        use std::fmt::Write;
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut fields = Fields(String::new());
        let _ = record.kv().serialize(record, &mut fields);
        let _ = values.serialize(record, &mut fields);
        let msg = record.msg();
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{msg}{}", fields.0)
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{msg}{}", fields.0),
            slog::Level::Info => tracing::info!(target: "raft", "{msg}{}", fields.0),
            slog::Level::Debug | slog::Level::Trace => {
                tracing::debug!(target: "raft", "{msg}{}", fields.0)
            }
        }
        Ok(())
    }
}

/// The logger handed to raft-rs.
pub fn logger() -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!())
}
