//! `table inet hostmesh` through the `nft` tool: the fallback of mesh
//! redirects when sk_lookup cannot be used. Each mesh entry is a tproxy
//! rule on prerouting: the VIP has a local route, so its traffic (local
//! traffic too, which loops back through lo) passes prerouting, and tproxy
//! hands it to the sidecar's listener keeping the VIP:port as the socket's
//! local address — what sidecars read with getsockname() and
//! IP_RECVORIGDSTADDR, as with sk_lookup. No NAT, no conntrack. (tproxy
//! needs the listener to be IP_TRANSPARENT; the daemon sets that on the
//! sidecar's socket when it registers it.)
//!
//! The whole table is replaced in one transaction, so there is never a
//! moment with half the rules.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::{BackendError, NftBackend, Result};
use crate::model::NftRule;

pub(crate) const TABLE: &str = "hostmesh";

pub(crate) struct NftCli {
    program: String,
    /// Whether the table exists, asked of the kernel: without one there is
    /// nothing for the tool to list, and it is not started.
    exists: fn(&str) -> std::io::Result<bool>,
    /// A listing of the table `prefetch_mesh_table` started.
    listing: Option<std::result::Result<Option<Child>, String>>,
}

impl NftCli {
    pub(crate) fn new() -> Self {
        NftCli { program: "nft".into(), exists: super::netlink::nft_table::inet_table_exists, listing: None }
    }

    /// `nft -j list table inet hostmesh`, started; `None` when the kernel
    /// has no such table, or the nft tool is not installed (without it no
    /// table can have been made through it either). When the kernel cannot
    /// be asked, the tool is.
    fn start_listing(&self) -> std::result::Result<Option<Child>, String> {
        if let Ok(false) = (self.exists)(TABLE) {
            return Ok(None);
        }
        let started = Command::new(&self.program)
            .args(["-j", "list", "table", "inet", TABLE])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match started {
            Ok(child) => Ok(Some(child)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot run {}: {e}", self.program)),
        }
    }

    fn run(&self, args: &[&str], input: Option<&str>) -> std::result::Result<String, String> {
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {} (install nftables): {e}", self.program))?;
        if let Some(text) = input {
            child.stdin.take().expect("piped").write_all(text.as_bytes()).map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().replace('\n', "; "))
        }
    }
}

impl Default for NftCli {
    fn default() -> Self {
        Self::new()
    }
}

fn err(op: &str) -> impl FnOnce(String) -> BackendError + '_ {
    move |detail| BackendError::Nft { op: op.to_string(), detail }
}

/// One rule, as `nft` reads it.
fn rule_text(r: &NftRule) -> String {
    let (fam, lo) = match r.vip {
        IpAddr::V4(_) => ("ip", "127.0.0.1".to_string()),
        IpAddr::V6(_) => ("ip6", "[::1]".to_string()),
    };
    let proto = crate::config::Protocol::name_of(r.proto);
    let port = if r.port == 0 { format!("meta l4proto {proto}") } else { format!("{proto} dport {}", r.port) };
    // tproxy is not a verdict: accept, or a later whole-VIP rule would
    // override an exact port's socket.
    format!("{fam} daddr {} {port} tproxy {fam} to {lo}:{} accept", r.vip, r.redirect_port)
}

/// The table, exact ports before whole-VIP rules (first match wins).
pub(crate) fn ruleset(rules: &BTreeSet<NftRule>) -> String {
    let mut ordered: Vec<&NftRule> = rules.iter().collect();
    ordered.sort_by_key(|r| (r.port == 0, *r));
    let body: Vec<String> = ordered.iter().map(|r| format!("    {}", rule_text(r))).collect();
    format!(
        "table inet {TABLE} {{\n  chain mesh {{\n    type filter hook prerouting priority mangle; policy accept;\n{}\n  }}\n}}\n",
        body.join("\n")
    )
}

/// Reads rules back from `nft -j list table inet hostmesh`: each rule is a
/// daddr match, a protocol (or port) match and a tproxy statement.
pub(crate) fn parse_rules(json: &str) -> Option<BTreeSet<NftRule>> {
    let v: Value = serde_json::from_str(json).ok()?;
    let mut out = BTreeSet::new();
    for item in v["nftables"].as_array()? {
        let Some(rule) = item.get("rule") else { continue };
        let (mut vip, mut port, mut proto, mut redirect) = (None, 0u16, None, None);
        for e in rule["expr"].as_array()? {
            if let Some(m) = e.get("match") {
                let left = &m["left"];
                if let Some(p) = left.get("payload") {
                    match (p["protocol"].as_str(), p["field"].as_str()) {
                        (Some("ip" | "ip6"), Some("daddr")) => vip = m["right"].as_str()?.parse::<IpAddr>().ok(),
                        (Some(l4 @ ("tcp" | "udp")), Some("dport")) => {
                            proto = Some(if l4 == "udp" { 17 } else { 6 });
                            port = m["right"].as_u64()? as u16;
                        }
                        _ => return None,
                    }
                } else if left.get("meta").is_some_and(|meta| meta["key"] == "l4proto") {
                    proto = Some(if m["right"] == "udp" { 17 } else { 6 });
                } else {
                    return None;
                }
            } else if let Some(t) = e.get("tproxy") {
                redirect = t["port"].as_u64().map(|p| p as u16);
            } else if e.get("accept").is_none() {
                return None;
            }
        }
        out.insert(NftRule { vip: vip?, port, proto: proto?, redirect_port: redirect? });
    }
    Some(out)
}

impl NftBackend for NftCli {
    fn mesh_table(&mut self) -> Result<Option<BTreeSet<NftRule>>> {
        let listing = self.listing.take().unwrap_or_else(|| self.start_listing());
        let Some(child) = listing.map_err(err("list table inet hostmesh"))? else { return Ok(None) };
        let out = child.wait_with_output().map_err(|e| err("list table inet hostmesh")(e.to_string()))?;
        if !out.status.success() {
            let detail = String::from_utf8_lossy(&out.stderr).trim().replace('\n', "; ");
            if detail.contains("No such file or directory") {
                return Ok(None);
            }
            return Err(err("list table inet hostmesh")(detail));
        }
        let json = String::from_utf8_lossy(&out.stdout);
        Ok(Some(parse_rules(&json).unwrap_or_else(|| {
            // Rules hostmesh did not write: report a rule that cannot be
            // desired so the planner replaces the table.
            BTreeSet::from([NftRule { vip: IpAddr::from([0, 0, 0, 0]), port: 0, proto: 0, redirect_port: 0 }])
        })))
    }

    fn prefetch_mesh_table(&mut self) {
        // One started before and never read (its observe gave way) is
        // stale: ended, and a new one started.
        if let Some(Ok(Some(mut old))) = self.listing.take() {
            let _ = old.kill();
            let _ = old.wait();
        }
        self.listing = Some(self.start_listing());
    }

    fn replace_mesh_table(&mut self, rules: &BTreeSet<NftRule>) -> Result<()> {
        // Create-then-delete makes the delete safe when the table is absent;
        // all of it is one transaction.
        let script = format!("table inet {TABLE}\ndelete table inet {TABLE}\n{}", ruleset(rules));
        self.run(&["-f", "-"], Some(&script)).map(|_| ()).map_err(err("replace table inet hostmesh"))
    }

    fn delete_mesh_table(&mut self) -> Result<()> {
        let script = format!("table inet {TABLE}\ndelete table inet {TABLE}\n");
        self.run(&["-f", "-"], Some(&script)).map(|_| ()).map_err(err("delete table inet hostmesh"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the nft tool there is no table, prefetched or not; a tool
    /// that fails says how, and a prefetched listing is read once.
    #[test]
    fn the_table_is_read_through_the_tool_prefetched_or_not() {
        let there = |_: &str| Ok(true);
        let mut missing = NftCli { program: "/nonexistent/nft".into(), exists: there, listing: None };
        assert_eq!(missing.mesh_table().unwrap(), None);
        missing.prefetch_mesh_table();
        assert_eq!(missing.mesh_table().unwrap(), None);

        let mut failing = NftCli { program: "false".into(), exists: there, listing: None };
        failing.prefetch_mesh_table();
        failing.prefetch_mesh_table();
        assert!(failing.listing.is_some());
        assert!(failing.mesh_table().unwrap_err().to_string().contains("list table inet hostmesh"));
        assert!(failing.listing.is_none(), "read once");

        // A tool that prints the table (`echo` stands in for nft): parsed.
        let mut echo = NftCli { program: "echo".into(), exists: there, listing: None };
        echo.prefetch_mesh_table();
        assert!(echo.mesh_table().unwrap().is_some());

        // A table the kernel says is absent is not listed: the tool (here
        // one that would fail) is not started.
        let mut absent = NftCli { program: "false".into(), exists: |_| Ok(false), listing: None };
        absent.prefetch_mesh_table();
        assert_eq!(absent.mesh_table().unwrap(), None);
        // A kernel that cannot be asked: the tool is.
        let mut unknown =
            NftCli { program: "false".into(), exists: |_| Err(std::io::Error::other("x")), listing: None };
        assert!(unknown.mesh_table().is_err());
    }

    /// The kernel's answer, in a network namespace of its own (a
    /// thread's): no table, then the one this backend made (and no other),
    /// then none again.
    #[test]
    fn the_kernel_says_whether_a_table_exists() {
        use crate::backends::netlink::nft_table::inet_table_exists;
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            let mut nft = NftCli::new();
            assert!(!inet_table_exists(TABLE).unwrap());
            nft.replace_mesh_table(&BTreeSet::new()).unwrap();
            assert!(inet_table_exists(TABLE).unwrap());
            assert!(!inet_table_exists("hostmesh2").unwrap());
            nft.run(&["-f", "-"], Some("table ip hm-other\n")).unwrap();
            assert!(!inet_table_exists("hm-other").unwrap(), "an ip table is not an inet one");
            nft.delete_mesh_table().unwrap();
            assert!(!inet_table_exists(TABLE).unwrap());
        })
        .join()
        .unwrap();
    }

    fn rule(vip: &str, port: u16, proto: u8, redirect: u16) -> NftRule {
        NftRule { vip: vip.parse().unwrap(), port, proto, redirect_port: redirect }
    }

    #[test]
    fn ruleset_puts_exact_ports_before_whole_vips() {
        let rules = BTreeSet::from([
            rule("10.96.0.10", 0, 6, 15002),
            rule("10.96.0.10", 80, 6, 15001),
            rule("fd00::10", 53, 17, 15003),
        ]);
        assert_eq!(
            ruleset(&rules),
            "table inet hostmesh {\n  chain mesh {\n    type filter hook prerouting priority mangle; policy accept;\n\
             \x20   ip daddr 10.96.0.10 tcp dport 80 tproxy ip to 127.0.0.1:15001 accept\n\
             \x20   ip6 daddr fd00::10 udp dport 53 tproxy ip6 to [::1]:15003 accept\n\
             \x20   ip daddr 10.96.0.10 meta l4proto tcp tproxy ip to 127.0.0.1:15002 accept\n  }\n}\n"
        );
    }

    #[test]
    fn parses_what_nft_lists() {
        // `nft -j list table inet hostmesh` for the rules above (trimmed).
        let json = r#"{"nftables": [{"metainfo": {}}, {"table": {"family": "inet", "name": "hostmesh"}},
          {"chain": {"name": "mesh"}},
          {"rule": {"expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "10.96.0.10"}},
            {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 80}},
            {"tproxy": {"family": "ip", "addr": "127.0.0.1", "port": 15001}}, {"accept": null}]}},
          {"rule": {"expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "10.96.0.10"}},
            {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
            {"tproxy": {"family": "ip", "addr": "127.0.0.1", "port": 15002}}, {"accept": null}]}}]}"#;
        assert_eq!(
            parse_rules(json),
            Some(BTreeSet::from([rule("10.96.0.10", 80, 6, 15001), rule("10.96.0.10", 0, 6, 15002)]))
        );
    }

    #[test]
    fn foreign_rules_do_not_parse() {
        let json = r#"{"nftables": [{"rule": {"expr": [{"counter": null}, {"accept": null}]}}]}"#;
        assert_eq!(parse_rules(json), None);
    }
}
