//! The AWS CLI's shared files, for `s3://` datasets: `object_store` reads credentials from
//! the environment, web identity, the container and the instance metadata service, but not
//! from the profile `aws configure` writes.
//!
//! Read: the profile `AWS_PROFILE` (else `default`) of `AWS_SHARED_CREDENTIALS_FILE` (else
//! `~/.aws/credentials`: `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`)
//! and of `AWS_CONFIG_FILE` (else `~/.aws/config`: `region`, `endpoint_url`), as the AWS CLI
//! reads them. Environment variables win over both files: the keys are used where the
//! environment names none (no `AWS_ACCESS_KEY_ID`, no web identity), the region and endpoint
//! where it names no region or endpoint.

use std::path::PathBuf;

/// What the profile gives.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Profile {
    /// `aws_access_key_id` and `aws_secret_access_key`, with `aws_session_token` if any.
    pub keys: Option<(String, String, Option<String>)>,
    /// `region`.
    pub region: Option<String>,
    /// `endpoint_url` (an S3-compatible server).
    pub endpoint: Option<String>,
}

/// The profile of this environment's AWS CLI files, where they are and hold it.
pub fn profile() -> Profile {
    let name = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var: &str, default: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    };
    let credentials = section(&file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), &name);
    // In `config`, a profile other than the default is `[profile NAME]`.
    let config_name = match name.as_str() {
        "default" => name.clone(),
        _ => format!("profile {name}"),
    };
    let config = section(&file("AWS_CONFIG_FILE", "config"), &config_name);
    let get = |pairs: &[(String, String)], key: &str| {
        pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    };
    let keys = match (
        get(&credentials, "aws_access_key_id"),
        get(&credentials, "aws_secret_access_key"),
    ) {
        (Some(id), Some(secret)) => Some((id, secret, get(&credentials, "aws_session_token"))),
        _ => None,
    };
    Profile {
        keys,
        region: get(&config, "region"),
        endpoint: get(&config, "endpoint_url"),
    }
}

/// The `key = value` pairs of section `[name]` of an INI text (keys lowercased; comments,
/// blank lines and empty values skipped).
pub fn section(text: &str, name: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut pairs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.trim() == name;
            continue;
        }
        if let (true, Some((k, v))) = (inside, line.split_once('=')) {
            let value = v.trim();
            if !value.is_empty() {
                pairs.push((k.trim().to_ascii_lowercase(), value.to_string()));
            }
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_gives_its_pairs_only() {
        let text = "# keys\n[default]\naws_access_key_id = A\nAWS_Secret_Access_Key=B\n\n\
                    [profile other]\nregion = eu-west-1\ns3 =\n  max_concurrent_requests = 4\n";
        assert_eq!(
            section(text, "default"),
            [
                ("aws_access_key_id".to_string(), "A".to_string()),
                ("aws_secret_access_key".to_string(), "B".to_string())
            ]
        );
        let other = section(text, "profile other");
        assert_eq!(other[0], ("region".to_string(), "eu-west-1".to_string()));
        assert!(section(text, "missing").is_empty());
    }
}
