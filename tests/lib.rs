//! End-to-end tests of wsx: real kernel TCP through the lab's namespaces and emulated WAN.
//! The tests live in `tests/`; they need root and are run by `cargo xtask test`.
