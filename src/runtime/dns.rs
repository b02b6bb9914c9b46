//! A pod's DNS and hosts file (upstream `pkg/kubelet/network/dns` and
//! `ensureHostsFile`): its resolver settings from dnsPolicy, dnsConfig, the
//! node's `--cluster-dns`, `--cluster-domain` and `--resolv-conf`, within
//! the resolvers' limits (with upstream's warnings); its hostname and
//! domain; and the managed `/etc/hosts`.

use k8s_openapi::api::core::v1::Pod;

use super::NodeSettings;
use crate::cri::api;
use crate::pod::{pod_name, pod_namespace, pod_uid};

/// The resolver settings of a resolv.conf: nameservers, search domains
/// (the last `search` line; trailing dots dropped, `.` ignored) and options.
fn parse_resolv_conf(text: &str) -> api::DNSConfig {
    let mut dns = api::DNSConfig::new();
    for line in text.lines() {
        if line.starts_with(['#', ';']) {
            continue;
        }
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(String::from)),
            Some("search") => {
                dns.searches = words
                    .filter(|w| *w != ".")
                    .map(|w| w.trim_end_matches('.').to_string())
                    .collect();
            }
            Some("options") => merge_options(
                &mut dns.options,
                words.map(|w| match w.split_once(':') {
                    Some((k, v)) => (k.to_string(), Some(v.to_string())),
                    None => (w.to_string(), None),
                }),
            ),
            _ => {}
        }
    }
    dns
}

/// Adds resolver options, a later one replacing an earlier one of the same
/// name in its place.
fn merge_options(into: &mut Vec<String>, options: impl Iterator<Item = (String, Option<String>)>) {
    for (name, value) in options {
        let text = match value.filter(|v| !v.is_empty()) {
            Some(v) => format!("{name}:{v}"),
            None => name.clone(),
        };
        let same = |o: &String| o.split_once(':').map_or(o.as_str(), |(k, _)| k) == name;
        match into.iter_mut().find(|o| same(o)) {
            Some(slot) => *slot = text,
            None => into.push(text),
        }
    }
}

fn push_unique(into: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for item in items {
        if !into.contains(&item) {
            into.push(item);
        }
    }
}

/// The most nameservers a resolver uses.
const MAX_DNS_NAMESERVERS: usize = 3;
/// The most search domains, and the longest search line, a pod gets.
const MAX_DNS_SEARCH_PATHS: usize = 32;
const MAX_DNS_SEARCH_LIST_CHARS: usize = 2048;
/// Longer search domains make some resolvers abort.
const MAX_DNS_SEARCH_DOMAIN_CHARS: usize = 253;

/// A pod's DNS settings (upstream `GetPodDNS`) from its dnsPolicy and
/// dnsConfig, the node's settings and the text of the node's resolver
/// configuration, with warnings as (event reason, message).
pub(crate) fn pod_dns(
    pod: &Pod,
    settings: &NodeSettings,
    host_resolv_conf: &str,
) -> (api::DNSConfig, Vec<(&'static str, String)>) {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let mut warnings = Vec::new();
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let mut cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        _ => false,
    };
    if cluster && settings.cluster_dns.is_empty() {
        warnings.push((
            "MissingClusterDNS",
            format!(
                "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
                format!("{}_{}({})", pod_name(pod), pod_namespace(pod), pod_uid(pod))
            ),
        ));
        cluster = false;
    }
    let mut dns = if settings.resolv_conf.as_os_str().is_empty() {
        api::DNSConfig::new()
    } else {
        parse_resolv_conf(host_resolv_conf)
    };
    if policy == "None" {
        dns = api::DNSConfig::new();
    } else if cluster {
        dns.servers = settings.cluster_dns.clone();
        if !settings.cluster_domain.is_empty() {
            let d = &settings.cluster_domain;
            let mut searches = vec![
                format!("{}.svc.{d}", pod_namespace(pod)),
                format!("svc.{d}"),
                d.clone(),
            ];
            push_unique(&mut searches, std::mem::take(&mut dns.searches));
            dns.searches = searches;
        }
        dns.options = vec!["ndots:5".into()];
    } else if settings.resolv_conf.as_os_str().is_empty() {
        // No resolver configuration: point at the local host, which resolves
        // nothing unless something listens there.
        let v6 = settings.host_ips.iter().any(|ip| ip.contains(':'));
        let v4 = settings.host_ips.iter().any(|ip| !ip.contains(':'));
        if v4 || !v6 {
            dns.servers.push("127.0.0.1".into());
        }
        if v6 {
            dns.servers.push("::1".into());
        }
        dns.searches = vec![".".into()];
    }
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        let servers: Vec<String> = dns.servers.drain(..).collect();
        push_unique(&mut dns.servers, servers);
        push_unique(
            &mut dns.servers,
            extra.nameservers.iter().flatten().cloned(),
        );
        let searches: Vec<String> = dns.searches.drain(..).collect();
        push_unique(&mut dns.searches, searches);
        push_unique(&mut dns.searches, extra.searches.iter().flatten().cloned());
        merge_options(
            &mut dns.options,
            extra
                .options
                .iter()
                .flatten()
                .map(|o| (o.name.clone().unwrap_or_default(), o.value.clone())),
        );
    }
    if dns.servers.len() > MAX_DNS_NAMESERVERS {
        dns.servers.truncate(MAX_DNS_NAMESERVERS);
        warnings.push((
            "DNSConfigForming",
            format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                dns.servers.join(" ")
            ),
        ));
    }
    let mut exceeded = false;
    if dns.searches.len() > MAX_DNS_SEARCH_PATHS {
        dns.searches.truncate(MAX_DNS_SEARCH_PATHS);
        exceeded = true;
    }
    let before = dns.searches.len();
    dns.searches
        .retain(|d| d.len() <= MAX_DNS_SEARCH_DOMAIN_CHARS);
    exceeded |= dns.searches.len() != before;
    while dns.searches.join(" ").len() > MAX_DNS_SEARCH_LIST_CHARS {
        dns.searches.pop();
        exceeded = true;
    }
    if exceeded {
        warnings.push((
            "DNSConfigForming",
            format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                dns.searches.join(" ")
            ),
        ));
    }
    (dns, warnings)
}

/// The node's resolver configuration's text ("" when there is none or it
/// cannot be read).
pub(crate) fn read_host_resolv_conf(settings: &NodeSettings) -> String {
    if settings.resolv_conf.as_os_str().is_empty() {
        return String::new();
    }
    std::fs::read_to_string(&settings.resolv_conf).unwrap_or_else(|e| {
        log::debug!("--resolv-conf {}: {e}", settings.resolv_conf.display());
        String::new()
    })
}

/// A pod's hostname and DNS domain (upstream `GeneratePodHostNameAndDomain`):
/// `spec.hostname` or the pod's name, at most 63 characters; the domain is
/// `<subdomain>.<namespace>.svc.<cluster domain>` when a subdomain is set.
pub(crate) fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> (String, String) {
    let spec = pod.spec.as_ref();
    let mut hostname = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod_name(pod).to_string());
    if hostname.len() > 63 {
        hostname.truncate(63);
        let trimmed = hostname.trim_end_matches(['-', '.']).len();
        hostname.truncate(trimmed);
    }
    let domain = match spec.and_then(|s| s.subdomain.as_deref()) {
        Some(sub) if !sub.is_empty() => {
            format!("{sub}.{}.svc.{cluster_domain}", pod_namespace(pod))
        }
        _ => String::new(),
    };
    (hostname, domain)
}

/// The pod's managed `/etc/hosts` (upstream `ensureHostsFile`): for a
/// hostNetwork pod the node's own file (`node_hosts`), else localhost
/// entries and the pod's IPs with its hostname (and FQDN); then the
/// pod's hostAliases.
pub(crate) fn etc_hosts_content(
    pod: &Pod,
    settings: &NodeSettings,
    pod_ips: &[String],
    node_hosts: &str,
) -> String {
    let spec = pod.spec.as_ref();
    let mut out = String::new();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        out.push_str("# Kubernetes-managed hosts file (host network).\n");
        out.push_str(node_hosts);
    } else {
        out.push_str(
            "# Kubernetes-managed hosts file.\n\
             127.0.0.1\tlocalhost\n\
             ::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\n\
             fe00::0\tip6-mcastprefix\n\
             fe00::1\tip6-allnodes\n\
             fe00::2\tip6-allrouters\n",
        );
        let (hostname, domain) = hostname_and_domain(pod, &settings.cluster_domain);
        for ip in pod_ips {
            if domain.is_empty() {
                out.push_str(&format!("{ip}\t{hostname}\n"));
            } else {
                out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
            }
        }
    }
    let aliases = spec.and_then(|s| s.host_aliases.as_deref()).unwrap_or(&[]);
    if !aliases.is_empty() {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            out.push_str(&a.ip);
            for h in a.hostnames.iter().flatten() {
                out.push('\t');
                out.push_str(h);
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_from_resolv_conf() {
        let d = parse_resolv_conf(
            "# x\n; y\nnameserver 1.1.1.1\nnameserver 8.8.8.8\nsearch old\nsearch a.b. . c\n\
             options ndots:2 rotate\noptions ndots:3\n",
        );
        assert_eq!(d.servers, vec!["1.1.1.1", "8.8.8.8"]);
        assert_eq!(d.searches, vec!["a.b", "c"]);
        assert_eq!(d.options, vec!["ndots:3", "rotate"]);
    }
}
