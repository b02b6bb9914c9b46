//! Pod status: generating the API status of a pod from its spec and the
//! runtime's view of it (`generate`), the patch that takes the apiserver's
//! copy to it (`patch`), and reporting it to the apiserver (`manager`).
//!
//! Generation is pure (no I/O, no threads): the reporter feeds it the
//! runtime's state and the last status the apiserver holds, and sends the
//! strategic-merge patch it computes.

pub(crate) mod generate;
pub(crate) mod manager;
pub(crate) mod patch;
