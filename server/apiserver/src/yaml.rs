//! YAML request bodies (`application/yaml`, and server-side apply's
//! `application/apply-patch+yaml`), read into JSON values.
//!
//! kubectl sends JSON even under YAML content types, and JSON is YAML, so JSON is tried
//! first (exact integers, no YAML surprises like `on` → true); only a body that is not JSON
//! goes through the YAML parser. serde_yaml_ng is the maintained fork of serde_yaml and
//! bounds recursion and alias expansion, so a hostile document cannot blow up memory.

use serde_json::Value;
use skerry_api::ApiError;

/// A request body as JSON, from JSON or YAML.
pub fn to_json(body: &[u8]) -> Result<Value, ApiError> {
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        return Ok(value);
    }
    let value: Value = serde_yaml_ng::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_json_and_yaml() {
        assert_eq!(to_json(br#"{"a":1}"#).expect("json")["a"], 1);
        let v = to_json(b"apiVersion: v1\nkind: ConfigMap\ndata:\n  k: v\n").expect("yaml");
        assert_eq!(v["data"]["k"], "v");
        assert_eq!(to_json(b"a: [").map_err(|e| e.code), Err(400));
    }
}
