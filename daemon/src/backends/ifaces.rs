//! Interfaces of the daemon's network namespace by name and by index, as
//! they are at the moment of asking (no netlink dump).

/// A link's index; None when there is no such link.
pub(crate) fn index(name: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(name).ok()
}

/// The name of the link with this index, if there is one.
pub(crate) fn name(index: u32) -> Option<String> {
    nix::net::if_::if_indextoname(index).ok().map(|n| n.to_string_lossy().into_owned())
}

/// Whether the link is administratively up; None when there is no such
/// link.
pub(crate) fn is_up(name: &str) -> Option<bool> {
    nix::ifaddrs::getifaddrs()
        .ok()?
        .find(|i| i.interface_name == name)
        .map(|i| i.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP))
}
