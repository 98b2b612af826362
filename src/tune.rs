//! Tile-shape sweeps: run every configuration of a kernel's tunable space cost-only and rank them.
//!
//! A configuration whose tiles do not fit in SRAM (or that the device cannot run) is kept in the
//! result with its error, counted as infinitely slow rather than failing the sweep.

use accel_sim::{Report, SimError};
use dsl_core::Config;

/// One point of a sweep.
#[derive(Debug)]
pub struct SweepPoint {
    /// The tunable values.
    pub config: Config,
    /// The report, or why the configuration cannot run.
    pub outcome: Result<Report, SimError>,
}

/// Runs `launch` for every configuration and sorts: fitting ones by cycles (ties by config order),
/// then the ones that failed.
pub fn sweep(
    space: Vec<Config>,
    mut launch: impl FnMut(&Config) -> Result<Report, SimError>,
) -> Vec<SweepPoint> {
    let mut points: Vec<SweepPoint> = space
        .into_iter()
        .map(|config| {
            let outcome = launch(&config);
            SweepPoint { config, outcome }
        })
        .collect();
    points.sort_by_key(|p| match &p.outcome {
        Ok(r) => (0, r.cycles),
        Err(_) => (1, 0),
    });
    points
}

/// The fastest configuration that runs, if any.
pub fn best(points: &[SweepPoint]) -> Option<&SweepPoint> {
    points.iter().find(|p| p.outcome.is_ok())
}
