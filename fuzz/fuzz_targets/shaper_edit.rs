//! The API's shaper edits (`PUT`/`DELETE /api/v1/shaper/scenarios/NAME`, `POST`/`PUT`/
//! `DELETE /api/v1/shaper/filters`): a request body read as the API reads it, the edit made
//! to a configuration file and the result checked, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wsx::fuzzing::shaper_edit(data);
});
