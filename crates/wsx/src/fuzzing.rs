//! Entry points for the fuzz targets (`fuzz/`): the configuration file, and the edits the
//! API makes to it from request bodies. Whatever the bytes, the answer is a value or an
//! error, never a panic.

use crate::config::{Loaded, edit};
use std::path::Path;
use wsx_api::model::{FilterBody, ScenarioBody, ShaperEdit};

/// Parses `data` as a configuration file and derives everything a start would.
pub fn config_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    check(text);
}

/// A file as `PUT /api/v1/config` or a start reads it: parsed, then each part checked.
fn check(text: &str) {
    let Ok(loaded) = Loaded::parse(Path::new("fuzz.toml"), text.to_owned()) else {
        return;
    };
    let _ = loaded.api();
    let _ = loaded.gateway();
    let _ = loaded.shaping();
}

/// A configuration with a shaper, as the edits start from: two scenarios, a list, filters.
const BASE: &str = r#"# An operator's comment.
[tunnel]
private_key = "MHO2Y2n1HcHeNrBqO+T8gkcN1Kj8gJ1f0+Jt0sZ/u0A="

[[peer]]
name = "b"
public_key = "k4KXZc5oAZ9pWJ0IeOdJXcN+ESSg0cM4w6XkbR4FvD8="
endpoint = "192.0.2.2:4500"
prefixes = ["10.2.0.0/16", "2001:db8:2::/48"]

[shaper]
wan_rate = "100 Mbit/s"

[[address_list]]
name = "servers"
prefixes = ["10.2.1.0/24", "2001:db8:2:1::/64"]

[[scenario]]
name = "office"
min_rate = "20 Mbit/s"
priority = 1

[[scenario]]
name = "smb"
parent = "office"
priority = 0

[[scenario]]
name = "bulk"
parent = "office"
max_rate = "50 Mbit/s"

[[filter]]
scenario = "smb"
destination_list = ["servers"]
destination_port = [445, "8000-8080"]

[[filter]]
scenario = "bulk"
source = ["10.1.0.0/16"]
"#;

/// An edit as the API builds it: the first byte picks the route (put or delete a
/// scenario, add, put or delete a filter), the second a position; for a scenario the name
/// (the path's segment) runs to the first newline; the rest is the request's JSON body.
/// The edit is applied to [`BASE`] and the result checked like a new file.
pub fn shaper_edit(data: &[u8]) {
    let [route, position, rest @ ..] = data else {
        return;
    };
    let index = usize::from(*position % 8);
    let (name, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(at) => (
            String::from_utf8_lossy(&rest[..at]).into_owned(),
            &rest[at + 1..],
        ),
        None => (String::new(), rest),
    };
    let edit = match route % 5 {
        0 => {
            let Some(fields) = fields_of::<ScenarioBody>(body) else {
                return;
            };
            ShaperEdit::PutScenario { name, fields }
        }
        1 => ShaperEdit::DeleteScenario { name },
        2 => {
            let Some(fields) = fields_of::<FilterBody>(body) else {
                return;
            };
            let at = (*position >= 8).then_some(index);
            ShaperEdit::AddFilter { at, fields }
        }
        3 => {
            let Some(fields) = fields_of::<FilterBody>(body) else {
                return;
            };
            ShaperEdit::PutFilter { index, fields }
        }
        _ => ShaperEdit::DeleteFilter { index },
    };
    if let Ok(edited) = edit::apply(BASE, &edit) {
        check(&edited);
    }
}

/// The body as the API's JSON extractor reads it, back as the object the edit takes.
fn fields_of<T: serde::de::DeserializeOwned + serde::Serialize>(
    body: &[u8],
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let body: T = serde_json::from_slice(body).ok()?;
    match serde_json::to_value(body).ok()? {
        serde_json::Value::Object(fields) => Some(fields),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The base file is valid as it stands: the edits start from a working configuration.
    #[test]
    fn the_base_file_is_a_valid_configuration() {
        let loaded = Loaded::parse(Path::new("base.toml"), BASE.to_owned())
            .unwrap_or_else(|e| panic!("{e:#}"));
        loaded.gateway().unwrap_or_else(|e| panic!("{e:#}"));
        let shaping = loaded.shaping().unwrap_or_else(|e| panic!("{e:#}"));
        assert!(shaping.is_some());
    }

    /// A well-formed edit goes through the whole chain.
    #[test]
    fn an_edit_from_a_body_is_applied() {
        let body = br#"{"max_rate": "5 Mbit/s", "priority": 7}"#;
        let fields = fields_of::<ScenarioBody>(body).unwrap_or_else(|| panic!("parsed"));
        let edited = edit::apply(
            BASE,
            &ShaperEdit::PutScenario {
                name: "backup".into(),
                fields,
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let loaded =
            Loaded::parse(Path::new("edited.toml"), edited).unwrap_or_else(|e| panic!("{e:#}"));
        let shaping = loaded
            .shaping()
            .unwrap_or_else(|e| panic!("{e:#}"))
            .unwrap_or_else(|| panic!("a shaper"));
        assert_eq!(shaping.scenarios.len(), 4);
        // And the entry point takes the same bytes without complaint.
        let mut data = vec![0u8, 0];
        data.extend_from_slice(b"backup\n");
        data.extend_from_slice(body);
        shaper_edit(&data);
    }
}
