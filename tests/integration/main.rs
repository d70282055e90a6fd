//! Integration tests: the real hostmesh binary, run as root, in network
//! namespaces each test creates (hm-testkit guards remove them).

mod capacity;
mod conntrack;
mod encrypted;
mod explain;
mod external;
mod failover;
mod fixtures;
mod gateway;
mod health;
mod health_net;
mod kernel;
mod mesh;
mod metrics;
mod restart;
mod resync;
mod service_veth;
mod services;
mod sites;
mod teardown;
mod topology;
mod turnaround;
