//! The puller: one pull through the registry token bucket, with the pod's
//! credentials in order, on the serialized `image-puller` thread
//! (`--serialize-image-pulls`) or on the caller's thread; and how pull
//! failures and durations are printed (as the Go kubelet prints them).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender};
use log::warn;
use parking_lot::Mutex;

use super::backoff::PullBucket;
use crate::cri::{api, CriError, ImageService};

/// Pull requests queued for the serial puller (upstream's
/// `maxImagePullRequests`).
const SERIAL_QUEUE: usize = 10;

/// A CRI error the way the kubelet prints gRPC errors in events and status
/// (`rpc error: code = Unknown desc = ...`); other failures as they are.
pub(crate) fn go_error(e: &CriError) -> String {
    use crate::cri::Code as C;
    let Some(code) = e.code() else {
        return e.to_string();
    };
    let message = match e {
        CriError::Status { message, .. } => message.as_str(),
        _ => "",
    };
    let name = match code {
        C::Ok => "OK",
        C::Cancelled => "Canceled",
        C::InvalidArgument => "InvalidArgument",
        C::DeadlineExceeded => "DeadlineExceeded",
        C::NotFound => "NotFound",
        C::AlreadyExists => "AlreadyExists",
        C::PermissionDenied => "PermissionDenied",
        C::ResourceExhausted => "ResourceExhausted",
        C::FailedPrecondition => "FailedPrecondition",
        C::Aborted => "Aborted",
        C::OutOfRange => "OutOfRange",
        C::Unimplemented => "Unimplemented",
        C::Internal => "Internal",
        C::Unavailable => "Unavailable",
        C::DataLoss => "DataLoss",
        C::Unauthenticated => "Unauthenticated",
        C::Unknown | C::Other(_) => "Unknown",
    };
    format!("rpc error: code = {name} desc = {message}")
}

/// Several failures as one message, duplicates once, like upstream's
/// aggregate error: `a`, or `[a, b]`.
pub(crate) fn aggregate(errors: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// What one pull gave.
#[derive(Debug)]
pub(super) struct Pulled {
    pub(super) result: Result<(String, u64), String>,
    /// The pull itself, without the wait for the serial puller.
    pub(super) took: Duration,
}

type Job = Box<dyn FnOnce() + Send>;

/// The `image-puller` thread of serialized pulls. `tx` is declared first so
/// it is dropped first: the thread's queue closes and it ends before the
/// join.
struct SerialQueue {
    tx: Sender<Job>,
    _thread: crate::thread::JoinOnDrop<()>,
}

impl SerialQueue {
    fn start() -> std::io::Result<SerialQueue> {
        // Capacity: a worker blocks on a full queue, which only adds to the
        // wait for its pull.
        let (tx, rx) = bounded::<Job>(SERIAL_QUEUE);
        let thread = crate::thread::spawn_named("image-puller", move || {
            for job in rx {
                job();
            }
        })?;
        Ok(SerialQueue {
            tx,
            _thread: thread,
        })
    }
}

/// Pulls through the token bucket, on the serial puller or the caller's thread.
pub(super) struct Puller {
    images: Arc<dyn ImageService>,
    bucket: Option<Arc<Mutex<PullBucket>>>,
    serialize: bool,
    /// Started at the first pull; None when the thread could not start
    /// (pulls then run on the caller's thread).
    serial: OnceLock<Option<SerialQueue>>,
}

/// One pull with the credentials in order (none: anonymous), then the
/// image's size.
fn pull_now(
    images: &dyn ImageService,
    bucket: Option<&Mutex<PullBucket>>,
    spec: &api::ImageSpec,
    creds: &[api::AuthConfig],
    sandbox: &api::PodSandboxConfig,
) -> Pulled {
    let start = Instant::now();
    if let Some(b) = bucket {
        if !b.lock().try_accept(Instant::now()) {
            return Pulled {
                result: Err("pull QPS exceeded".into()),
                took: start.elapsed(),
            };
        }
    }
    let result = if creds.is_empty() {
        images
            .pull_image(spec, None, Some(sandbox))
            .map_err(|e| go_error(&e))
    } else {
        let mut errors = Vec::new();
        let mut ok = None;
        for auth in creds {
            match images.pull_image(spec, Some(auth), Some(sandbox)) {
                Ok(r) => {
                    ok = Some(r);
                    break;
                }
                Err(e) => errors.push(go_error(&e)),
            }
        }
        ok.ok_or_else(|| aggregate(&errors))
    };
    let result = result.map(|image_ref| {
        let size = match images.image_status(spec) {
            Ok(Some(img)) => img.size,
            _ => 0,
        };
        (image_ref, size)
    });
    Pulled {
        result,
        took: start.elapsed(),
    }
}

impl Puller {
    pub(super) fn new(
        images: Arc<dyn ImageService>,
        bucket: Option<Arc<Mutex<PullBucket>>>,
        serialize: bool,
    ) -> Puller {
        Puller {
            images,
            bucket,
            serialize,
            serial: OnceLock::new(),
        }
    }

    pub(super) fn pull(
        &self,
        spec: &api::ImageSpec,
        creds: Vec<api::AuthConfig>,
        sandbox: &api::PodSandboxConfig,
    ) -> Pulled {
        let queue = if self.serialize {
            self.serial
                .get_or_init(|| match SerialQueue::start() {
                    Ok(q) => Some(q),
                    Err(e) => {
                        warn!("cannot start the image-puller thread ({e}); pulling on each pod's worker");
                        None
                    }
                })
                .as_ref()
        } else {
            None
        };
        let Some(queue) = queue else {
            return pull_now(
                self.images.as_ref(),
                self.bucket.as_deref(),
                spec,
                &creds,
                sandbox,
            );
        };
        let (reply_tx, reply_rx) = bounded(1);
        let images = self.images.clone();
        let bucket = self.bucket.clone();
        let spec = spec.clone();
        let sandbox = sandbox.clone();
        let job: Job = Box::new(move || {
            let p = pull_now(images.as_ref(), bucket.as_deref(), &spec, &creds, &sandbox);
            // The worker may have gone (tinylet stopping): nobody to tell.
            let _ = reply_tx.send(p);
        });
        let failed = |why: &str| Pulled {
            result: Err(why.to_string()),
            took: Duration::ZERO,
        };
        if queue.tx.send(job).is_err() {
            return failed("the image-puller thread has stopped");
        }
        reply_rx
            .recv()
            .unwrap_or_else(|_| failed("the image-puller thread has stopped"))
    }
}

/// Go's printing of a duration truncated to milliseconds: `150ms`, `1.5s`,
/// `2m3.004s`.
pub(crate) fn go_millis(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let frac = |ms: u128| {
        let s = format!("{:03}", ms % 1000);
        let s = s.trim_end_matches('0');
        if s.is_empty() {
            String::new()
        } else {
            format!(".{s}")
        }
    };
    let secs = ms / 1000;
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let tail = format!("{s}{}s", frac(ms));
    if h > 0 {
        format!("{h}h{m}m{tail}")
    } else if m > 0 {
        format!("{m}m{tail}")
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_print_like_go() {
        assert_eq!(go_millis(Duration::from_micros(150_400)), "150ms");
        assert_eq!(go_millis(Duration::from_millis(8658)), "8.658s");
        assert_eq!(go_millis(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_millis(Duration::from_secs(2)), "2s");
        assert_eq!(go_millis(Duration::from_millis(123_004)), "2m3.004s");
        assert_eq!(go_millis(Duration::ZERO), "0s");
        let e = CriError::status(
            "PullImage",
            "unix:///x",
            crate::cri::Code::Unknown,
            "failed to pull: 401 Unauthorized",
        );
        assert_eq!(
            go_error(&e),
            "rpc error: code = Unknown desc = failed to pull: 401 Unauthorized"
        );
        assert_eq!(aggregate(&["a".into()]), "a");
        assert_eq!(aggregate(&["a".into(), "a".into()]), "a");
        assert_eq!(aggregate(&["a".into(), "b".into(), "a".into()]), "[a, b]");
    }
}
