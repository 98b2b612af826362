//! Model layer (configs, op graph, plans, forward pass). Starts thin: the foundation issue only needs the crate to exist; the model issue fills it.
