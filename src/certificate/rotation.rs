//! Certificate rotation (client-go's certificate manager as the kubelet
//! runs it), for the client certificate (`--rotate-certificates`) and the
//! node API's serving certificate (`serverTLSBootstrap`, below). For the
//! client pair the `cert-rotation` thread
//! sleeps until a jittered 70–90% of the current certificate's life, asks
//! for a new one with the node's own credentials (what the csrapproving
//! controller's `selfnodeclient` rule approves), keeps it in the store and
//! switches the node's client over: every later connection presents it and
//! the open ones are closed, so requests and watches are made again at once
//! (a watch resumes from its resourceVersion; nothing is listed again).
//! Until the new pair works the old one stays current.
//!
//! A certificate that expired before it could be renewed (a node that was
//! off or cut off for its whole renewal window) cannot ask for its own
//! successor: the request goes with the bootstrap credentials when
//! `--bootstrap-kubeconfig` still exists, and the log and the Node's events
//! say what happened.
//!
//! The `serving-cert` thread asks for a serving certificate (signer
//! `kubernetes.io/kubelet-serving`, the node's DNS names and IPs) when the
//! store has none that is good, logs that it waits for an approval (nothing
//! approves these automatically), puts it in the node API's TLS settings
//! once issued, and renews it the same way.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use log::{error, info, warn};

use super::request::Error;
use super::store::{Pair, Store};
use super::Spec;
use crate::events::{EventRecorder, EventType, ObjectRef};
use crate::kube::{load_kubeconfig, Client, ClientOptions};

/// The part of a certificate's life after which it is renewed: a random
/// point in [LOW, LOW + SPREAD) (upstream: 70% plus up to 20%).
const LOW: f64 = 0.7;
const SPREAD: f64 = 0.2;

/// The longest single sleep: the wall clock is read again after it, so a
/// clock set forward (or a suspend) is noticed.
const MAX_SLEEP: Duration = Duration::from_secs(600);

/// Which pair is kept fresh.
pub(crate) enum Kind {
    /// The node's client certificate, already in use by `client`. When it
    /// has expired, the bootstrap kubeconfig (if it still exists) asks.
    Client {
        bootstrap_kubeconfig: Option<PathBuf>,
        client_options: ClientOptions,
    },
    /// The node API's serving certificate (`serverTLSBootstrap`): asked for
    /// at once when the store has none that is good; until one is issued
    /// the server keeps what it has.
    Serving,
}

/// Puts a newly stored pair in use; an error is retried like a failed
/// request.
pub(crate) type OnIssued = Box<dyn Fn(&Pair) -> Result<(), String> + Send>;

/// What a rotation thread needs.
pub(crate) struct Rotation {
    /// Where the pair is kept (`kubelet-client`, `kubelet-server`).
    pub(crate) store: Store,
    pub(crate) spec: Spec,
    pub(crate) kind: Kind,
    /// The node's client: it asks.
    pub(crate) client: Client,
    /// Puts a newly stored pair in use (the client's identity, the
    /// server's certificate); an error is retried like a failed request.
    pub(crate) on_issued: OnIssued,
    /// First and longest pause between failed tries.
    pub(crate) backoff: (Duration, Duration),
    /// How long one request is waited for.
    pub(crate) wait: Duration,
    pub(crate) recorder: EventRecorder,
}

/// When a pair is renewed: `fraction` (in [0, 1)) of the way from 70% to
/// 90% of its life.
pub(crate) fn deadline(pair: &Pair, fraction: f64) -> SystemTime {
    let life = pair
        .not_after
        .duration_since(pair.not_before)
        .unwrap_or(Duration::ZERO);
    pair.not_before + life.mul_f64(LOW + SPREAD * fraction.clamp(0.0, 1.0))
}

/// A random fraction in [0, 1).
fn jitter() -> f64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 4];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        return 0.5;
    }
    f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

impl Rotation {
    /// Starts the thread (`cert-rotation`, `serving-cert`); it ends when
    /// `stop` fires or is dropped.
    pub(crate) fn start(
        self,
        stop: Receiver<()>,
    ) -> std::io::Result<crate::thread::JoinOnDrop<()>> {
        let name = match self.kind {
            Kind::Client { .. } => "cert-rotation",
            Kind::Serving => "serving-cert",
        };
        crate::thread::spawn_named(name, move || self.run(&stop))
    }

    fn what(&self) -> &'static str {
        match self.kind {
            Kind::Client { .. } => "client certificate",
            Kind::Serving => "serving certificate",
        }
    }

    fn run(self, stop: &Receiver<()>) {
        let current = match self.store.current() {
            Ok(p) => p,
            Err(e) => {
                warn!("{}: {e}", self.what());
                None
            }
        };
        let mut pair = match (current, &self.kind) {
            (Some(p), Kind::Client { .. }) => p,
            (None, Kind::Client { .. }) => {
                error!("certificate rotation: no current client certificate in the cert dir");
                return;
            }
            (Some(p), Kind::Serving) if p.valid_at(SystemTime::now()) => match (self.on_issued)(&p)
            {
                Ok(()) => {
                    info!("node API serving with {}", p.path.display());
                    p
                }
                Err(e) => {
                    warn!(
                        "serving certificate {}: {e}; asking for another",
                        p.path.display()
                    );
                    match self.renew(None, stop) {
                        Some(p) => p,
                        None => return,
                    }
                }
            },
            (_, Kind::Serving) => match self.renew(None, stop) {
                Some(p) => p,
                None => return,
            },
        };
        loop {
            let at = deadline(&pair, jitter());
            info!(
                "{} valid until {}; renewing it at {}",
                self.what(),
                crate::apitime::rfc3339(pair.not_after),
                crate::apitime::rfc3339(at)
            );
            if !sleep_until(at, stop) {
                return;
            }
            match self.renew(Some(&pair), stop) {
                Some(new) => pair = new,
                None => return,
            }
        }
    }

    /// Asks until a new pair is issued and in use; None when stopped.
    fn renew(&self, old: Option<&Pair>, stop: &Receiver<()>) -> Option<Pair> {
        let mut pause = self.backoff.0;
        let mut told_expired = false;
        loop {
            let ended = old
                .map(|o| o.not_after)
                .filter(|end| SystemTime::now() >= *end);
            let bootstrap = match (&self.kind, ended) {
                (
                    Kind::Client {
                        bootstrap_kubeconfig,
                        client_options,
                    },
                    Some(end),
                ) => {
                    if !told_expired {
                        told_expired = true;
                        let how = match bootstrap_kubeconfig {
                            Some(b) if b.exists() => {
                                format!("asking with the bootstrap credentials of {}", b.display())
                            }
                            _ => "no bootstrap kubeconfig to ask with: the node needs new credentials"
                                .into(),
                        };
                        error!(
                            "the client certificate expired at {} before it could be renewed; {how}",
                            crate::apitime::rfc3339(end)
                        );
                    }
                    Some(bootstrap_client(
                        bootstrap_kubeconfig.as_deref(),
                        client_options,
                    ))
                }
                _ => None,
            };
            let asked = match bootstrap {
                Some(c) => c.and_then(|c| super::ask(&c, &self.store, &self.spec, self.wait)),
                None => super::ask(&self.client, &self.store, &self.spec, self.wait),
            };
            match asked.and_then(|()| self.put_in_use()) {
                Ok(new) => {
                    info!(
                        "{} {}: valid until {}; in use now",
                        self.what(),
                        if old.is_some() { "renewed" } else { "issued" },
                        crate::apitime::rfc3339(new.not_after)
                    );
                    if let Some(end) = ended.filter(|_| matches!(self.kind, Kind::Client { .. })) {
                        self.recorder.event(
                            &ObjectRef::node(&self.spec.node),
                            EventType::Warning,
                            "ClientCertificateExpired",
                            format!(
                                "The node's client certificate expired at {} before it was renewed; a new one was issued through the bootstrap credentials.",
                                crate::apitime::rfc3339(end)
                            ),
                        );
                    }
                    return Some(new);
                }
                Err(e) => {
                    if let Error::Refused(_) = e {
                        let _ = std::fs::remove_file(self.store.pending_key_path());
                    }
                    warn!(
                        "{}: {e}; asking again in {}s",
                        self.what(),
                        pause.as_secs_f32()
                    );
                    match stop.recv_timeout(pause) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return None,
                    }
                    pause = (pause * 2).min(self.backoff.1);
                }
            }
        }
    }

    /// Puts the store's new current pair in use.
    fn put_in_use(&self) -> Result<Pair, Error> {
        let new = match self.store.current() {
            Ok(Some(p)) => p,
            Ok(None) => return Err(Error::Api("the new pair is not in the store".into())),
            Err(e) => return Err(Error::Api(e)),
        };
        (self.on_issued)(&new).map_err(|e| Error::Api(format!("the new pair: {e}")))?;
        Ok(new)
    }
}

/// A client with the bootstrap credentials, if they still exist.
fn bootstrap_client(
    path: Option<&std::path::Path>,
    options: &ClientOptions,
) -> Result<Client, Error> {
    let Some(path) = path.filter(|p| p.exists()) else {
        return Err(Error::Api(
            "the certificate has expired and there is no bootstrap kubeconfig".into(),
        ));
    };
    let config =
        load_kubeconfig(path).map_err(|e| Error::Api(format!("--bootstrap-kubeconfig: {e}")))?;
    Client::new(&config, options.clone())
        .map_err(|e| Error::Api(format!("--bootstrap-kubeconfig: {e}")))
}

/// Sleeps until the wall clock reaches `at`; false when stopped.
fn sleep_until(at: SystemTime, stop: &Receiver<()>) -> bool {
    loop {
        let left = match at.duration_since(SystemTime::now()) {
            Ok(d) if !d.is_zero() => d,
            _ => return true,
        };
        match stop.recv_timeout(left.min(MAX_SLEEP)) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(from: u64, to: u64) -> Pair {
        Pair {
            path: PathBuf::from("p"),
            cert_pem: Vec::new(),
            key_pem: Vec::new(),
            not_before: SystemTime::UNIX_EPOCH + Duration::from_secs(from),
            not_after: SystemTime::UNIX_EPOCH + Duration::from_secs(to),
        }
    }

    #[test]
    fn renewal_falls_between_70_and_90_percent_of_the_life() {
        let p = pair(1000, 2000);
        let at = |f| {
            deadline(&p, f)
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        };
        assert_eq!(at(0.0), 1700);
        assert_eq!(at(0.5), 1800);
        assert_eq!(at(0.999_999), 1899);
        assert_eq!(at(7.0), 1900);
        for _ in 0..1000 {
            let f = jitter();
            assert!((0.0..1.0).contains(&f), "{f}");
        }
        // A pair whose end comes before its start is renewed at once.
        let bad = pair(2000, 1000);
        assert_eq!(deadline(&bad, 0.5), bad.not_before);
    }

    #[test]
    fn a_deadline_in_the_past_does_not_sleep_and_a_stop_ends_the_sleep() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        assert!(sleep_until(SystemTime::now() - Duration::from_secs(5), &rx));
        tx.send(()).unwrap();
        let started = std::time::Instant::now();
        assert!(!sleep_until(
            SystemTime::now() + Duration::from_secs(60),
            &rx
        ));
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(tx);
        assert!(!sleep_until(
            SystemTime::now() + Duration::from_secs(60),
            &rx
        ));
    }
}
