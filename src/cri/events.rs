//! containerd's own event stream on the CRI socket
//! (`containerd.services.events.v1.Events/Subscribe`), which tells the PLEG
//! when a task or container of the CRI namespace changed, so that it can
//! relist then instead of every second.
//!
//! Only the two fields the PLEG reads are decoded, by hand (no generated
//! code for two messages): the envelope's `namespace` (2) and `topic` (3);
//! the timestamp (1) and the event itself (4) are skipped. The request is
//! `SubscribeRequest { repeated string filters = 1; }`. Field numbers are
//! containerd's (api/services/events/v1/events.proto).
//!
//! A stream is read on the caller's thread by polling the grpcio stream
//! with a waker that unparks that thread, so that [`Stopper::stop`] from
//! another thread ends a read that is waiting, without a deadline to poll
//! on.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use futures_core::Stream;
use grpcio::{ClientSStreamReceiver, GrpcSlice, Marshaller, MessageReader, Method, MethodType};
use parking_lot::Mutex;
use protobuf::{CodedInputStream, CodedOutputStream};

use super::error::CriError;

/// The method on containerd's socket.
pub(crate) const SUBSCRIBE: &str = "/containerd.services.events.v1.Events/Subscribe";
/// The namespace the CRI plugin keeps pods and images in.
pub(crate) const CRI_NAMESPACE: &str = "k8s.io";

/// What a subscription asks for: the filters (containerd's filter syntax;
/// several are alternatives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubscribeRequest {
    pub(crate) filters: Vec<String>,
}

/// One event: where it happened and what (`/tasks/exit`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envelope {
    pub(crate) namespace: String,
    pub(crate) topic: String,
}

/// The filters for changes to the CRI namespace's tasks and containers
/// (a sandbox is a container too).
pub(crate) fn change_filters() -> Vec<String> {
    ["/tasks/", "/containers/"]
        .iter()
        .map(|t| format!("namespace=={CRI_NAMESPACE},topic~=\"^{t}\""))
        .collect()
}

fn ser_request(req: &SubscribeRequest, buf: &mut GrpcSlice) -> grpcio::Result<()> {
    let bytes = encode_request(req).map_err(|e| grpcio::Error::Codec(Box::new(e)))?;
    *buf = GrpcSlice::from(bytes);
    Ok(())
}

fn de_request(_: MessageReader) -> grpcio::Result<SubscribeRequest> {
    Err(grpcio::Error::Codec(
        "a client does not decode requests".into(),
    ))
}

fn ser_envelope(_: &Envelope, _: &mut GrpcSlice) -> grpcio::Result<()> {
    Err(grpcio::Error::Codec(
        "a client does not encode events".into(),
    ))
}

pub(crate) fn encode_request(req: &SubscribeRequest) -> protobuf::Result<Vec<u8>> {
    let mut out = Vec::new();
    {
        let mut s = CodedOutputStream::vec(&mut out);
        for f in &req.filters {
            s.write_string(1, f)?;
        }
        s.flush()?;
    }
    Ok(out)
}

fn de_envelope(mut reader: MessageReader) -> grpcio::Result<Envelope> {
    let mut s = CodedInputStream::from_buf_read(&mut reader);
    decode_envelope(&mut s).map_err(|e| grpcio::Error::Codec(Box::new(e)))
}

pub(crate) fn decode_envelope(s: &mut CodedInputStream<'_>) -> protobuf::Result<Envelope> {
    let mut env = Envelope::default();
    while let Some(tag) = s.read_raw_tag_or_eof()? {
        match (tag >> 3, tag & 7) {
            (2, 2) => env.namespace = s.read_string()?,
            (3, 2) => env.topic = s.read_string()?,
            // Anything else (an unknown wire type is an error).
            _ => protobuf::rt::skip_field_for_tag(tag, s)?,
        }
    }
    Ok(env)
}

pub(crate) const METHOD_SUBSCRIBE: Method<SubscribeRequest, Envelope> = Method {
    ty: MethodType::ServerStreaming,
    name: SUBSCRIBE,
    req_mar: Marshaller {
        ser: ser_request,
        de: de_request,
    },
    resp_mar: Marshaller {
        ser: ser_envelope,
        de: de_envelope,
    },
};

/// Ends a [`ChangeStream::next`] that waits on another thread; the stream
/// then gives `None` for good.
#[derive(Clone, Default)]
pub struct Stopper(Arc<StopState>);

#[derive(Default)]
struct StopState {
    stopped: AtomicBool,
    /// The thread reading the stream, to wake.
    reader: Mutex<Option<Thread>>,
}

impl Stopper {
    pub(crate) fn stop(&self) {
        self.0.stopped.store(true, Ordering::SeqCst);
        if let Some(t) = self.0.reader.lock().as_ref() {
            t.unpark();
        }
    }

    /// Makes the calling thread the one `stop` wakes.
    pub(crate) fn read_here(&self) {
        *self.0.reader.lock() = Some(std::thread::current());
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::SeqCst)
    }
}

/// The runtime's change events, read one at a time.
pub trait ChangeStream: Send {
    /// Waits for the next event: `None` once the stream ended cleanly or
    /// was stopped, an error when it broke.
    fn next(&mut self) -> Option<Result<Envelope, CriError>>;
    /// What stops a `next` waiting on another thread.
    fn stopper(&self) -> Stopper;
}

struct Unparker(Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A grpcio server stream read as a [`ChangeStream`]; `fail` turns a
/// grpcio error into the caller's `CriError`.
pub(crate) struct GrpcChangeStream {
    rx: ClientSStreamReceiver<Envelope>,
    stopper: Stopper,
    fail: Box<dyn Fn(grpcio::Error) -> CriError + Send>,
}

impl GrpcChangeStream {
    pub(crate) fn new(
        rx: ClientSStreamReceiver<Envelope>,
        fail: Box<dyn Fn(grpcio::Error) -> CriError + Send>,
    ) -> Self {
        GrpcChangeStream {
            rx,
            stopper: Stopper::default(),
            fail,
        }
    }
}

impl ChangeStream for GrpcChangeStream {
    fn next(&mut self) -> Option<Result<Envelope, CriError>> {
        self.stopper.read_here();
        let waker = Waker::from(Arc::new(Unparker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if self.stopper.is_stopped() {
                self.rx.cancel();
                return None;
            }
            match Pin::new(&mut self.rx).poll_next(&mut cx) {
                Poll::Ready(Some(Ok(env))) => return Some(Ok(env)),
                Poll::Ready(Some(Err(e))) => return Some(Err((self.fail)(e))),
                Poll::Ready(None) => return None,
                // Unparked by the waker or by `Stopper::stop`.
                Poll::Pending => std::thread::park(),
            }
        }
    }

    fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_carries_each_filter_as_field_one() {
        let req = SubscribeRequest {
            filters: vec!["a".into(), "bc".into()],
        };
        assert_eq!(
            encode_request(&req).unwrap(),
            vec![0x0a, 1, b'a', 0x0a, 2, b'b', b'c']
        );
        assert_eq!(
            change_filters(),
            vec![
                "namespace==k8s.io,topic~=\"^/tasks/\"".to_string(),
                "namespace==k8s.io,topic~=\"^/containers/\"".to_string()
            ]
        );
    }

    #[test]
    fn an_envelope_gives_its_namespace_and_topic_and_skips_the_rest() {
        let mut bytes = Vec::new();
        {
            let mut s = CodedOutputStream::vec(&mut bytes);
            // timestamp (a message), namespace, topic, event (an Any), and
            // a field containerd might add later (a varint).
            s.write_bytes(1, &[0x08, 0x96, 0x01]).unwrap();
            s.write_string(2, "k8s.io").unwrap();
            s.write_string(3, "/tasks/exit").unwrap();
            s.write_bytes(4, b"\x0a\x03abc").unwrap();
            s.write_uint64(9, 7).unwrap();
            s.flush().unwrap();
        }
        let env = decode_envelope(&mut CodedInputStream::from_bytes(&bytes)).unwrap();
        assert_eq!(
            env,
            Envelope {
                namespace: "k8s.io".into(),
                topic: "/tasks/exit".into()
            }
        );
        // Cut short, or with a wire type that does not exist: an error, no panic.
        assert!(
            decode_envelope(&mut CodedInputStream::from_bytes(&bytes[..bytes.len() - 4])).is_err()
        );
        assert!(decode_envelope(&mut CodedInputStream::from_bytes(&[0x0f, 0x00])).is_err());
    }
}
