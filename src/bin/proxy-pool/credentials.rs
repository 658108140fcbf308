//! `hash-credential`: the registry entry for a secret, or a new secret.

use proxy_pool::security::credentials::CredentialHash;

use crate::cli::CliResult;
use crate::cli::HashCredentialArgs;
use crate::output::say;

/// A fresh random secret, `pp_` + 64 hex characters.
pub fn new_secret() -> Result<String, Box<dyn std::error::Error>> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(format!("pp_{}", hex::encode(bytes)))
}

/// Prints the `sha256:` entry for the secret read from standard input (or a
/// new one, printed first); for Basic, of `user:password`.
pub fn hash(args: HashCredentialArgs) -> CliResult {
    let secret = if args.generate {
        let secret = new_secret()?;
        say!("secret: {secret}");
        secret
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        let secret = line.trim_end_matches(['\r', '\n']).to_owned();
        if secret.is_empty() {
            return Err("no secret on standard input".into());
        }
        secret
    };
    let material = match args.basic_user {
        Some(user) if user.contains(':') => {
            return Err("a Basic user name cannot contain ':'".into());
        }
        Some(user) => format!("{user}:{secret}"),
        None => secret,
    };
    say!("{}", CredentialHash::of(material.as_bytes()).encode());
    Ok(())
}
