//! Cluster presets: many cards of one device, their links and topology, as data.
//!
//! A cluster is `nodes × cards_per_node` cards of one device preset (see [`crate::preset`]),
//! joined inside a node by an intra-node link (NVLink/NVSwitch, HCCS...) and across nodes by a
//! scale-out network (InfiniBand, RoCE). Every figure comes from a TOML file
//! (`accel-sim/clusters/*.toml`) with its public source in a comment, exactly like device
//! presets. Built-in clusters are embedded in the binary; any other `FILE.toml` with the same
//! schema loads from disk. Collective costs over a cluster live in [`crate::collective`].

use crate::error::SimError;
use crate::preset::DevicePreset;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How the cards of one node are wired to each other.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// A switch (NVSwitch): any pair of cards talks at the card's full bandwidth.
    Switch,
    /// A physical ring: each card reaches its two neighbours directly; other cards are
    /// reached by forwarding through the cards in between.
    Ring,
    /// A direct link to every other card of the node (HCCS on Atlas A2): the card's bandwidth
    /// is split evenly over its `cards_per_node − 1` peer links.
    FullMesh,
}

impl Topology {
    /// The name used in TOML files (`switch`, `ring`, `full_mesh`).
    pub fn name(self) -> &'static str {
        match self {
            Topology::Switch => "switch",
            Topology::Ring => "ring",
            Topology::FullMesh => "full_mesh",
        }
    }
}

/// The links joining the cards of one node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IntraLink {
    /// How the node's cards are wired.
    pub topology: Topology,
    /// Nominal bandwidth of one card's intra-node links, all links together, per direction,
    /// in GB/s (10^9 bytes per second).
    pub bandwidth_gbps: f64,
    /// Fixed cost of one collective step (one message hop) in microseconds: the α of α–β.
    pub latency_us: f64,
    /// Achieved over nominal bandwidth, in (0, 1]; the cost model multiplies it in.
    pub efficiency: f64,
    /// The published achieved bandwidth per card and direction (GB/s), where one exists; kept
    /// for the record next to `efficiency`, never used by the cost model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achieved_gbps: Option<f64>,
}

/// The scale-out network joining nodes (one NIC per card, a non-blocking fabric).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InterLink {
    /// Nominal bandwidth of one card's network port, per direction, in GB/s.
    pub bandwidth_gbps: f64,
    /// Fixed cost of one collective step across the network in microseconds.
    pub latency_us: f64,
    /// Achieved over nominal bandwidth, in (0, 1]; the cost model multiplies it in.
    pub efficiency: f64,
    /// The published achieved bandwidth per card and direction (GB/s), where one exists; kept
    /// for the record, never used by the cost model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achieved_gbps: Option<f64>,
}

/// A multi-card cluster described by published figures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterPreset {
    /// Short name (`h800`).
    pub name: String,
    /// One line saying what this cluster is.
    pub description: String,
    /// The device preset of every card: a built-in name (`h800`) or a path to a `.toml` file
    /// (a relative path in a cluster file is taken relative to that file's folder).
    pub device: String,
    /// Number of nodes (the file's figure is the default; see [`ClusterPreset::with_nodes`]).
    pub nodes: usize,
    /// Cards in each node.
    pub cards_per_node: usize,
    /// Links inside a node.
    pub intra: IntraLink,
    /// Network between nodes.
    pub inter: InterLink,
}

/// Built-in cluster presets: (name, TOML text).
const BUILTIN: &[(&str, &str)] = &[
    ("h200-node", include_str!("../clusters/h200-node.toml")),
    ("h800", include_str!("../clusters/h800.toml")),
    ("npu-910b", include_str!("../clusters/npu-910b.toml")),
];

impl ClusterPreset {
    /// Names of the cluster presets compiled into day0.
    pub fn names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _)| *n).collect()
    }

    /// Loads a built-in cluster by name, or a TOML file if `name_or_path` ends in `.toml`.
    pub fn load(name_or_path: &str) -> Result<ClusterPreset, SimError> {
        if name_or_path.ends_with(".toml") {
            return Self::from_file(Path::new(name_or_path));
        }
        match BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            Some((n, text)) => Self::from_toml(n, text),
            None => Err(SimError::Cluster {
                source: name_or_path.to_string(),
                field: None,
                message: format!(
                    "no such cluster preset; built-in clusters are {} (or pass a path to a .toml file)",
                    Self::names().join(", ")
                ),
            }),
        }
    }

    /// Loads a user's own cluster file (same schema as `accel-sim/clusters/*.toml`). A relative
    /// `device = "x.toml"` path inside it is resolved against the file's folder, so a cluster
    /// file and its device file can travel together.
    pub fn from_file(path: &Path) -> Result<ClusterPreset, SimError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Cluster {
            source: source.clone(),
            field: None,
            message: format!("cannot read file: {e}"),
        })?;
        let base = path.parent().unwrap_or_else(|| Path::new(""));
        Self::parse(&source, &text, Some(base))
    }

    /// Parses and validates a cluster from TOML text; `source` names it in errors. A relative
    /// device path is taken as given (relative to the working directory).
    pub fn from_toml(source: &str, text: &str) -> Result<ClusterPreset, SimError> {
        Self::parse(source, text, None)
    }

    fn parse(source: &str, text: &str, base: Option<&Path>) -> Result<ClusterPreset, SimError> {
        let mut c: ClusterPreset = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            SimError::Cluster {
                source: source.to_string(),
                field: field_of_toml_error(&msg),
                message: msg,
            }
        })?;
        if let Some(base) = base {
            // Why: a cluster file naming `my-card.toml` means the file beside it, not one in
            // whatever directory day0 happens to run from.
            if c.device.ends_with(".toml") && Path::new(&c.device).is_relative() {
                c.device = base.join(&c.device).display().to_string();
            }
        }
        c.validate(source)?;
        Ok(c)
    }

    fn validate(&self, source: &str) -> Result<(), SimError> {
        let bad = |field: &str, message: String| SimError::Cluster {
            source: source.to_string(),
            field: Some(field.to_string()),
            message,
        };
        if self.nodes == 0 {
            return Err(bad("nodes", "must be at least 1".into()));
        }
        if self.cards_per_node == 0 {
            return Err(bad("cards_per_node", "must be at least 1".into()));
        }
        for (f, v) in [
            ("intra.bandwidth_gbps", self.intra.bandwidth_gbps),
            ("inter.bandwidth_gbps", self.inter.bandwidth_gbps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(
                    f,
                    format!("must be a positive number of GB/s, got {v}"),
                ));
            }
        }
        for (f, v) in [
            ("intra.latency_us", self.intra.latency_us),
            ("inter.latency_us", self.inter.latency_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(
                    f,
                    format!("must be a non-negative number of microseconds, got {v}"),
                ));
            }
        }
        for (f, v) in [
            ("intra.efficiency", self.intra.efficiency),
            ("inter.efficiency", self.inter.efficiency),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 1.0) {
                return Err(bad(
                    f,
                    format!("must be in (0, 1] (achieved / nominal bandwidth), got {v}"),
                ));
            }
        }
        for (f, v) in [
            ("intra.achieved_gbps", self.intra.achieved_gbps),
            ("inter.achieved_gbps", self.inter.achieved_gbps),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return Err(bad(
                        f,
                        format!("must be a positive number of GB/s, got {v}"),
                    ));
                }
            }
        }
        DevicePreset::load(&self.device).map_err(|e| {
            bad(
                "device",
                format!("cannot load device preset `{}`: {e}", self.device),
            )
        })?;
        Ok(())
    }

    /// One card of `device` (a preset name or `.toml` path) and nothing to talk to: what a
    /// single-device cost-only run is planned on. Its links are never used (every group has one
    /// rank) and carry the device preset's own link figures.
    pub fn single_card(device: &str) -> Result<ClusterPreset, SimError> {
        let d = DevicePreset::load(device)?;
        let link = |gbps: f64, us: f64| {
            format!("bandwidth_gbps = {gbps}\nlatency_us = {us}\nefficiency = 1.0\n")
        };
        let text = format!(
            "name = \"single-{name}\"\ndescription = \"one {name} card\"\ndevice = \"{device}\"\nnodes = 1\ncards_per_node = 1\n[intra]\ntopology = \"switch\"\n{intra}[inter]\n{inter}",
            name = d.name,
            device = device,
            intra = link(d.link.bandwidth_gbps, d.link.latency_us),
            inter = link(d.link.bandwidth_gbps, d.link.latency_us),
        );
        Self::from_toml(&format!("single card of {device}"), &text)
    }

    /// This cluster with `nodes` nodes (any count ≥ 1); an error for 0.
    pub fn with_nodes(&self, nodes: usize) -> Result<ClusterPreset, SimError> {
        if nodes == 0 {
            return Err(SimError::Cluster {
                source: self.name.clone(),
                field: Some("nodes".into()),
                message: "a cluster needs at least 1 node".into(),
            });
        }
        Ok(ClusterPreset {
            nodes,
            ..self.clone()
        })
    }

    /// Total cards: `nodes × cards_per_node`.
    pub fn cards(&self) -> usize {
        self.nodes.saturating_mul(self.cards_per_node)
    }

    /// The device preset of every card.
    pub fn device_preset(&self) -> Result<DevicePreset, SimError> {
        DevicePreset::load(&self.device)
    }

    /// Peer links of one card on a `full_mesh` node (`cards_per_node − 1`, at least 1 so a
    /// one-card node never divides by zero).
    pub fn mesh_peers(&self) -> usize {
        self.cards_per_node.saturating_sub(1).max(1)
    }

    /// Achieved bytes per second one card can push into the node, all its links together
    /// (nominal × efficiency).
    pub fn intra_card_bytes_per_s(&self) -> f64 {
        self.intra.bandwidth_gbps * 1e9 * self.intra.efficiency
    }

    /// Achieved bytes per second one card gets towards a single peer while every card does
    /// the same (a ring or tree step): the whole card on a switch and (neighbour) ring, one
    /// peer link (card / peers) on a full mesh.
    pub fn intra_pair_bytes_per_s(&self) -> f64 {
        match self.intra.topology {
            Topology::Switch | Topology::Ring => self.intra_card_bytes_per_s(),
            Topology::FullMesh => self.intra_card_bytes_per_s() / self.mesh_peers() as f64,
        }
    }

    /// Achieved bytes per second of one card's network port (nominal × efficiency).
    pub fn inter_card_bytes_per_s(&self) -> f64 {
        self.inter.bandwidth_gbps * 1e9 * self.inter.efficiency
    }

    /// α of one intra-node step, in seconds.
    pub fn intra_latency_s(&self) -> f64 {
        self.intra.latency_us * 1e-6
    }

    /// α of one inter-node step, in seconds.
    pub fn inter_latency_s(&self) -> f64 {
        self.inter.latency_us * 1e-6
    }
}

/// Pulls the field name out of serde/toml messages such as "missing field `nodes`".
fn field_of_toml_error(msg: &str) -> Option<String> {
    let start = msg.find('`')? + 1;
    let end = start + msg[start..].find('`')?;
    Some(msg[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_builtins_load() {
        for name in ClusterPreset::names() {
            let c = ClusterPreset::load(name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.name, name);
            assert!(c.device_preset().is_ok());
        }
        let h200 = ClusterPreset::load("h200-node").unwrap();
        assert_eq!((h200.nodes, h200.cards_per_node, h200.cards()), (1, 8, 8));
        assert_eq!(h200.intra.topology, Topology::Switch);
        assert_eq!(h200.intra.bandwidth_gbps, 450.0);
        assert_eq!(h200.inter.bandwidth_gbps, 50.0);
        let h800 = ClusterPreset::load("h800").unwrap();
        assert_eq!((h800.nodes, h800.cards()), (4, 32));
        assert_eq!(h800.intra.bandwidth_gbps, 200.0);
        assert_eq!(h800.intra.achieved_gbps, Some(160.0));
        assert_eq!(h800.intra.efficiency, 160.0 / 200.0);
        assert_eq!(h800.intra_card_bytes_per_s(), 160e9);
        let npu = ClusterPreset::load("npu-910b").unwrap();
        assert_eq!(npu.intra.topology, Topology::FullMesh);
        assert_eq!((npu.nodes, npu.cards()), (4, 32));
        // 196 GB/s per direction over 7 peer links: 28 GB/s nominal per link.
        assert_eq!(npu.mesh_peers(), 7);
        let link = npu.intra_pair_bytes_per_s() / npu.intra.efficiency;
        assert!((link - 28e9).abs() < 1e-3, "{link}");
        assert_eq!(npu.inter.bandwidth_gbps, 25.0);
    }

    #[test]
    fn cluster_unknown_name_lists_builtins() {
        let s = ClusterPreset::load("tpu-pod").unwrap_err().to_string();
        assert!(s.contains("h200-node") && s.contains("npu-910b"), "{s}");
    }

    #[test]
    fn cluster_bad_file_errors_name_file_and_field() {
        // A misspelt field: the error names it.
        let text = BUILTIN[1].1.replace("cards_per_node", "cards_per_nod");
        match ClusterPreset::from_toml("edited.toml", &text).unwrap_err() {
            SimError::Cluster { source, field, .. } => {
                assert_eq!(source, "edited.toml");
                assert!(field.as_deref().unwrap_or("").starts_with("cards_per_nod"));
            }
            other => panic!("unexpected {other}"),
        }
        // A missing field.
        let text = BUILTIN[1].1.replacen("efficiency = 0.8 ", "# ", 1);
        let s = ClusterPreset::from_toml("e.toml", &text)
            .unwrap_err()
            .to_string();
        assert!(s.contains("e.toml") && s.contains("efficiency"), "{s}");
        // An invalid value.
        let text = BUILTIN[0]
            .1
            .replacen("bandwidth_gbps = 450", "bandwidth_gbps = -1", 1);
        match ClusterPreset::from_toml("neg.toml", &text).unwrap_err() {
            SimError::Cluster { field: Some(f), .. } => assert_eq!(f, "intra.bandwidth_gbps"),
            other => panic!("unexpected {other}"),
        }
        // An unknown topology and an unknown device.
        let text = BUILTIN[0].1.replacen("\"switch\"", "\"torus\"", 1);
        assert!(ClusterPreset::from_toml("t.toml", &text).is_err());
        let text = BUILTIN[0]
            .1
            .replacen("device = \"h200\"", "device = \"h999\"", 1);
        match ClusterPreset::from_toml("d.toml", &text).unwrap_err() {
            SimError::Cluster {
                field: Some(f),
                message,
                ..
            } => {
                assert_eq!(f, "device");
                assert!(message.contains("h999"), "{message}");
            }
            other => panic!("unexpected {other}"),
        }
        // A file that does not exist names the path.
        let s = ClusterPreset::load("/nonexistent/dir/my-cluster.toml")
            .unwrap_err()
            .to_string();
        assert!(s.contains("/nonexistent/dir/my-cluster.toml"), "{s}");
    }

    #[test]
    fn cluster_user_file_loads_with_relative_device() {
        let dir = std::env::temp_dir().join(format!("day0-cluster-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let device =
            include_str!("../presets/h800.toml").replace("name = \"h800\"", "name = \"my-card\"");
        std::fs::write(dir.join("my-card.toml"), device).unwrap();
        let text = BUILTIN[1]
            .1
            .replace("device = \"h800\"", "device = \"my-card.toml\"")
            .replace("name = \"h800\"", "name = \"mine\"");
        let file = dir.join("mine.toml");
        std::fs::write(&file, text).unwrap();
        let c = ClusterPreset::load(file.to_str().unwrap()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.name, "mine");
        assert_eq!(c.device_preset().unwrap().name, "my-card");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn cluster_with_nodes() {
        let c = ClusterPreset::load("h800").unwrap();
        let big = c.with_nodes(16).unwrap();
        assert_eq!((big.nodes, big.cards()), (16, 128));
        assert_eq!(c.with_nodes(1).unwrap().cards(), 8);
        assert_eq!(c.with_nodes(3).unwrap().cards(), 24);
        match c.with_nodes(0).unwrap_err() {
            SimError::Cluster { field: Some(f), .. } => assert_eq!(f, "nodes"),
            other => panic!("unexpected {other}"),
        }
    }
}
