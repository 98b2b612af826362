//! Errors of the machine: every one says what was wrong, where, and what would fix it.

use std::fmt;

/// An error raised by the simulator or by loading its configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum SimError {
    /// A device preset could not be read or is invalid.
    Preset {
        /// Preset name or file path.
        source: String,
        /// The offending field (dotted path), if known.
        field: Option<String>,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The live tiles of one program need more on-chip SRAM than a core has.
    SramOverflow {
        /// Kernel name.
        kernel: String,
        /// Source line of the allocation that overflowed.
        line: u32,
        /// Source text of that line (tokens), for the message.
        code: String,
        /// Bytes live at that point, including the new tile.
        needed: u64,
        /// Per-core SRAM capacity of the device.
        capacity: u64,
    },
    /// A launch argument (shape, tile choice, grid) is invalid.
    Launch {
        /// Kernel name.
        kernel: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A kernel did something its shapes do not allow (out-of-range program axis, bad tensor rank...).
    Kernel {
        /// Kernel name.
        kernel: String,
        /// Source line in the kernel.
        line: u32,
        /// What is wrong.
        message: String,
    },
    /// A cluster preset could not be read or is invalid.
    Cluster {
        /// Cluster preset name or file path.
        source: String,
        /// The offending field (dotted path), if known.
        field: Option<String>,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A collective was asked for something the cluster or its arguments do not allow (a group
    /// that does not fit, a volume matrix of the wrong shape, an algorithm the collective lacks).
    Collective {
        /// The collective (`all_reduce`, `all_to_all`...).
        op: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Preset { source, field: Some(field), message } => {
                write!(f, "device preset `{source}`: field `{field}`: {message}")
            }
            SimError::Preset { source, field: None, message } => {
                write!(f, "device preset `{source}`: {message}")
            }
            SimError::SramOverflow { kernel, line, code, needed, capacity } => write!(
                f,
                "kernel `{kernel}` line {line}: on-chip SRAM overflow: live tiles need {needed} bytes \
                 but a core has {capacity} bytes (at `{code}`); choose smaller tiles or release tiles earlier"
            ),
            SimError::Launch { kernel, message } => write!(f, "kernel `{kernel}`: launch: {message}"),
            SimError::Kernel { kernel, line, message } => {
                write!(f, "kernel `{kernel}` line {line}: {message}")
            }
            SimError::Cluster { source, field: Some(field), message } => {
                write!(f, "cluster preset `{source}`: field `{field}`: {message}")
            }
            SimError::Cluster { source, field: None, message } => {
                write!(f, "cluster preset `{source}`: {message}")
            }
            SimError::Collective { op, message } => write!(f, "collective `{op}`: {message}"),
        }
    }
}

impl std::error::Error for SimError {}
