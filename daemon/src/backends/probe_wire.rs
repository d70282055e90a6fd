//! The gateway prober's wire (peer_health): probes leave as VXLAN frames
//! from `local_ip` to each gateway's tunnel port, and the answers the data
//! plane records come back through HM_GW_PROBES (probes/gateway.c). On a
//! gateway the older daemons' probes (`hostmesh-probe VNI SEQ` on
//! `probe_port`) are also sent to peers, and answered, so a site can
//! upgrade its gateways one at a time.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use zerocopy::IntoBytes;

use crate::abi::{self, addr16, GwProbe, HmMap};
use crate::backends::bpf::{pins::PinDir, sys};
use crate::model::gateway::TUN_MAC;
use crate::peer_health::{ProbeTarget, Settings, Wire};

/// The inner Ethernet source of every frame into a tunnel (probes/gateway.c
/// TUN_PEER_MAC): a receiver drops frames from its own MAC.
const TUN_PEER_MAC: [u8; 6] = [0x02, 0x68, 0x6d, 0x00, 0x01, 0x01];

pub(crate) struct LiveWire {
    vni: u32,
    nonce: u64,
    udp_port: u16,
    probe_port: u16,
    /// Sends the probes, from local_ip.
    tunnel: UdpSocket,
    /// The older daemons' probes: sent to peers, answered, and their
    /// answers heard (a gateway's only).
    legacy: Option<UdpSocket>,
    /// Answers of older daemons to the current probe.
    legacy_answers: BTreeSet<IpAddr>,
    seq: u64,
    answers_pin: std::path::PathBuf,
    answers: Option<OwnedFd>,
}

impl LiveWire {
    /// Opens the sockets for `s`; answers are read from the pinned
    /// HM_GW_PROBES under `bpffs` once the gateway programs are loaded.
    pub(crate) fn open(s: &Settings, bpffs: &Path) -> Result<LiveWire, String> {
        let tunnel =
            UdpSocket::bind((s.local, 0)).map_err(|e| format!("cannot send gateway probes from {}: {e}", s.local))?;
        let legacy = if s.lists.iter().any(|(via, _)| matches!(via, crate::model::Via::Peer(_))) {
            let sock = UdpSocket::bind((s.local, s.port)).map_err(|e| {
                format!("cannot listen for older daemons' peer probes on {}: {e}", SocketAddr::new(s.local, s.port))
            })?;
            sock.set_read_timeout(Some(Duration::from_millis(50))).map_err(|e| e.to_string())?;
            Some(sock)
        } else {
            None
        };
        Ok(LiveWire {
            vni: s.vni,
            nonce: random_nonce(),
            udp_port: s.udp_port,
            probe_port: s.port,
            tunnel,
            legacy,
            legacy_answers: BTreeSet::new(),
            seq: 0,
            answers_pin: PinDir::new(bpffs).map(HmMap::GwProbes),
            answers: None,
        })
    }

    fn answer_legacy(&mut self, n: usize, from: SocketAddr, buf: &[u8]) {
        let text = String::from_utf8_lossy(&buf[..n]);
        let words: Vec<&str> = text.split_whitespace().collect();
        let vni = self.vni.to_string();
        match words.as_slice() {
            ["hostmesh-probe", v, s] if *v == vni => {
                if let Some(sock) = &self.legacy {
                    let _ = sock.send_to(format!("hostmesh-ack {v} {s}\n").as_bytes(), from);
                }
            }
            ["hostmesh-ack", v, s] if *v == vni && *s == self.seq.to_string() => {
                self.legacy_answers.insert(from.ip());
            }
            _ => {}
        }
    }
}

impl Wire for LiveWire {
    fn send(&mut self, targets: &[ProbeTarget], seq: u64) {
        self.seq = seq;
        self.legacy_answers.clear();
        for (slot, t) in targets.iter().enumerate() {
            let frame = probe_frame(self.vni, slot as u32, seq, self.nonce, t.addr);
            let _ = self.tunnel.send_to(&frame, (t.addr, self.udp_port));
            if let (true, Some(sock)) = (t.legacy, &self.legacy) {
                let _ =
                    sock.send_to(format!("hostmesh-probe {} {seq}\n", self.vni).as_bytes(), (t.addr, self.probe_port));
            }
        }
    }

    fn listen(&mut self, d: Duration) {
        let Some(sock) = &self.legacy else {
            std::thread::sleep(d);
            return;
        };
        let _ = sock.set_read_timeout(Some(d.max(Duration::from_millis(1))));
        let mut buf = [0u8; 128];
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            self.answer_legacy(n, from, &buf);
        }
    }

    fn answered(&mut self, targets: &[ProbeTarget], seq: u64) -> Result<BTreeSet<IpAddr>, String> {
        if self.answers.is_none() {
            match sys::obj_get(&self.answers_pin) {
                Ok(fd) => self.answers = Some(fd),
                Err(e) => {
                    return Err(format!(
                        "probe answers cannot be read yet ({}: {e}); gateways keep their states",
                        self.answers_pin.display()
                    ))
                }
            }
        }
        let fd = self.answers.as_ref().expect("opened above");
        let mut out = self.legacy_answers.clone();
        for (slot, t) in targets.iter().enumerate() {
            let mut value = GwProbe::default();
            let found = match sys::map_lookup(fd.as_fd(), (slot as u32).as_bytes(), value.as_mut_bytes()) {
                Ok(found) => found,
                Err(e) => {
                    // Opened again next round (the map may have been replaced).
                    self.answers = None;
                    return Err(format!("probe answers cannot be read ({}): {e}", HmMap::GwProbes));
                }
            };
            if found && is_answer(&value, slot as u32, seq, self.nonce, t.addr) {
                out.insert(t.addr);
            }
        }
        Ok(out)
    }
}

/// Whether `v` answers probe `seq` of this prober (`nonce`) to `target`.
fn is_answer(v: &GwProbe, slot: u32, seq: u64, nonce: u64, target: IpAddr) -> bool {
    v.magic == abi::PROBE_MAGIC.to_be()
        && v.kind == abi::PROBE_ACK.to_be()
        && u32::from_be(v.slot) == slot
        && u64::from_be(v.seq) == seq
        && u64::from_be(v.nonce) == nonce
        && v.target == addr16(target)
}

/// The UDP payload of a probe: VXLAN header, inner Ethernet, IPv4 and UDP
/// to HM_PROBE_ADDR:HM_PROBE_PORT, then struct hm_gw_probe.
pub(crate) fn probe_frame(vni: u32, slot: u32, seq: u64, nonce: u64, target: IpAddr) -> Vec<u8> {
    let payload = GwProbe {
        magic: abi::PROBE_MAGIC.to_be(),
        kind: abi::PROBE_ASK.to_be(),
        slot: slot.to_be(),
        pad: 0,
        seq: seq.to_be(),
        nonce: nonce.to_be(),
        target: addr16(target),
    };
    let udp_len = 8 + payload.as_bytes().len();
    let ip_len = 20 + udp_len;
    let mut f = Vec::with_capacity(8 + 14 + ip_len);
    // VXLAN (RFC 7348): flags with the VNI bit, the VNI in the top 24 bits.
    f.extend_from_slice(&[0x08, 0, 0, 0]);
    f.extend_from_slice(&(vni << 8).to_be_bytes());
    f.extend_from_slice(&TUN_MAC);
    f.extend_from_slice(&TUN_PEER_MAC);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let src = abi::PROBE_ADDR.octets();
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[8] = 1; // TTL: never forwarded
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&src);
    let sum = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&abi::PROBE_PORT.to_be_bytes());
    f.extend_from_slice(&abi::PROBE_PORT.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // no checksum (IPv4)
    f.extend_from_slice(payload.as_bytes());
    f
}

fn ipv4_checksum(h: &[u8; 20]) -> u16 {
    let mut sum: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A nonce no other prober (nor an earlier run of this one) uses.
fn random_nonce() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: b is a valid buffer of b.len() bytes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        u64::from_ne_bytes(b)
    } else {
        // No getrandom: the time and pid are unique enough against
        // confusing two probers; they are no secret.
        crate::clock::now_unix() ^ (u64::from(std::process::id()) << 32) ^ io::Error::last_os_error().kind() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    #[test]
    fn a_probe_frame_is_vxlan_of_our_vni_around_an_ipv4_datagram_the_data_plane_knows() {
        let target: IpAddr = "2001:db8::7".parse().unwrap();
        let f = probe_frame(7001, 3, 42, 0x1122_3344_5566_7788, target);
        assert_eq!(f.len(), 8 + 14 + 20 + 8 + 48);
        assert_eq!(&f[..8], &[0x08, 0, 0, 0, 0x00, 0x1b, 0x59, 0x00], "flags, VNI 7001");
        assert_eq!(&f[8..14], &TUN_MAC);
        assert_eq!(&f[20..22], &[0x08, 0x00]);
        let ip: [u8; 20] = f[22..42].try_into().unwrap();
        assert_eq!(ipv4_checksum(&ip), 0, "a header with its checksum sums to zero");
        assert_eq!(&ip[16..20], &[169, 254, 2, 2]);
        assert_eq!(u16::from_be_bytes([f[44], f[45]]), abi::PROBE_PORT);
        let p = GwProbe::read_from_bytes(&f[50..]).unwrap();
        assert_eq!(u32::from_be(p.kind), abi::PROBE_ASK);
        let ack = GwProbe { kind: abi::PROBE_ACK.to_be(), ..p };
        assert!(is_answer(&ack, 3, 42, 0x1122_3344_5566_7788, target));
        assert!(!is_answer(&p, 3, 42, 0x1122_3344_5566_7788, target), "a question is no answer");
        assert!(!is_answer(&ack, 3, 41, 0x1122_3344_5566_7788, target), "an earlier probe's answer");
        assert!(!is_answer(&ack, 3, 42, 1, target), "another prober's answer");
        assert!(!is_answer(&ack, 3, 42, 0x1122_3344_5566_7788, "2001:db8::8".parse().unwrap()));
    }
}
