//! What the handlers' annotations cannot say, written into the assembled
//! OpenAPI document: the problem document's members and its `kind` as an
//! enum, a job's report and error as their types, the headers every
//! answer carries, the 405 and 415 every route can answer, and no token on
//! the probes. Each is what the service sends; the tests hold them to it.

use serde_json::{Map, Value, json};

/// Every `kind` a problem document carries (`problem.rs`).
pub(crate) const KINDS: [&str; 15] = [
    "invalid_input",
    "overflow",
    "transient",
    "schema_missing",
    "database",
    "not_found",
    "unauthorized",
    "forbidden",
    "rate_limited",
    "conflict",
    "too_large",
    "timeout",
    "overloaded",
    "internal",
    "cross_region",
];

/// The extension members problems carry: name, JSON type, meaning.
pub(crate) const MEMBERS: [(&str, &str, &str); 10] = [
    (
        "bound",
        "string",
        "The bound missed: `batch items`, `owner length`, `queued add items`, ...",
    ),
    ("max", "integer", "The bound's largest value"),
    ("min", "integer", "The bound's smallest value"),
    ("item", "integer", "Which item of a batch, from 0"),
    (
        "job",
        "string",
        "The running job's id (409 `conflict` of a second job)",
    ),
    ("href", "string", "The running job's address"),
    (
        "expected_wait_ms",
        "integer",
        "The wait the queue expected for the request",
    ),
    (
        "waited_ms",
        "integer",
        "How long the request had waited when refused",
    ),
    ("max_wait_ms", "integer", "`server.max_queue_wait_ms`"),
    (
        "estimated_items",
        "integer",
        "The items a body's length suggested, when judged before it was read",
    ),
];

/// The operations whose 200 says whether it replayed a first answer.
const KEYED: [&str; 3] = ["add", "addAndGet", "batchAdd"];

/// `document`, completed.
pub(super) fn complete(document: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let mut document = serde_json::to_value(&document).expect("a document serializes");
    problem_body(&mut document);
    job(&mut document);
    int64_strings(&mut document);
    for (path, item) in document["paths"].as_object_mut().expect("paths") {
        for (_, operation) in item.as_object_mut().expect("a path item") {
            answers(path, operation);
        }
    }
    serde_json::from_value(document).expect("still a document")
}

fn problem_body(document: &mut Value) {
    let schemas = &mut document["components"]["schemas"];
    let mut properties = json!({
        "type": {"type": "string", "description": "`urn:counter-service:problem:<slug>`"},
        "title": {"type": "string", "description": "A short summary of the problem type"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599, "description": "The HTTP status"},
        "detail": {"type": "string", "description": "What happened, for people"},
        "kind": {"$ref": "#/components/schemas/ProblemKind"},
    });
    for (name, kind, description) in MEMBERS {
        properties[name] = json!({"type": kind, "description": description});
    }
    schemas["ProblemBody"] = json!({
        "type": "object",
        "description": "RFC 9457 problem details; a client branches on `status` and `kind`",
        "required": ["type", "title", "status", "detail", "kind"],
        "properties": properties,
        "additionalProperties": true,
    });
    schemas["ProblemKind"] = json!({
        "type": "string",
        "description": "The error kind: the library's (`invalid_input`, `overflow`, `transient`, `schema_missing`, `database`) or the service's",
        "enum": KINDS,
    });
}

fn job(document: &mut Value) {
    let properties = &mut document["components"]["schemas"]["Job"]["properties"];
    properties["report"] = json!({
        "description": "What it did, once done: a check's `CheckReply` or a compaction's `CompactReply`",
        "oneOf": [
            {"$ref": "#/components/schemas/CheckReply"},
            {"$ref": "#/components/schemas/CompactReply"},
            {"type": "null"},
        ],
    });
    properties["error"] = json!({
        "description": "Why it failed: the problem a request would have answered",
        "oneOf": [{"$ref": "#/components/schemas/ProblemBody"}, {"type": "null"}],
    });
}

/// The suffix of a schema's copy with its integers as strings.
const AS_STRINGS: &str = "Int64String";

/// Beside each `application/json` answer the same as
/// `application/json; int64=string`, its schema's integers strings (copies
/// of the schemas it uses, named `<Schema>Int64String`): what a client
/// that asks for it (`api::int64`) is sent. A request's delta is a number
/// or a decimal string in either case (a second request media type would
/// break generators: openapi-python-client 0.29 writes code that does not
/// run for one).
fn int64_strings(document: &mut Value) {
    for schema in ["AddRequest", "BatchItem"] {
        let delta = &mut document["components"]["schemas"][schema]["properties"]["delta"];
        let description = delta["description"].clone();
        *delta = json!({
            "description": description,
            "oneOf": [
                {"type": "integer", "format": "int64"},
                {"type": "string", "pattern": "^-?[0-9]+$"},
            ],
        });
    }
    let components = document["components"]["schemas"].clone();
    let mut copies = Map::new();
    for (_, item) in document["paths"].as_object_mut().expect("paths") {
        for (_, operation) in item.as_object_mut().expect("a path item") {
            let responses = operation["responses"].as_object_mut().expect("responses");
            let contents = responses.values_mut().filter_map(|r| r.get_mut("content"));
            for content in contents {
                let Some(json) = content.get("application/json") else {
                    continue;
                };
                let mut schema = json["schema"].clone();
                as_strings(&mut schema, &components, &mut copies);
                content[super::int64::JSON_INT64_STRING] = json!({"schema": schema});
            }
        }
    }
    let schemas = document["components"]["schemas"]
        .as_object_mut()
        .expect("schemas");
    schemas.extend(copies);
}

/// `schema` with every integer a decimal string, its references to
/// components turned to their copies (made in `copies` as needed).
fn as_strings(schema: &mut Value, components: &Value, copies: &mut Map<String, Value>) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    if let Some(target) = object
        .get("$ref")
        .and_then(Value::as_str)
        .map(str::to_owned)
    {
        let name = target.rsplit('/').next().unwrap_or_default().to_owned();
        let copy = format!("{name}{AS_STRINGS}");
        if !copies.contains_key(&copy) {
            // Placed first: a schema that refers to itself ends here.
            copies.insert(copy.clone(), Value::Null);
            let mut original = components[&name].clone();
            as_strings(&mut original, components, copies);
            copies.insert(copy.clone(), original);
        }
        object.insert("$ref".into(), json!(format!("#/components/schemas/{copy}")));
        return;
    }
    let integer = |kind: &Value| kind == "integer";
    match object.get("type") {
        Some(kind) if integer(kind) => {
            object.insert("type".into(), json!("string"));
            object.insert("pattern".into(), json!("^-?[0-9]+$"));
            for bound in ["format", "minimum", "maximum"] {
                object.remove(bound);
            }
        }
        Some(Value::Array(kinds)) if kinds.iter().any(integer) => {
            let kinds: Vec<Value> = kinds
                .iter()
                .map(|k| {
                    if integer(k) {
                        json!("string")
                    } else {
                        k.clone()
                    }
                })
                .collect();
            object.insert("type".into(), Value::Array(kinds));
            object.insert("pattern".into(), json!("^-?[0-9]+$"));
            for bound in ["format", "minimum", "maximum"] {
                object.remove(bound);
            }
        }
        _ => {}
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(inner) = object.get_mut(key) {
            as_strings(inner, components, copies);
        }
    }
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        properties
            .values_mut()
            .for_each(|p| as_strings(p, components, copies));
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(Value::Array(parts)) = object.get_mut(key) {
            parts
                .iter_mut()
                .for_each(|p| as_strings(p, components, copies));
        }
    }
}

fn header(kind: &str, description: &str) -> Value {
    json!({"schema": {"type": kind}, "description": description})
}

fn problem(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/ProblemBody"}}},
    })
}

/// The answers of `operation` at `path`: their headers, 405 and 415, and
/// no token on the probes.
fn answers(path: &str, operation: &mut Value) {
    let api = path.starts_with("/v1/");
    if !api {
        operation["security"] = json!([]);
    }
    let id = operation["operationId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let takes_body = operation.get("requestBody").is_some();
    let responses = operation["responses"].as_object_mut().expect("responses");
    if api {
        responses
            .entry("405")
            .or_insert_with(|| problem("A method this path does not take"));
        if takes_body {
            responses
                .entry("415")
                .or_insert_with(|| problem("A body that is not `application/json`"));
        }
    }
    for (status, response) in responses.iter_mut() {
        let headers = response
            .as_object_mut()
            .expect("a response")
            .entry("headers")
            .or_insert_with(|| Value::Object(Map::new()));
        headers["X-Request-Id"] = header(
            "string",
            "The request's id (the client's, or a new UUID), in every log line of it",
        );
        match status.as_str() {
            "429" | "503" => {
                headers["Retry-After"] = header("integer", "Seconds to wait before a retry");
            }
            "202" => {
                headers["Location"] = header(
                    "string",
                    "The job's address: follow it until `state` is `done` or `failed`",
                );
            }
            "200" if KEYED.contains(&id.as_str()) => {
                headers["Idempotent-Replayed"] = json!({
                    "schema": {"type": "string", "enum": ["true"]},
                    "description": "Present when the answer is the first answer to this `Idempotency-Key`, replayed",
                });
            }
            _ => {}
        }
    }
    if id == "top" || id == "topWatch" {
        for parameter in operation["parameters"].as_array_mut().into_iter().flatten() {
            if parameter["name"] == "limit" {
                let schema = &mut parameter["schema"];
                schema["minimum"] = json!(1);
                schema["maximum"] = json!(1_000);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KINDS, MEMBERS};
    use serde_json::Value;

    fn document() -> Value {
        serde_json::to_value(super::super::openapi_document()).unwrap()
    }

    /// Every extension member a problem is given somewhere in the service
    /// (`.with("name", ...)`) is declared.
    #[test]
    fn every_problem_member_sent_is_declared() {
        let mut sent = std::collections::BTreeSet::new();
        let mut dirs = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src"
        ))];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("document.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for part in text.split(".with(\"").skip(1) {
                        sent.insert(part.split('"').next().unwrap().to_owned());
                    }
                }
            }
        }
        assert!(sent.contains("bound") && sent.contains("item"), "{sent:?}");
        let declared = document()["components"]["schemas"]["ProblemBody"]["properties"].clone();
        for name in &sent {
            assert!(
                declared.get(name).is_some(),
                "`{name}` is sent but not declared"
            );
            assert!(MEMBERS.iter().any(|(m, _, _)| m == name));
        }
        let kinds = &document()["components"]["schemas"]["ProblemKind"]["enum"];
        assert_eq!(kinds.as_array().unwrap().len(), KINDS.len());
        for problem in crate::problem::samples()
            .into_iter()
            .chain([crate::problem::Problem::internal("x")])
        {
            let sent = problem.document()["kind"].clone();
            assert!(
                KINDS.iter().any(|k| sent == *k),
                "{problem:?}: its kind is not in the enum"
            );
        }
    }

    /// Headers, 405 and 415, the probes' security, the top limit, the job
    /// report: declared as sent.
    #[test]
    fn answers_are_declared_as_sent() {
        let document = document();
        let paths = document["paths"].as_object().unwrap();
        for (path, item) in paths {
            for (method, operation) in item.as_object().unwrap() {
                let what = format!("{method} {path}");
                let responses = operation["responses"].as_object().unwrap();
                for (status, response) in responses {
                    assert!(
                        response["headers"].get("X-Request-Id").is_some(),
                        "{what} {status}"
                    );
                    if status == "429" || status == "503" {
                        assert!(
                            response["headers"].get("Retry-After").is_some(),
                            "{what} {status}"
                        );
                    }
                    if status == "202" {
                        assert!(response["headers"].get("Location").is_some(), "{what}");
                    }
                }
                if path.starts_with("/v1/") {
                    assert!(responses.contains_key("405"), "{what}");
                    assert_eq!(
                        responses.contains_key("415"),
                        operation.get("requestBody").is_some(),
                        "{what}"
                    );
                    assert!(
                        operation.get("security").is_none(),
                        "{what}: the global bearer"
                    );
                } else {
                    assert_eq!(
                        operation["security"],
                        serde_json::json!([]),
                        "{what}: no token"
                    );
                }
            }
        }
        for path in [
            "/v1/{ns}/counters:add",
            "/v1/{ns}/counters:addAndGet",
            "/v1/{ns}/counters:batchAdd",
        ] {
            let ok = &paths[path]["post"]["responses"]["200"];
            assert!(ok["headers"].get("Idempotent-Replayed").is_some(), "{path}");
        }
        let limit = paths["/v1/{ns}/top"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "limit")
            .unwrap()
            .clone();
        assert_eq!(
            (
                limit["schema"]["minimum"].as_u64(),
                limit["schema"]["maximum"].as_u64()
            ),
            (Some(1), Some(1_000))
        );
        let schemas = &document["components"]["schemas"];
        let report = schemas["Job"]["properties"]["report"]["oneOf"]
            .as_array()
            .unwrap()
            .clone();
        for part in report.iter().filter_map(|p| p["$ref"].as_str()) {
            let name = part.rsplit('/').next().unwrap();
            assert!(
                schemas.get(name).is_some(),
                "{name} is referenced but not in components"
            );
        }
        assert_eq!(report.len(), 3);
    }

    /// Beside every JSON body its copy with integers as strings: none left
    /// in the copies, and every copy referred to exists.
    #[test]
    fn every_json_body_has_its_int64_string_twin() {
        let document = document();
        let text = document.to_string();
        let schemas = document["components"]["schemas"].as_object().unwrap();
        let mut twins = 0;
        for (path, item) in document["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                for (status, response) in operation["responses"].as_object().unwrap() {
                    let content = &response["content"];
                    if content.get("application/json").is_some() {
                        assert!(
                            content.get("application/json; int64=string").is_some(),
                            "{method} {path} {status}"
                        );
                        twins += 1;
                    }
                }
            }
        }
        assert!(twins > 15, "{twins}");
        let reply = &schemas["BatchGetReplyInt64String"];
        assert_eq!(
            reply["properties"]["counts"]["additionalProperties"]["additionalProperties"]["type"],
            "string",
            "{reply}"
        );
        for (name, schema) in schemas.iter().filter(|(n, _)| n.ends_with("Int64String")) {
            assert!(
                !schema.to_string().contains("\"integer\""),
                "{name}: {schema}"
            );
        }
        for reference in text.split("#/components/schemas/").skip(1) {
            let name = reference.split('"').next().unwrap();
            assert!(
                schemas.contains_key(name),
                "{name} referred to, not defined"
            );
        }
        let delta = &schemas["AddRequest"]["properties"]["delta"]["oneOf"];
        assert_eq!(
            (delta[0]["type"].as_str(), delta[1]["type"].as_str()),
            (Some("integer"), Some("string"))
        );
    }
}
