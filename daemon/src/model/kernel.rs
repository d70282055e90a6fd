//! What the running kernel offers, as the feature probes found it at start
//! (`backends/bpf/features.rs`), and what hostmesh does without each
//! feature. This is the one table of kernel features: the probes, the
//! compile step, `hostmesh status` and the README all follow it.
//!
//! hostmesh decides by probing, never by kernel version (distributions
//! backport features: RHEL 9's 5.14 has many of 6.x's). The versions below
//! only say where each feature arrived upstream, for the docs.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

pub(crate) use crate::config::TcAttachPref;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// BPF links for TC programs (TCX).
    Tcx,
    /// `getsockopt(SO_NETNS_COOKIE)`.
    NetnsCookieSockopt,
    /// `bpf_set_retval()` in cgroup programs.
    SetRetval,
    /// cgroup connect/sendmsg/recvmsg/getpeername programs, with
    /// `bpf_get_netns_cookie()`.
    ConnectTimeHooks,
    /// cgroup `sock_release` programs.
    SockRelease,
    /// `sk_lookup` programs.
    SkLookup,
    /// `bpf_redirect_neigh()` in TC programs.
    RedirectNeigh,
    /// A tunnel source address in `bpf_skb_set_tunnel_key()`.
    TunnelSource,
    /// sock_diag's SOCK_DESTROY (`CONFIG_INET_DIAG_DESTROY`).
    SockDestroy,
    /// `bpf_ktime_get_coarse_ns()`.
    CoarseClock,
    /// BPF_MAP_UPDATE_BATCH and BPF_MAP_DELETE_BATCH.
    MapBatch,
    /// WireGuard devices (`CONFIG_WIREGUARD`, built in or a module).
    Wireguard,
    /// Tunnel keys on routes (`ip route ... encap ip`, `CONFIG_LWTUNNEL`).
    RouteEncap,
}

impl Feature {
    pub const ALL: [Feature; 13] = [
        Feature::Tcx,
        Feature::NetnsCookieSockopt,
        Feature::SetRetval,
        Feature::ConnectTimeHooks,
        Feature::SockRelease,
        Feature::SkLookup,
        Feature::RedirectNeigh,
        Feature::TunnelSource,
        Feature::SockDestroy,
        Feature::CoarseClock,
        Feature::MapBatch,
        Feature::Wireguard,
        Feature::RouteEncap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Feature::Tcx => "tcx",
            Feature::NetnsCookieSockopt => "netns_cookie_sockopt",
            Feature::SetRetval => "set_retval",
            Feature::ConnectTimeHooks => "connect_time_hooks",
            Feature::SockRelease => "sock_release",
            Feature::SkLookup => "sk_lookup",
            Feature::RedirectNeigh => "redirect_neigh",
            Feature::TunnelSource => "tunnel_source",
            Feature::SockDestroy => "sock_destroy",
            Feature::CoarseClock => "coarse_clock",
            Feature::MapBatch => "map_batch",
            Feature::Wireguard => "wireguard",
            Feature::RouteEncap => "route_encap",
        }
    }

    pub fn from_name(name: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.name() == name)
    }

    /// What the feature is, in a few words.
    pub fn what(self) -> &'static str {
        match self {
            Feature::Tcx => "TCX links for TC programs",
            Feature::NetnsCookieSockopt => "the SO_NETNS_COOKIE socket option",
            Feature::SetRetval => "bpf_set_retval() in cgroup programs",
            Feature::ConnectTimeHooks => "cgroup connect, sendmsg, recvmsg and getpeername programs",
            Feature::SockRelease => "cgroup sock_release programs",
            Feature::SkLookup => "sk_lookup programs",
            Feature::RedirectNeigh => "bpf_redirect_neigh() in TC programs",
            Feature::TunnelSource => "a tunnel source address in bpf_skb_set_tunnel_key()",
            Feature::SockDestroy => "destroying sockets with sock_diag (CONFIG_INET_DIAG_DESTROY)",
            Feature::CoarseClock => "bpf_ktime_get_coarse_ns() in BPF programs",
            Feature::MapBatch => "batched map updates and deletes (BPF_MAP_UPDATE_BATCH, BPF_MAP_DELETE_BATCH)",
            Feature::Wireguard => "WireGuard devices (CONFIG_WIREGUARD)",
            Feature::RouteEncap => "tunnel keys on routes (encap ip, CONFIG_LWTUNNEL)",
        }
    }

    /// The upstream Linux release that brought it (documentation only).
    pub fn since(self) -> &'static str {
        match self {
            Feature::Tcx => "6.6",
            Feature::NetnsCookieSockopt => "5.14",
            Feature::SetRetval => "5.18",
            Feature::ConnectTimeHooks => "5.8",
            Feature::SockRelease => "5.9",
            Feature::SkLookup => "5.9",
            Feature::RedirectNeigh => "5.10",
            Feature::TunnelSource => "6.0",
            Feature::SockDestroy => "4.5",
            Feature::CoarseClock => "5.11",
            Feature::MapBatch => "5.6",
            Feature::Wireguard => "5.6",
            Feature::RouteEncap => "4.3",
        }
    }

    /// What hostmesh does when the kernel lacks it.
    pub fn without(self) -> &'static str {
        match self {
            Feature::Tcx => {
                "TC programs are attached as clsact filters over netlink instead (same traffic, shown by `tc filter`)"
            }
            Feature::NetnsCookieSockopt => {
                "the network namespace's cookie is read once by a short-lived BPF program on the daemon's own cgroup"
            }
            Feature::SetRetval => {
                "connect() to a VIP with no backends fails with EPERM instead of ECONNREFUSED (connect-time path)"
            }
            Feature::ConnectTimeHooks => {
                "connect-time load balancing is unavailable: every service takes the bpfnat veth path"
            }
            Feature::SockRelease => {
                "a closed socket's entry in the reverse-socket map stays until the map's LRU pushes it out: under \
                 heavy connection churn that pushes out open sockets' entries too (their getpeername() and recvmsg() \
                 then show the backend, not the VIP, and a backend's removal no longer finds them to close them)"
            }
            Feature::SkLookup => "mesh redirects use the nftables tproxy fallback",
            Feature::RedirectNeigh => {
                "the bpfnat veth path is unavailable: connect-time load balancing handles TCP and UDP (mode \"all\")"
            }
            Feature::TunnelSource => {
                "gateway tunnels and probes leave from the address the kernel's route picks, not always local_ip (on a \
                 multi-homed gateway, give the route to the peers src local_ip)"
            }
            Feature::SockDestroy => {
                "a connected UDP socket that connect-time LB pointed at a backend that went down or was removed keeps \
                 that backend until its owner reconnects"
            }
            Feature::CoarseClock => {
                "the veth path and the translation at the host's interfaces read the precise clock for each packet's \
                 flow time (a clocksource read, costly under some hypervisors' clocks, instead of the last tick's)"
            }
            Feature::MapBatch => {
                "map entries are written and deleted one system call each: a start or an edit of many services takes \
                 longer"
            }
            Feature::Wireguard => {
                "peers with encryption = \"wireguard\" are not applied: their CIDRs are unreachable from this \
                 gateway, so nothing goes to them in clear"
            }
            Feature::RouteEncap => {
                "hm-tun0's TC program sets every packet's tunnel destination, and the kernel looks up its outer route \
                 for each packet (the gateway path is slower; nothing else changes)"
            }
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The probe results: which features this kernel lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFeatures {
    pub missing: BTreeSet<Feature>,
}

impl KernelFeatures {
    /// A kernel with everything (the default for tests of pure logic).
    pub fn complete() -> Self {
        Self::default()
    }

    pub fn lacking(missing: impl IntoIterator<Item = Feature>) -> Self {
        KernelFeatures { missing: missing.into_iter().collect() }
    }

    pub fn has(&self, f: Feature) -> bool {
        !self.missing.contains(&f)
    }

    /// One line for the log: `missing: tcx, set_retval` or `nothing missing`.
    pub fn summary(&self) -> String {
        if self.missing.is_empty() {
            "nothing missing".to_string()
        } else {
            let names: Vec<&str> = self.missing.iter().map(|f| f.name()).collect();
            format!("missing: {}", names.join(", "))
        }
    }
}

/// How TC programs are attached on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TcAttach {
    /// BPF links (TCX), pinned under the bpffs dir.
    Tcx,
    /// Direct-action `bpf` filters on a clsact qdisc, owned by hostmesh
    /// through their priority and handle (`backends/netlink/tc.rs`).
    Netlink,
}

impl TcAttach {
    pub fn choose(pref: TcAttachPref, features: &KernelFeatures) -> TcAttach {
        match pref {
            TcAttachPref::Auto if features.has(Feature::Tcx) => TcAttach::Tcx,
            _ => TcAttach::Netlink,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            TcAttach::Tcx => "tcx (BPF links)",
            TcAttach::Netlink => "netlink (clsact qdisc, direct-action bpf filters)",
        }
    }
}

impl fmt::Display for TcAttach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TcAttach::Tcx => "tcx",
            TcAttach::Netlink => "netlink",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_every_feature_says_what_it_costs() {
        for f in Feature::ALL {
            assert_eq!(Feature::from_name(f.name()), Some(f));
            assert!(!f.what().is_empty() && !f.without().is_empty(), "{f}");
            let (major, minor) = f.since().split_once('.').unwrap();
            assert!(major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok(), "{f}: {}", f.since());
        }
    }

    #[test]
    fn tc_attach_follows_the_probe_unless_netlink_is_asked_for() {
        let all = KernelFeatures::complete();
        let old = KernelFeatures::lacking([Feature::Tcx]);
        assert_eq!(TcAttach::choose(TcAttachPref::Auto, &all), TcAttach::Tcx);
        assert_eq!(TcAttach::choose(TcAttachPref::Auto, &old), TcAttach::Netlink);
        assert_eq!(TcAttach::choose(TcAttachPref::Netlink, &all), TcAttach::Netlink);
        assert_eq!(old.summary(), "missing: tcx");
        assert_eq!(all.summary(), "nothing missing");
    }
}
