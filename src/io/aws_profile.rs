//! The AWS CLI's shared files, for `s3://` datasets: `object_store` reads credentials from
//! the environment, web identity, the container and the instance metadata service, but not
//! from the profile `aws configure` writes.
//!
//! Read as the AWS CLI reads them: the profile `AWS_PROFILE` (else `AWS_DEFAULT_PROFILE`,
//! else `default`) of `AWS_SHARED_CREDENTIALS_FILE` (else `~/.aws/credentials`) and of
//! `AWS_CONFIG_FILE` (else `~/.aws/config`, where the profile is `[profile NAME]`, and the
//! default one `[default]` or `[profile default]`). The keys (`aws_access_key_id`,
//! `aws_secret_access_key`, `aws_session_token`) come from `credentials`, else from `config`;
//! `region` and `endpoint_url` from `config`. Environment variables win over both files: the
//! keys are used where the environment names none (no `AWS_ACCESS_KEY_ID`, no web identity),
//! the region and endpoint where it names no region or endpoint.

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
    /// The profile's name.
    pub name: String,
    /// Whether the environment named it (`AWS_PROFILE`, `AWS_DEFAULT_PROFILE`).
    pub named: bool,
    /// A setting through which the AWS CLI gets this profile's keys and hspack does not
    /// (`role_arn`, `credential_process`, `sso_session`, `sso_start_url`).
    pub indirect: Option<String>,
}

/// The settings of a profile whose keys come from elsewhere than the files.
const INDIRECT: &[&str] = &[
    "role_arn",
    "credential_process",
    "sso_session",
    "sso_start_url",
];

impl Profile {
    /// What to do when no credentials were found anywhere, for this profile.
    pub fn missing_keys_hint(&self) -> String {
        match (&self.indirect, self.named) {
            (Some(setting), _) => format!(
                "profile {0} gets its keys through `{setting}`, which hspack does not read: \
                 export them with `aws configure export-credentials --profile {0} --format env`",
                self.name
            ),
            (None, true) => format!(
                "profile {} (named by AWS_PROFILE or AWS_DEFAULT_PROFILE) has no \
                 aws_access_key_id and aws_secret_access_key in ~/.aws/credentials or \
                 ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE): check its name, \
                 or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                self.name
            ),
            (None, false) => "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or name a \
                 profile of ~/.aws/credentials with AWS_PROFILE"
                .into(),
        }
    }
}

/// The profile of this environment's AWS CLI files, where they are and hold it.
pub fn profile() -> Profile {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let named = var("AWS_PROFILE").or_else(|| var("AWS_DEFAULT_PROFILE"));
    let name = named.clone().unwrap_or_else(|| "default".into());
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let file = |var: &str, default: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    };
    Profile {
        named: named.is_some(),
        ..resolve(
            &name,
            &file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            &file("AWS_CONFIG_FILE", "config"),
        )
    }
}

/// Profile `name` of the texts of a `credentials` and a `config` file.
pub fn resolve(name: &str, credentials: &str, config: &str) -> Profile {
    let credentials = section(credentials, name);
    // In `config`, a profile is `[profile NAME]`; the default one may also be `[default]`.
    let mut settings = section(config, &format!("profile {name}"));
    if name == "default" {
        settings.extend(section(config, "default"));
    }
    let get = |pairs: &[(String, String)], key: &str| {
        pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    };
    let keys_of = |pairs: &[(String, String)]| match (
        get(pairs, "aws_access_key_id"),
        get(pairs, "aws_secret_access_key"),
    ) {
        (Some(id), Some(secret)) => Some((id, secret, get(pairs, "aws_session_token"))),
        _ => None,
    };
    let indirect = (INDIRECT.iter())
        .find(|k| get(&settings, k).or_else(|| get(&credentials, k)).is_some())
        .map(|k| k.to_string());
    Profile {
        keys: keys_of(&credentials).or_else(|| keys_of(&settings)),
        region: get(&settings, "region"),
        endpoint: get(&settings, "endpoint_url"),
        name: name.to_string(),
        named: false,
        indirect,
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

    fn keys(id: &str, secret: &str) -> Option<(String, String, Option<String>)> {
        Some((id.into(), secret.into(), None))
    }

    #[test]
    fn the_default_profile_is_read_from_either_config_header() {
        let config = "[profile default]\nregion = eu-west-1\n";
        assert_eq!(
            resolve("default", "", config).region.as_deref(),
            Some("eu-west-1")
        );
        let config = "[default]\nregion = us-east-2\nendpoint_url = http://s3.local\n";
        let p = resolve("default", "", config);
        assert_eq!(p.region.as_deref(), Some("us-east-2"));
        assert_eq!(p.endpoint.as_deref(), Some("http://s3.local"));
        // Another profile is only `[profile NAME]` in config.
        let config = "[other]\nregion = eu-west-1\n[profile other]\nregion = ap-south-1\n";
        assert_eq!(
            resolve("other", "", config).region.as_deref(),
            Some("ap-south-1")
        );
    }

    #[test]
    fn keys_come_from_credentials_else_from_config() {
        let config = "[profile lab]\naws_access_key_id = C\naws_secret_access_key = D\n";
        assert_eq!(resolve("lab", "", config).keys, keys("C", "D"));
        let credentials = "[lab]\naws_access_key_id = A\naws_secret_access_key = B\n";
        assert_eq!(resolve("lab", credentials, config).keys, keys("A", "B"));
        // Half a pair is no keys.
        assert_eq!(
            resolve("lab", "[lab]\naws_access_key_id = A\n", "").keys,
            None
        );
        let other = resolve("other", credentials, config);
        assert_eq!(
            (other.keys, other.region, other.endpoint),
            (None, None, None)
        );
    }

    #[test]
    fn the_hint_names_the_profile_and_why_its_keys_are_not_there() {
        let config = "[profile sso]\nsso_session = corp\nregion = eu-west-1\n";
        let hint = resolve("sso", "", config).missing_keys_hint();
        assert!(
            hint.contains("profile sso gets its keys through `sso_session`")
                && hint.contains("aws configure export-credentials --profile sso"),
            "{hint}"
        );
        let typo = Profile {
            named: true,
            ..resolve("lba", "[lab]\naws_access_key_id = A\n", "")
        };
        let hint = typo.missing_keys_hint();
        assert!(hint.contains("profile lba (named by AWS_PROFILE"), "{hint}");
        assert!(resolve("default", "", "")
            .missing_keys_hint()
            .contains("AWS_PROFILE"));
    }
}
