//! What the benchmarks share: load generators and the results file.

pub mod load;
pub mod options;
pub mod results;
