use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};

use super::gather::{explain, KernelView, Sources};
use super::target::parse_target;
use super::view::{BuildOf, PathKind};
use crate::abi::*;
use crate::backends::bpf::attached::{AttachedProgram, Mark};
use crate::backends::bpf::inspect::ServiceEntry;
use crate::backends::bpf::objects::build_marks;
use crate::model::{Attachment, Hook, Program};

/// A kernel holding what the test puts in.
#[derive(Default)]
struct FakeKernel {
    flags: u32,
    services: HashMap<SvcKey, ServiceEntry>,
    mesh: Option<(u16, u16)>,
    peer: Option<(IpAddr, bool)>,
    gateway: Option<GwConfig>,
    affinity: Option<(SocketAddr, u64)>,
    attached: Vec<AttachedProgram>,
    /// Where node ports answer.
    host_addrs: Vec<IpAddr>,
}

impl KernelView for FakeKernel {
    fn config(&self) -> io::Result<Option<HmConfig>> {
        Ok(Some(HmConfig { flags: self.flags, ..Default::default() }))
    }
    fn service(&self, key: SvcKey) -> io::Result<Option<ServiceEntry>> {
        Ok(self.services.get(&key).cloned())
    }
    fn affinity(&self, _: IpAddr, _: u32) -> io::Result<Option<(SocketAddr, u64)>> {
        Ok(self.affinity)
    }
    fn host_address(&self, ip: IpAddr) -> io::Result<bool> {
        Ok(self.host_addrs.contains(&ip))
    }
    fn mesh(&self, _: IpAddr, _: u16, _: u8) -> io::Result<Option<(u16, u16)>> {
        Ok(self.mesh)
    }
    fn peer(&self, _: IpAddr) -> io::Result<Option<(IpAddr, bool)>> {
        Ok(self.peer)
    }
    fn gateway_config(&self) -> io::Result<Option<GwConfig>> {
        Ok(self.gateway)
    }
    fn counters(&self, _: u32, _: SocketAddr) -> io::Result<BackendStats> {
        Ok(BackendStats { ctlb_connections: 3, ..Default::default() })
    }
    fn attached(&self) -> io::Result<Vec<AttachedProgram>> {
        Ok(self.attached.clone())
    }
}

const CONFIG: &str = r#"
[[service]]
name = "web"
vip = "10.96.0.10"
port = 80
backends = ["192.168.10.11:8080", { address = "192.168.10.12:8080", weight = 0 }]
affinity = "client-ip"
node_port = 30080
external = true
external_policy = "local"

[[service]]
name = "dns"
vip = "10.96.0.10"
port = 53
protocol = "udp"
backends = ["192.168.10.11:5353"]

[gateway]
role = "member"
local_ip = "192.0.2.21"
gateway_ips = ["192.0.2.1", "192.0.2.2"]
vni = 1

[[peer]]
name = "site-b"
cidrs = ["10.20.0.0/16"]
"#;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// web with a 7-slot table of one backend (the draining one left it).
fn kernel(flags: u32) -> FakeKernel {
    let web = ServiceEntry {
        value: SvcValue { id: 1, backend_count: 1, flags: SVC_F_AFFINITY, table_size: 7 },
        slots: vec![Some(a("192.168.10.11:8080")); 7],
        affinity_s: Some(3600),
    };
    let mut k = FakeKernel { flags, ..Default::default() };
    k.services.insert(SvcKey::new("10.96.0.10".parse().unwrap(), 80, 6), web);
    k
}

fn run(k: &FakeKernel, target: &str, from: Option<(IpAddr, Option<u16>)>) -> super::view::Explanation {
    let config = crate::config::from_text(CONFIG);
    let src = Sources { kernel: k, config: &config, status: None, route: None };
    explain(parse_target(target).unwrap(), from, &src).unwrap()
}

#[test]
fn each_kind_of_address_gets_its_path() {
    let k = kernel(CFG_CTLB_TCP);
    let e = run(&k, "10.96.0.10:80", None);
    assert_eq!(e.path, PathKind::ConnectTime);
    let svc = e.service.unwrap();
    assert_eq!(svc.name.as_deref(), Some("web"));
    let rows: Vec<(String, usize, &str)> =
        svc.backends.iter().map(|b| (b.address.to_string(), b.slots, b.state.as_str())).collect();
    assert_eq!(rows, [("192.168.10.11:8080".into(), 7, "up"), ("192.168.10.12:8080".into(), 0, "draining")]);
    assert_eq!(run(&kernel(0), "10.96.0.10:80/tcp", None).path, PathKind::Veth);
    // Configured but not in the kernel: nothing, and it says so.
    let e = run(&k, "10.96.0.10:53/udp", None);
    assert_eq!(e.path, PathKind::None);
    assert!(e.sentences[0].contains("configured but not in the kernel"), "{:?}", e.sentences);
    let mut k = kernel(CFG_CTLB_TCP);
    k.peer = Some(("192.0.2.1".parse().unwrap(), false));
    let e = run(&k, "10.20.1.5", Some(("192.168.10.1".parse().unwrap(), None)));
    assert_eq!((e.path, e.gateway.unwrap().peer.as_deref()), (PathKind::Gateway, Some("site-b")));
    assert_eq!(e.from.unwrap().backend, Some(a("192.0.2.1:4789")), "the tunnel endpoint");
    // On a member HM_PEERS is empty: its site's gateway in use is named.
    k.peer = None;
    k.gateway =
        Some(GwConfig { role: ROLE_MEMBER, gateway: addr16("192.0.2.2".parse().unwrap()), ..Default::default() });
    let e = run(&k, "10.20.1.5", None);
    assert_eq!((e.path, e.gateway.as_ref().unwrap().endpoint), (PathKind::Gateway, "192.0.2.2".parse().unwrap()));
    assert!(
        e.sentences[0].contains("to this site's gateway 192.0.2.2 (in use of 192.0.2.1, 192.0.2.2), which answers"),
        "{:?}",
        e.sentences
    );
    k.gateway = None;
    k.mesh = Some((0, 15001));
    let e = run(&k, "10.96.0.10:80", Some(("192.168.10.1".parse().unwrap(), Some(1))));
    assert_eq!(e.path, PathKind::Mesh, "a mesh entry wins over the service");
    assert_eq!(e.from.unwrap().backend, Some(a("127.0.0.1:15001")), "the sidecar's listener");
    // No port: the address's first service, named.
    let e = run(&kernel(CFG_CTLB_TCP), "10.96.0.10", None);
    assert!(e.sentences[0].contains("has services web (80/tcp), dns (53/udp)"), "{:?}", e.sentences);
}

#[test]
fn a_node_port_and_an_external_vip_are_explained_as_clients_on_other_machines_get_them() {
    let mut k = kernel(CFG_CTLB_TCP);
    k.host_addrs.push("192.0.2.1".parse().unwrap());
    // The network's entries: external_policy "local", whose table has the
    // backend on this host only.
    let local = ServiceEntry {
        value: SvcValue { id: 1, backend_count: 1, flags: SVC_F_NODE_PORT | SVC_F_LOCAL, table_size: 7 },
        slots: vec![Some(a("192.168.10.12:8080")); 7],
        affinity_s: None,
    };
    let external =
        ServiceEntry { value: SvcValue { flags: SVC_F_EXTERNAL | SVC_F_LOCAL, ..local.value }, ..local.clone() };
    k.services.insert(SvcKey::network("0.0.0.0".parse().unwrap(), 30080, 6), local);
    k.services.insert(SvcKey::network("10.96.0.10".parse().unwrap(), 80, 6), external);
    let elsewhere: IpAddr = "198.51.100.9".parse().unwrap();

    let e = run(&k, "192.0.2.1:30080", Some((elsewhere, Some(40000))));
    assert_eq!(e.path, PathKind::NodePort);
    let text = e.sentences.join(" ");
    assert!(text.contains("node port 30080 of service \"web\""), "{text}");
    assert!(text.contains("external_policy \"local\": only this host's backends"), "{text}");
    assert_eq!(e.from.unwrap().backend, Some(a("192.168.10.12:8080")), "the network's table");
    assert_eq!(e.service.unwrap().name.as_deref(), Some("web"));
    // Not an address node ports answer on: hostmesh does not handle it.
    assert_eq!(run(&k, "192.0.2.99:30080", None).path, PathKind::None);

    // The external VIP: a client elsewhere gets the network's table, a
    // process of this host the service's.
    let e = run(&k, "10.96.0.10:80", Some((elsewhere, Some(40000))));
    assert!(e.sentences.iter().any(|s| s.contains("is an external VIP")), "{:?}", e.sentences);
    assert_eq!(e.from.unwrap().backend, Some(a("192.168.10.12:8080")));
    let e = run(&k, "10.96.0.10:80", Some(("192.0.2.1".parse().unwrap(), Some(40000))));
    assert_eq!(e.from.unwrap().backend, Some(a("192.168.10.11:8080")));
}

#[test]
fn from_predicts_by_affinity_then_hash_and_says_when_it_cannot() {
    let src: IpAddr = "192.168.10.1".parse().unwrap();
    let k = kernel(CFG_CTLB_TCP);
    let p = run(&k, "10.96.0.10:80", Some((src, Some(40000)))).from.unwrap();
    assert_eq!((p.backend, p.by.as_str()), (Some(a("192.168.10.11:8080")), "hash"));
    let p = run(&k, "10.96.0.10:80", Some((src, None))).from.unwrap();
    assert_eq!((p.backend, p.by.as_str()), (None, "random"), "connect-time, no port: by the cookie");
    let mut k = kernel(CFG_CTLB_TCP);
    k.affinity = Some((a("192.168.10.12:8080"), 1_000_000_000));
    let p = run(&k, "10.96.0.10:80", Some((src, Some(40000)))).from.unwrap();
    assert_eq!((p.backend, p.by.as_str()), (Some(a("192.168.10.12:8080")), "affinity"));
    // An entry older than the timeout no longer holds.
    k.affinity = Some((a("192.168.10.12:8080"), 3601 * 1_000_000_000));
    assert_eq!(run(&k, "10.96.0.10:80", Some((src, Some(40000)))).from.unwrap().by, "hash");
}

/// The veth path's four programs as this build attaches them, each with
/// the mark `mark` gives it.
fn veth_programs(mark: impl Fn(Program) -> Mark) -> Vec<AttachedProgram> {
    [
        (Program::NatOut, Hook::TcIngress("hm-natout".into())),
        (Program::Reply, Hook::TcIngress("lo".into())),
        (Program::Direct, Hook::TcEgress("lo".into())),
        (Program::NatIn, Hook::TcEgress("hm-natin".into())),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (program, hook))| AttachedProgram {
        attachment: Attachment { program, hook },
        via: "link",
        prog_id: 10 + i as u32,
        tag: Some([i as u8; 8]),
        mark: mark(program),
        live: true,
    })
    .collect()
}

fn this_build(p: Program) -> Mark {
    Mark::Build(build_marks(p)[0])
}

#[test]
fn the_path_s_programs_are_listed_with_whose_build_they_are() {
    let mut k = kernel(0);
    k.attached = veth_programs(this_build);
    let e = run(&k, "10.96.0.10:80", None);
    assert_eq!(e.programs.len(), 4, "{:?}", e.programs);
    assert!(e.programs.iter().all(|p| p.build == BuildOf::This && p.live), "{:?}", e.programs);
    assert_eq!(e.sentences.last().unwrap(), "The 4 programs on this path are attached and are this build's.");
    assert!(
        e.kernel.iter().any(|l| l.starts_with(
            "program hm_natout on tc ingress of hm-natout (id 10, tag 0000000000000000, by link): this build's"
        )),
        "{:?}",
        e.kernel
    );

    // One of another build, one from before marks, one unreadable.
    k.attached = veth_programs(|p| match p {
        Program::NatIn => this_build(p),
        Program::NatOut => Mark::Build(build_marks(p)[0] ^ 1),
        Program::Reply => Mark::Unmarked,
        _ => Mark::Unreadable("open map 7: Operation not permitted".into()),
    });
    let e = run(&k, "10.96.0.10:80", None);
    let builds: Vec<BuildOf> = e.programs.iter().map(|p| p.build).collect();
    assert_eq!(builds, [BuildOf::This, BuildOf::Other, BuildOf::Unmarked, BuildOf::Unknown]);
    let said = e.sentences.join("\n");
    assert!(said.contains("hm_natout on tc ingress of hm-natout is another build's program"), "{said}");
    assert!(said.contains("hm_reply on tc ingress of lo is a program without a build mark"), "{said}");
    assert!(
        said.contains(
            "Whether hm_direct on tc egress of lo is this build's cannot be read (open map 7: Operation not permitted)"
        ),
        "{said}"
    );
    assert!(!said.contains("are attached and are this build's"), "{said}");

    // Missing, and a hook that is gone.
    let mut programs = veth_programs(this_build);
    programs.remove(0);
    programs[0].live = false;
    k.attached = programs;
    let said = run(&k, "10.96.0.10:80", None).sentences.join("\n");
    assert!(said.contains("hm_natout is not attached: this path does not work"), "{said}");
    assert!(said.contains("hm_reply on tc ingress of lo is pinned but the hook is gone"), "{said}");
    // Without hm_natin the path works, through hm_natout, and says so.
    let mut programs = veth_programs(this_build);
    programs.retain(|p| p.attachment.program != Program::NatIn);
    k.attached = programs;
    let said = run(&k, "10.96.0.10:80", None).sentences.join("\n");
    assert!(said.contains("hm_natin is not attached: packets to this VIP cross the veth, and hm_natout"), "{said}");
    assert!(!said.contains("does not work"), "{said}");
    // Connect-time LB wants its nine cgroup programs, not these.
    k.attached = veth_programs(this_build);
    let e = run(&kernel(CFG_CTLB_TCP), "10.96.0.10:80", None);
    assert!(e.programs.is_empty());
    assert!(e.sentences.last().unwrap().starts_with("hm_connect4, hm_connect6, hm_sendmsg4"), "{:?}", e.sentences);
    assert!(
        e.sentences
            .last()
            .unwrap()
            .contains("hm_getpeername6 and hm_sock_release are not attached: this path does not"),
        "{:?}",
        e.sentences
    );
    // Without hm_sock_release (a kernel without the hook) the path works,
    // and the sentence says what is lost.
    let mut k = kernel(CFG_CTLB_TCP);
    k.attached = Program::CONNECT_TIME
        .into_iter()
        .filter(|p| *p != Program::SockRelease)
        .enumerate()
        .map(|(i, program)| AttachedProgram {
            attachment: Attachment { program, hook: Hook::Cgroup("/sys/fs/cgroup".into()) },
            via: "link",
            prog_id: 20 + i as u32,
            tag: Some([i as u8; 8]),
            mark: this_build(program),
            live: true,
        })
        .collect();
    let said = run(&k, "10.96.0.10:80", None).sentences.join("\n");
    assert!(said.contains("hm_sock_release is not attached: connect-time LB works"), "{said}");
    assert!(!said.contains("does not work"), "{said}");
}
