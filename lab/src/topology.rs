//! The lab's fixed addressing: a client network and a server network, one TUN device each,
//! joined by the router process. The router itself owns `.1` / `::1` on both sides, used only
//! as the source of the ICMP errors it generates.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::emu::Dir;

pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 2);
/// A second client address, for S6's competing flow: the router counts server-to-client
/// traffic per client address, and the server can give it its own TCP congestion control
/// (a per-route `congctl`).
pub const CLIENT2_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 3);
pub const SERVER_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 2);
pub const ROUTER_CLIENT_SIDE_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 1);
pub const ROUTER_SERVER_SIDE_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 1);
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 1, 0, 0, 0, 0, 0, 2);
pub const SERVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 2, 0, 0, 0, 0, 0, 2);
pub const ROUTER_CLIENT_SIDE_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 1, 0, 0, 0, 0, 0, 1);
pub const ROUTER_SERVER_SIDE_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 2, 0, 0, 0, 0, 0, 1);
pub const PREFIX_V4: u8 = 24;
pub const PREFIX_V6: u8 = 64;
/// MTU of both TUN devices; the emulated path MTU is enforced by the router below this.
pub const TUN_MTU: u32 = 1500;

fn in_client_net(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => a.octets()[..3] == CLIENT_V4.octets()[..3],
        IpAddr::V6(a) => a.segments()[..4] == CLIENT_V6.segments()[..4],
    }
}

fn in_server_net(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => a.octets()[..3] == SERVER_V4.octets()[..3],
        IpAddr::V6(a) => a.segments()[..4] == SERVER_V6.segments()[..4],
    }
}

/// Whether a packet travelling in `dir` is addressed to the far side's network.
pub fn routable(dir: Dir, dst: IpAddr) -> bool {
    match dir {
        Dir::C2S => in_server_net(dst),
        Dir::S2C => in_client_net(dst),
    }
}

/// The router address that sends ICMP back to the sender of a packet travelling in `dir`.
pub fn router_v4(dir: Dir) -> Ipv4Addr {
    match dir {
        Dir::C2S => ROUTER_CLIENT_SIDE_V4,
        Dir::S2C => ROUTER_SERVER_SIDE_V4,
    }
}

pub fn router_v6(dir: Dir) -> Ipv6Addr {
    match dir {
        Dir::C2S => ROUTER_CLIENT_SIDE_V6,
        Dir::S2C => ROUTER_SERVER_SIDE_V6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_only_across() {
        assert!(routable(Dir::C2S, IpAddr::V4(SERVER_V4)));
        assert!(!routable(Dir::C2S, IpAddr::V4(CLIENT_V4)));
        assert!(routable(Dir::S2C, IpAddr::V6(CLIENT_V6)));
        assert!(!routable(Dir::S2C, "ff02::2".parse().unwrap()));
        assert!(!routable(Dir::C2S, "fd77:3::2".parse().unwrap()));
    }
}
