//! What the benchmarks share, below all of them: `bench` (its subcommands), `floor`, the
//! combined benchmark (`overhead`), its large node (`bignode`) and its report (`report`)
//! each use these and none another's helpers, so that no two of them import each other.
pub(crate) mod agent;
pub(crate) mod figures;
pub(crate) mod host;
