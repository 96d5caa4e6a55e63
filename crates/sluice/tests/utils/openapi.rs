//! `docs/openapi.yaml` as a checker: the JSON schema of each documented answer, and a record
//! of which documented operations a test has called.

use std::collections::BTreeSet;
use std::sync::Mutex;

use serde_json::Value;

/// The OpenAPI document, and the operations called so far.
pub struct OpenApi {
    doc: Value,
    called: Mutex<BTreeSet<(String, String)>>,
}

impl OpenApi {
    /// Reads `docs/openapi.yaml` of this repository.
    pub fn load() -> OpenApi {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.yaml");
        let text = std::fs::read_to_string(path).expect("docs/openapi.yaml");
        let doc: Value = serde_norway::from_str(&text).expect("docs/openapi.yaml parses as YAML");
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..2]), Some("3."), "not OpenAPI 3");
        OpenApi { doc, called: Mutex::new(BTreeSet::new()) }
    }

    /// Every `(METHOD, path template)` the document describes.
    pub fn operations(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if method != "parameters" {
                    out.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    /// The documented operations no call has checked yet.
    pub fn not_called(&self) -> BTreeSet<(String, String)> {
        let called = self.called.lock().unwrap();
        self.operations().difference(&called).cloned().collect()
    }

    /// Follows a local `$ref` (`#/components/...`).
    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let pointer = r.strip_prefix('#').expect("a local $ref");
                self.resolve(self.doc.pointer(pointer).unwrap_or_else(|| panic!("$ref {r}")))
            }
            None => v,
        }
    }

    /// The documented answer of `METHOD template` with `status`: its media type and, for
    /// JSON, a validator of its schema. Panics when the document has no such answer.
    fn answer(&self, method: &str, template: &str, status: u16) -> (String, Option<Value>) {
        let op = &self.doc["paths"][template][method.to_lowercase()];
        assert!(op.is_object(), "docs/openapi.yaml has no {method} {template}");
        let resp = op["responses"].get(status.to_string()).unwrap_or_else(|| {
            panic!("docs/openapi.yaml documents no {status} answer for {method} {template}")
        });
        let content = self.resolve(resp)["content"].as_object().expect("content").clone();
        let (media, body) = content.into_iter().next().expect("a media type");
        let schema = (media == "application/json").then(|| body["schema"].clone());
        (media, schema)
    }

    /// A JSON schema document for `schema` (which may `$ref` the component schemas).
    fn schema_doc(&self, schema: &Value) -> Value {
        let text = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$defs": self.doc["components"]["schemas"],
            "allOf": [schema],
        })
        .to_string()
        .replace("#/components/schemas/", "#/$defs/");
        serde_json::from_str(&text).expect("still JSON")
    }

    /// Validates an answer to `METHOD template` against the document: its status is
    /// documented, its media type matches, and a JSON body validates against the schema.
    /// Records the operation as called.
    pub fn check(
        &self,
        method: &str,
        template: &str,
        status: u16,
        content_type: Option<&str>,
        body: &[u8],
    ) {
        let (media, schema) = self.answer(method, template, status);
        let ct = content_type.unwrap_or("");
        assert!(
            ct.starts_with(&media),
            "{method} {template} {status}: content type {ct:?}, documented {media:?}"
        );
        if let Some(schema) = schema {
            let value: Value = serde_json::from_slice(body).unwrap_or_else(|e| {
                panic!("{method} {template}: not JSON ({e}): {}", String::from_utf8_lossy(body))
            });
            let validator =
                jsonschema::validator_for(&self.schema_doc(&schema)).expect("a valid schema");
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| format!("{} at {}", e, e.instance_path()))
                .collect();
            assert!(
                errors.is_empty(),
                "{method} {template} {status}: the answer does not match docs/openapi.yaml: \
                 {errors:?}\n{value:#}"
            );
        }
        self.called.lock().unwrap().insert((method.to_uppercase(), template.to_owned()));
    }

    /// Validates `value` against the component schema `name` (for answers printed by
    /// `sluice admin --json`).
    pub fn check_schema(&self, name: &str, value: &Value) {
        let schema = serde_json::json!({ "$ref": format!("#/components/schemas/{name}") });
        let validator = jsonschema::validator_for(&self.schema_doc(&schema)).expect("schema");
        let errors: Vec<String> = validator.iter_errors(value).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "not a {name}: {errors:?}\n{value:#}");
    }
}
