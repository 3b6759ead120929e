//! Edits of the configuration file's shaper part, as the API asks for them: a scenario put
//! or deleted by name, a filter added, replaced or deleted by position. The file is edited
//! as a document (`toml_edit`), so everything else in it, comments included, stays as the
//! operator wrote it; the result is then checked and applied like any new file.

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};
use wsx_api::model::ShaperEdit;

/// Why an edit could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EditError {
    /// The file is not TOML (it was when it was loaded; it changed on disk).
    #[error("the configuration file does not parse: {0}")]
    File(String),
    /// No such scenario or filter.
    #[error("{0}")]
    NotFound(String),
    /// The new entry's fields do not make a TOML table.
    #[error("{0}")]
    Fields(String),
}

/// `text` with `edit` made.
pub(crate) fn apply(text: &str, edit: &ShaperEdit) -> Result<String, EditError> {
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| EditError::File(e.to_string()))?;
    match edit {
        ShaperEdit::PutScenario { name, fields } => {
            let mut table = table_of(fields)?;
            table.insert("name", toml_edit::value(name.as_str()));
            // `name` first, as an operator would write it.
            table.sort_values_by(|a, _, b, _| (a.get() != "name").cmp(&(b.get() != "name")));
            let list = entries(&mut doc, "scenario")?;
            match position(list, name) {
                Some(i) => {
                    if let Some(old) = list.get_mut(i) {
                        *old = table;
                    }
                }
                None => list.push(table),
            }
        }
        ShaperEdit::DeleteScenario { name } => {
            let list = entries(&mut doc, "scenario")?;
            let i = position(list, name)
                .ok_or_else(|| EditError::NotFound(format!("no scenario named {name:?}")))?;
            list.remove(i);
        }
        ShaperEdit::AddFilter { at, fields } => {
            let table = table_of(fields)?;
            let list = entries(&mut doc, "filter")?;
            let mut all: Vec<Table> = list.iter().cloned().collect();
            let at = at.unwrap_or(all.len());
            if at > all.len() {
                return Err(EditError::NotFound(format!(
                    "there are {} filters; a new one goes at 0 to {}",
                    all.len(),
                    all.len()
                )));
            }
            all.insert(at, table);
            list.clear();
            for t in all {
                list.push(t);
            }
        }
        ShaperEdit::PutFilter { index, fields } => {
            let table = table_of(fields)?;
            let list = entries(&mut doc, "filter")?;
            let old = list
                .get_mut(*index)
                .ok_or_else(|| EditError::NotFound(format!("no filter {index}")))?;
            *old = table;
        }
        ShaperEdit::DeleteFilter { index } => {
            let list = entries(&mut doc, "filter")?;
            if *index >= list.len() {
                return Err(EditError::NotFound(format!("no filter {index}")));
            }
            list.remove(*index);
        }
    }
    // An emptied list leaves no `[[scenario]]` behind.
    for key in ["scenario", "filter"] {
        if doc
            .get(key)
            .and_then(Item::as_array_of_tables)
            .is_some_and(ArrayOfTables::is_empty)
        {
            doc.remove(key);
        }
    }
    Ok(doc.to_string())
}

/// The file's `[[key]]` entries (created empty when there are none).
fn entries<'a>(doc: &'a mut DocumentMut, key: &str) -> Result<&'a mut ArrayOfTables, EditError> {
    doc.entry(key)
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| EditError::File(format!("`{key}` is not a list of tables ([[{key}]])")))
}

/// The position of the scenario named `name`.
fn position(list: &ArrayOfTables, name: &str) -> Option<usize> {
    list.iter()
        .position(|t| t.get("name").and_then(Item::as_str) == Some(name))
}

/// A table holding `fields` (a JSON object whose values are strings, integers, booleans or
/// arrays of them), in TOML.
fn table_of(fields: &serde_json::Map<String, serde_json::Value>) -> Result<Table, EditError> {
    let text = toml::to_string(fields).map_err(|e| EditError::Fields(e.to_string()))?;
    let doc: DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| EditError::Fields(e.to_string()))?;
    let mut table = doc.as_table().clone();
    table.set_implicit(false);
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FILE: &str = r#"# The operator's comment stays.
[tunnel]
listen = "[::]:4500"

[shaper]
wan_rate = "100 Mbit/s"

[[scenario]]
name = "office"
max_rate = "80 Mbit/s"

[[filter]]
scenario = "office"
destination_port = [445]
"#;

    fn fields(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn scenarios_are_put_by_name_and_deleted() {
        let added = apply(
            FILE,
            &ShaperEdit::PutScenario {
                name: "backup".into(),
                fields: fields(json!({"mode": "aggregate", "max_rate": "5 Mbit/s", "priority": 7})),
            },
        )
        .unwrap();
        assert!(
            added.starts_with("# The operator's comment stays."),
            "{added}"
        );
        assert!(
            // The name first, the other fields in the order of their names.
            added.contains("[[scenario]]\nname = \"backup\"\nmax_rate = \"5 Mbit/s\"\nmode = \"aggregate\"\npriority = 7\n"),
            "{added}"
        );
        let replaced = apply(
            &added,
            &ShaperEdit::PutScenario {
                name: "office".into(),
                fields: fields(json!({"max_rate": "60 Mbit/s"})),
            },
        )
        .unwrap();
        assert!(
            replaced.contains("name = \"office\"\nmax_rate = \"60 Mbit/s\""),
            "{replaced}"
        );
        assert!(!replaced.contains("80 Mbit/s"));
        let deleted = apply(
            &replaced,
            &ShaperEdit::DeleteScenario {
                name: "backup".into(),
            },
        )
        .unwrap();
        assert!(!deleted.contains("backup"));
        assert_eq!(
            apply(
                FILE,
                &ShaperEdit::DeleteScenario {
                    name: "nothing".into()
                }
            ),
            Err(EditError::NotFound("no scenario named \"nothing\"".into()))
        );
    }

    #[test]
    fn filters_are_added_at_a_position_replaced_and_deleted() {
        let first = apply(
            FILE,
            &ShaperEdit::AddFilter {
                at: Some(0),
                fields: fields(json!({"scenario": "office", "source": ["10.1.0.0/16"], "destination_port": [80, "8000-8080"]})),
            },
        )
        .unwrap();
        let at = |text: &str, needle: &str| text.find(needle).unwrap();
        assert!(
            at(&first, "10.1.0.0/16") < at(&first, "destination_port = [445]"),
            "{first}"
        );
        assert!(
            first.contains("destination_port = [80, \"8000-8080\"]"),
            "{first}"
        );
        let replaced = apply(
            &first,
            &ShaperEdit::PutFilter {
                index: 1,
                fields: fields(json!({"scenario": "office", "dscp": [46]})),
            },
        )
        .unwrap();
        assert!(
            replaced.contains("dscp = [46]") && !replaced.contains("[445]"),
            "{replaced}"
        );
        let deleted = apply(&replaced, &ShaperEdit::DeleteFilter { index: 0 }).unwrap();
        assert!(!deleted.contains("10.1.0.0/16") && deleted.contains("dscp = [46]"));
        let none = apply(&deleted, &ShaperEdit::DeleteFilter { index: 0 }).unwrap();
        assert!(!none.contains("[[filter]]"), "an emptied list goes: {none}");
        assert!(matches!(
            apply(
                FILE,
                &ShaperEdit::PutFilter {
                    index: 3,
                    fields: fields(json!({}))
                }
            ),
            Err(EditError::NotFound(_))
        ));
        assert!(matches!(
            apply(
                FILE,
                &ShaperEdit::AddFilter {
                    at: Some(5),
                    fields: fields(json!({}))
                }
            ),
            Err(EditError::NotFound(_))
        ));
    }
}
