//! The CRI `runtime.v1` messages, generated at build time from
//! `proto/runtime/v1/api.proto` by protobuf-codegen (lite runtime).
//!
//! Shapes of the generated types (protobuf 3.7): scalar and string fields are
//! plain public fields; singular message fields are `protobuf::MessageField<T>`
//! (`MessageField::some(x)`, `.as_ref()`, `.is_some()`, `Default` = unset);
//! enum fields are `protobuf::EnumOrUnknown<E>` (`EnumOrUnknown::new(E::X)`,
//! `.enum_value()` -> `Result<E, i32>`, `.enum_value_or_default()`); maps are
//! `std::collections::HashMap<String, String>`; repeated fields are `Vec<T>`.
//! Enum variants keep their proto names (`ContainerState::CONTAINER_RUNNING`);
//! a nested enum lives in a snake-case module (`security_profile::ProfileType`).

#![allow(unknown_lints)]
#![allow(clippy::all)]
#![allow(unused_attributes)]
#![allow(dead_code)]
#![allow(missing_docs)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(non_upper_case_globals)]
#![allow(trivial_casts)]
#![allow(unused_results)]
#![allow(unused_mut)]

include!(concat!(env!("OUT_DIR"), "/cri_api.rs"));
