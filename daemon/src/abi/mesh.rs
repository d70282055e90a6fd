//! `HM_MESH`'s key and value (probes/mesh.c, model/mesh.rs).

use std::net::IpAddr;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::addr16;

/// `HM_MESH`'s key: (VIP, port, protocol); port 0 means every port.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MeshKey {
    pub addr: [u8; 16],
    /// Network byte order.
    pub port_be: u16,
    pub proto: u8,
    pub pad: u8,
}

impl MeshKey {
    pub fn new(vip: IpAddr, port: u16, proto: u8) -> Self {
        MeshKey { addr: addr16(vip), port_be: port.to_be(), proto, pad: 0 }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct MeshValue {
    /// Host byte order.
    pub redirect_port: u16,
    pub pad: u16,
}
