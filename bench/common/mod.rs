//! What the benchmarks share: load generators and the results file.

pub mod interleave;
pub mod load;
pub mod options;
pub mod perf;
pub mod progstats;
pub mod results;
