//! Tuned tile configurations: what `day0 tune --model` measured as the fastest configuration of
//! each tunable launch a model makes, and what the forward pass then launches instead of its
//! heuristic tiles.
//!
//! A call site whose tiles are pure performance knobs (every declared value computes the same
//! numbers: the kernel masks partial tiles) asks [`crate::Launcher::tiles`] with the kernel, a
//! *launch key* that names the shapes the launch depends on (`m=8192,n=7168,k=2048`) and its
//! heuristic configuration. The launcher answers from its [`Tuning`] table when the table holds
//! that launch, else with the heuristic; a recording table also remembers every question, which
//! is how the tuner finds the launches of a model without a list of its own.

use crate::launch::Config;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Kernel name and launch key.
type LaunchId = (String, String);

/// A table of tuned configurations, optionally recording the launches it is asked about.
#[derive(Debug, Default)]
pub struct Tuning {
    table: BTreeMap<LaunchId, Config>,
    /// Each launch asked about, with the heuristic configuration it would run (`None`: not
    /// recording).
    asked: Option<Mutex<BTreeMap<LaunchId, Config>>>,
}

impl Tuning {
    /// An empty table (every launch keeps its heuristic tiles).
    pub fn new() -> Tuning {
        Tuning::default()
    }

    /// An empty table that records every launch it is asked about ([`Tuning::asked`]).
    pub fn recording() -> Tuning {
        Tuning {
            table: BTreeMap::new(),
            asked: Some(Mutex::new(BTreeMap::new())),
        }
    }

    /// Sets the configuration of `kernel`'s launch at `key`.
    pub fn insert(&mut self, kernel: &str, key: &str, config: Config) {
        self.table
            .insert((kernel.to_string(), key.to_string()), config);
    }

    /// The tuned configuration of `kernel`'s launch at `key`, if the table holds one.
    pub fn get(&self, kernel: &str, key: &str) -> Option<&Config> {
        self.table.get(&(kernel.to_string(), key.to_string()))
    }

    /// Launches in the table.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the table holds no launch.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The configuration `kernel`'s launch at `key` runs: the table's, else `heuristic`. A
    /// recording table remembers the question.
    pub fn choose(&self, kernel: &str, key: &str, heuristic: Config) -> Config {
        if let Some(asked) = &self.asked {
            asked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry((kernel.to_string(), key.to_string()))
                .or_insert_with(|| heuristic.clone());
        }
        self.get(kernel, key).cloned().unwrap_or(heuristic)
    }

    /// Every launch a recording table was asked about: (kernel, key, heuristic configuration),
    /// sorted by kernel and key; empty when not recording.
    pub fn asked(&self) -> Vec<(String, String, Config)> {
        self.asked.as_ref().map_or_else(Vec::new, |a| {
            a.lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|((k, key), c)| (k.clone(), key.clone(), c.clone()))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_answers_its_launches_and_the_heuristic_the_rest() {
        let mut t = Tuning::new();
        t.insert("linear_fp8", "m=8,n=8,k=8", Config::new().with("BM", 16));
        let h = Config::new().with("BM", 64);
        assert_eq!(
            t.choose("linear_fp8", "m=8,n=8,k=8", h.clone()).get("BM"),
            Some(16)
        );
        assert_eq!(t.choose("linear_fp8", "m=9,n=8,k=8", h.clone()), h);
        assert_eq!(t.choose("other", "m=8,n=8,k=8", h.clone()), h);
        assert!(t.asked().is_empty(), "not recording");
    }

    #[test]
    fn a_recording_table_remembers_each_launch_once_with_its_heuristic() {
        let t = Tuning::recording();
        let h = Config::new().with("BM", 64);
        t.choose("b", "k=1", h.clone());
        t.choose("a", "k=2", Config::new().with("BM", 32));
        t.choose("b", "k=1", Config::new().with("BM", 16));
        let asked = t.asked();
        assert_eq!(asked.len(), 2);
        assert_eq!(asked[0].0, "a");
        assert_eq!(
            (asked[1].1.as_str(), asked[1].2.get("BM")),
            ("k=1", Some(64))
        );
    }
}
