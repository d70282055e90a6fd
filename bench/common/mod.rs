//! What the benchmarks share: load generators and the results file.

pub mod load;
pub mod results;
