//! The configuration file, as `wsx check-config`, a start or `PUT /api/v1/config` reads it:
//! parsed and every part checked, ending in a configuration or an error, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wsx::fuzzing::config_file(data);
});
