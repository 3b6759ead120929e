//! Precision bandwidth control for wsx.
//!
//! This crate will hold the traffic classifier (filters to scenarios), the scenario tree (up to
//! eight levels; modes Acceleration, Aggregation, Fixed and Discard; minimum and maximum rates,
//! buffer sizes and eight priorities), token buckets, and a scheduler that gives every flow in a
//! scenario its fair share while keeping the rate error under one percent. It is a pure state
//! machine with time passed in. Nothing is implemented yet; see the project's issue tracker.
