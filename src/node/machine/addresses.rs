//! The Node's addresses: the host's interfaces (getifaddrs), the default
//! routes of /proc/net, `--node-ip` validation, and the InternalIP and
//! Hostname entries in upstream's order.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::MachineError;

/// One address of a network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IfAddr {
    pub(crate) name: String,
    pub(crate) addr: IpAddr,
    /// IFF_UP.
    pub(crate) up: bool,
}

/// Every address on this host's interfaces (getifaddrs(3)).
pub(crate) fn host_interfaces() -> std::io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we walk read-only and free once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(e.kind(), format!("getifaddrs: {e}")));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a live node of the list until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says its type.
        let addr = match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
            libc::AF_INET => {
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push(IfAddr {
            name,
            addr,
            up: ifa.ifa_flags & libc::IFF_UP as u32 != 0,
        });
    }
    // SAFETY: head came from getifaddrs and nothing borrows it any more.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

const RTF_UP: u32 = 0x0001;
const RTF_REJECT: u32 = 0x0200;

/// Interfaces of the IPv4 default routes (destination and mask 0, route
/// up) in /proc/net/route text, in file order.
pub(crate) fn parse_default_routes_v4(text: &str) -> Result<Vec<String>, MachineError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let bad = || MachineError(format!("/proc/net/route line {}: {line:?}", n + 1));
        if f.len() < 8 {
            return Err(bad());
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        let (dest, flags, mask) = (hex(f[1])?, hex(f[3])?, hex(f[7])?);
        if dest == 0 && mask == 0 && flags & RTF_UP != 0 && flags & RTF_REJECT == 0 {
            out.push(f[0].to_string());
        }
    }
    Ok(out)
}

/// Interfaces of the IPv6 default routes (::/0, route up, not a reject
/// route) in /proc/net/ipv6_route text, in file order.
pub(crate) fn parse_default_routes_v6(text: &str) -> Result<Vec<String>, MachineError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let bad = || MachineError(format!("/proc/net/ipv6_route line {}: {line:?}", n + 1));
        if f.len() < 10 || f[0].len() != 32 {
            return Err(bad());
        }
        let dest = u128::from_str_radix(f[0], 16).map_err(|_| bad())?;
        let prefix = u8::from_str_radix(f[1], 16).map_err(|_| bad())?;
        let flags = u32::from_str_radix(f[8], 16).map_err(|_| bad())?;
        if dest == 0 && prefix == 0 && flags & RTF_UP != 0 && flags & RTF_REJECT == 0 {
            out.push(f[9].to_string());
        }
    }
    Ok(out)
}

/// Go's `IsGlobalUnicast` plus what the kubelet rejects for a node IP:
/// not loopback, link-local, multicast, unspecified or broadcast.
fn is_global_unicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_unspecified()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// Checks a `--node-ip` as the kubelet does: a usable unicast address
/// that one of this host's interfaces holds.
pub(crate) fn validate_node_ip(ip: IpAddr, ifaces: &[IfAddr]) -> Result<(), MachineError> {
    let why = match ip {
        ip if ip.is_loopback() => Some("a loopback address"),
        ip if ip.is_multicast() => Some("a multicast address"),
        ip if ip.is_unspecified() => Some("an all-zeros address"),
        ip if !is_global_unicast(&ip) => Some("a link-local or broadcast address"),
        _ => None,
    };
    if let Some(why) = why {
        return Err(MachineError(format!("--node-ip {ip}: can't be {why}")));
    }
    if !ifaces.iter().any(|i| i.addr == ip) {
        return Err(MachineError(format!(
            "--node-ip {ip}: not found in the host's network interfaces"
        )));
    }
    Ok(())
}

/// The Node's `status.addresses` for this host, as (type, address), in the
/// kubelet's order: InternalIP, then Hostname.
///
/// The InternalIP is `node_ip` if given (validated, see
/// [`validate_node_ip`]), else `hostname` if it is an IP literal, else the
/// global unicast IPv4 address of the first IPv4 default route's interface
/// (/proc/net/route), else the IPv6 one of the first IPv6 default route's
/// (/proc/net/ipv6_route).
pub(crate) fn node_addresses(
    node_ip: Option<IpAddr>,
    hostname: &str,
) -> Result<Vec<(String, String)>, MachineError> {
    let ifaces = host_interfaces().map_err(|e| MachineError(e.to_string()))?;
    let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    choose_addresses(node_ip, hostname, &ifaces, &v4, &v6)
}

/// [`node_addresses`] over given interfaces and route tables.
pub(crate) fn choose_addresses(
    node_ip: Option<IpAddr>,
    hostname: &str,
    ifaces: &[IfAddr],
    route_v4: &str,
    route_v6: &str,
) -> Result<Vec<(String, String)>, MachineError> {
    let ip = match node_ip {
        Some(ip) => {
            validate_node_ip(ip, ifaces)?;
            ip
        }
        None => match hostname.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => default_route_ip(ifaces, route_v4, route_v6).map_err(|e| {
                MachineError(format!(
                    "can't get the IP address of node {hostname} (set --node-ip): {e}"
                ))
            })?,
        },
    };
    Ok(vec![
        ("InternalIP".to_string(), ip.to_string()),
        ("Hostname".to_string(), hostname.to_string()),
    ])
}

/// The address of the default route's interface, IPv4 routes first.
fn default_route_ip(
    ifaces: &[IfAddr],
    route_v4: &str,
    route_v6: &str,
) -> Result<IpAddr, MachineError> {
    let pick = |routes: Vec<String>, want_v4: bool| {
        routes.iter().find_map(|iface| {
            ifaces
                .iter()
                .find(|a| {
                    a.name == *iface
                        && a.up
                        && a.addr.is_ipv4() == want_v4
                        && is_global_unicast(&a.addr)
                })
                .map(|a| a.addr)
        })
    };
    let v4_routes = parse_default_routes_v4(route_v4);
    let v6_routes = parse_default_routes_v6(route_v6);
    if let Some(ip) = v4_routes.clone().ok().and_then(|r| pick(r, true)) {
        return Ok(ip);
    }
    if let Some(ip) = v6_routes.clone().ok().and_then(|r| pick(r, false)) {
        return Ok(ip);
    }
    match (v4_routes, v6_routes) {
        (Err(e), _) | (_, Err(e)) => Err(e),
        (Ok(a), Ok(b)) if a.is_empty() && b.is_empty() => Err(MachineError(
            "no default route in /proc/net/route or /proc/net/ipv6_route".into(),
        )),
        _ => Err(MachineError(
            "no default route's interface has a global unicast address".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
        wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n\
        eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
        eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";

    const ROUTE6: &str = "\
        fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
        00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n\
        00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";

    fn iface(name: &str, addr: &str, up: bool) -> IfAddr {
        IfAddr {
            name: name.to_string(),
            addr: addr.parse().unwrap(),
            up,
        }
    }

    #[test]
    fn default_routes_from_proc_text() {
        assert_eq!(
            parse_default_routes_v4(ROUTE).unwrap(),
            vec!["wlan0", "eth0"]
        );
        assert_eq!(parse_default_routes_v6(ROUTE6).unwrap(), vec!["eth0"]);
        assert!(parse_default_routes_v4("Iface\tDestination\n")
            .unwrap()
            .is_empty());
        let e = parse_default_routes_v4("Iface\neth0 zz 0 3 0 0 0 00000000\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/proc/net/route line 2: \"eth0 zz 0 3 0 0 0 00000000\""
        );
        assert!(parse_default_routes_v6("short line\n").is_err());
    }

    #[test]
    fn addresses_in_upstream_order() {
        let ifaces = [
            iface("lo", "127.0.0.1", true),
            iface("wlan0", "192.168.1.5", false),
            iface("eth0", "fe80::1", true),
            iface("eth0", "10.0.2.15", true),
            iface("eth0", "fd00::2", true),
        ];
        let pair = |t: &str, a: &str| (t.to_string(), a.to_string());
        // The down wlan0 is skipped; eth0's global IPv4 wins.
        assert_eq!(
            choose_addresses(None, "edge-1", &ifaces, ROUTE, ROUTE6).unwrap(),
            vec![pair("InternalIP", "10.0.2.15"), pair("Hostname", "edge-1")]
        );
        // No IPv4 default route: the IPv6 one's global address.
        assert_eq!(
            choose_addresses(None, "edge-1", &ifaces, "Iface\n", ROUTE6).unwrap()[0],
            pair("InternalIP", "fd00::2")
        );
        // A hostname that is an IP is used as is.
        assert_eq!(
            choose_addresses(None, "10.9.9.9", &ifaces, ROUTE, ROUTE6).unwrap(),
            vec![pair("InternalIP", "10.9.9.9"), pair("Hostname", "10.9.9.9")]
        );
        // --node-ip, when it is one of ours.
        let ip = "fd00::2".parse().ok();
        assert_eq!(
            choose_addresses(ip, "edge-1", &ifaces, ROUTE, ROUTE6).unwrap()[0],
            pair("InternalIP", "fd00::2")
        );
        let err = |ip: &str| {
            choose_addresses(ip.parse().ok(), "edge-1", &ifaces, ROUTE, ROUTE6)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("127.0.0.1"),
            "--node-ip 127.0.0.1: can't be a loopback address"
        );
        assert_eq!(
            err("224.0.0.1"),
            "--node-ip 224.0.0.1: can't be a multicast address"
        );
        assert_eq!(
            err("0.0.0.0"),
            "--node-ip 0.0.0.0: can't be an all-zeros address"
        );
        assert_eq!(
            err("fe80::1"),
            "--node-ip fe80::1: can't be a link-local or broadcast address"
        );
        assert_eq!(
            err("10.0.2.16"),
            "--node-ip 10.0.2.16: not found in the host's network interfaces"
        );
        // Nothing to go on.
        let e = choose_addresses(None, "edge-1", &ifaces, "Iface\n", "").unwrap_err();
        assert_eq!(
            e.to_string(),
            "can't get the IP address of node edge-1 (set --node-ip): \
             no default route in /proc/net/route or /proc/net/ipv6_route"
        );
        let only_lo = [iface("lo", "127.0.0.1", true)];
        let e = choose_addresses(None, "edge-1", &only_lo, ROUTE, "").unwrap_err();
        assert!(
            e.to_string()
                .ends_with("no default route's interface has a global unicast address"),
            "{e}"
        );
    }

    #[test]
    fn addresses_of_this_host() {
        let ifaces = host_interfaces().unwrap();
        assert!(ifaces.iter().any(|i| i.addr.is_loopback()));
        // Whatever this host's default route gives must pass --node-ip
        // validation, since it is one of its own addresses.
        if let Ok(addrs) = node_addresses(None, "here") {
            assert_eq!(addrs[1], ("Hostname".to_string(), "here".to_string()));
            let ip: IpAddr = addrs[0].1.parse().unwrap();
            assert_eq!(node_addresses(Some(ip), "here").unwrap(), addrs);
        }
    }
}
