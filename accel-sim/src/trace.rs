//! Chrome trace-event JSON (opens in Perfetto / chrome://tracing): one process per core, one
//! thread (track) per engine.

use crate::isa::Engine;
use crate::timing::Interval;
use serde_json::{json, Value};

/// Collects timeline intervals of scheduled programs.
#[derive(Debug, Default, Clone)]
pub struct ChromeTrace {
    events: Vec<Value>,
    cores_named: std::collections::BTreeSet<u64>,
    /// Intervals dropped because the trace reached its size limit.
    pub dropped: u64,
}

/// Events kept at most, so a trace of a huge launch stays openable.
pub const MAX_TRACE_EVENTS: usize = 200_000;

impl ChromeTrace {
    /// Adds a program's intervals, offset by its start cycle on `core`.
    pub fn add_program(
        &mut self,
        core: u64,
        program: u64,
        start: u64,
        clock_ghz: f64,
        ivs: &[Interval],
    ) {
        if self.cores_named.insert(core) {
            self.events.push(json!({"name": "process_name", "ph": "M", "pid": core, "args": {"name": format!("core {core}")}}));
            for e in Engine::ALL {
                self.events.push(json!({"name": "thread_name", "ph": "M", "pid": core, "tid": e.index(), "args": {"name": e.name()}}));
            }
        }
        let us = |c: u64| c as f64 / (clock_ghz * 1e3);
        for iv in ivs {
            if self.events.len() >= MAX_TRACE_EVENTS {
                self.dropped += 1;
                continue;
            }
            self.events.push(json!({
                "name": iv.name, "ph": "X", "pid": core, "tid": iv.engine.index(),
                "ts": us(start + iv.start), "dur": us(iv.end - iv.start),
                "args": {"line": iv.line, "program": program, "start_cycle": start + iv.start, "cycles": iv.end - iv.start}
            }));
        }
    }

    /// The trace as a JSON string.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&json!({"traceEvents": self.events, "displayTimeUnit": "ns"}))
            .expect("trace serialises")
    }
}
