//! grpcio stubs for the CRI `RuntimeService` and `ImageService`, generated at
//! build time by `build.rs` from the same proto as [`super::api`].
//!
//! Per service `S`: a blocking client `SClient` (`SClient::new(channel)`, one
//! `method_opt(&req, CallOption)` per RPC; there is deliberately no variant
//! without a `CallOption`, because grpcio sets no deadline by default), a
//! server trait `S` whose methods default to `UNIMPLEMENTED`, and
//! `create_s(impl S) -> grpcio::Service` for `ServerBuilder::register_service`.

#![allow(missing_docs)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/cri_grpc.rs"));
